"""Reading the journal into a DataFrame, counting (not failing on) malformed lines."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mqserver.journal.schema import SEALED_SUFFIX, SPARK_DDL

CORRUPT = "_corrupt_record"


@dataclass
class Journal:
    """The parsed records plus what could not be parsed."""

    events: Any  # DataFrame with the schema's columns
    malformed: int
    raw: Any = None  # the persisted scan behind ``events``; ``unpersist()`` when done


def parse_time(text: str) -> datetime:
    """``--since``/``--until``: ISO date or date-time, taken as UTC."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


def load(
    spark: Any, directory: str, since: datetime | None = None, until: datetime | None = None
) -> Journal:
    """Sealed segments under ``directory`` (``date=.../*.jsonl``), filtered to [since, until).

    PERMISSIVE mode with a corrupt-record column (not DROPMALFORMED) so that
    torn or garbled lines are counted; a torn line would otherwise vanish or
    become a row of nulls.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as fn

    raw = (
        spark.read.schema(f"{SPARK_DDL}, `{CORRUPT}` STRING")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("pathGlobFilter", "*" + SEALED_SUFFIX)
        .option("recursiveFileLookup", "false")
        .json(directory)
    )
    if since is not None:
        raw = raw.where(fn.col("date") >= fn.lit(since.date()))
    if until is not None:
        raw = raw.where(fn.col("date") <= fn.lit(until.date()))
    # Spark refuses queries that read only the corrupt-record column of a raw
    # JSON scan; persisting once serves both the count and every report
    raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
    bad = fn.col(CORRUPT).isNotNull() | fn.col("event").isNull() | fn.col("ts").isNull()
    malformed = raw.where(bad).count()
    events = raw.where(~bad).drop(CORRUPT)
    if since is not None:
        events = events.where(fn.col("ts") >= fn.lit(since))
    if until is not None:
        events = events.where(fn.col("ts") < fn.lit(until))
    return Journal(events, malformed, raw)
