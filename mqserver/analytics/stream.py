"""The ``mqserver-journal`` Spark data source: the journal as a stream (or a batch).

``spark.readStream.format("mqserver-journal").load(DIR)`` tails the sealed
segments of a journal directory with ``{node: last seq}`` offsets, like
Kafka's ``{partition: offset}``: a micro-batch reads each node's records
after the previous batch's seq up to its own, so restarts from a checkpoint
read every record exactly once.  ``spark.read.format(...)`` reads them all.
The planning lives in ``mqserver.analytics.tail`` (no Spark there); these
classes only adapt it to PySpark's Python Data Source API (pyspark >= 4.2,
pyarrow on every worker).  Register once per session with ``register``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from mqserver.analytics.tail import (
    Offsets,
    SegmentIndex,
    advance,
    plan,
    read_segment,
    scan,
    starting_offsets,
)
from mqserver.journal.schema import SPARK_DDL

NAME = "mqserver-journal"


def _directory(options: Any) -> str:
    path = options.get("path")
    if not path:
        raise ValueError(f"{NAME}: give the journal directory: .load(DIR)")
    return str(path)


def _read(partition: InputPartition) -> Iterator[tuple[Any, ...]]:
    path, after, upto = partition.value
    return read_segment(path, after, upto)


class JournalDataSource(DataSource):
    """``format("mqserver-journal")``; options ``maxRecordsPerTrigger``, ``startingOffsets``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return JournalReader(_directory(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return JournalStreamReader(_directory(self.options), self.options)


class JournalReader(DataSourceReader):
    """Batch: every record of every sealed segment, one Spark task per segment."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def partitions(self) -> Sequence[InputPartition]:
        return [
            InputPartition((segment.path, 0, None))
            for segments in scan(self.directory).values()
            for segment in segments
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return _read(partition)


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over sealed segments; one Spark task per segment and seq range.

    The driver-side methods run in one long-lived Python process per query,
    so the index's cached record counts last across triggers.
    """

    def __init__(self, directory: str, options: Any) -> None:
        self.index = SegmentIndex(directory)
        self.max_records = int(options.get("maxRecordsPerTrigger") or 0)
        if self.max_records < 0:
            raise ValueError(f"{NAME}: maxRecordsPerTrigger must be 0 (no limit) or more")
        self.starting = options.get("startingOffsets") or "earliest"
        self.target: Offsets | None = None

    def initialOffset(self) -> Offsets:
        return starting_offsets(self.starting, self.index)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # records sealed after this are for the next run, as Spark requires
        self.target = self.index.latest()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return advance(start, self.index.latest(), self.target, max_rows)

    def reportLatestOffset(self) -> Offsets:
        return self.index.latest()

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        return [InputPartition(task) for task in plan(scan(self.index.directory), start, end)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return _read(partition)


def register(spark: Any) -> None:
    """Make ``format("mqserver-journal")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(JournalDataSource)
