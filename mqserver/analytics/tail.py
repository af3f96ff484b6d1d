"""Tailing sealed journal segments by ``{node: last seq}``: pure Python, no Spark.

The ``mqserver-journal`` Spark data source (``mqserver.analytics.stream``) is
a thin shell over these functions, so the planning (which segments, which seq
range, how far a trigger may go) and the line parsing are tested without a
JVM.  An offset maps each node to the last seq already read; a node missing
from it has had nothing read (seqs start at 1).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mqserver.journal.schema import DATE_DIR, FIELDS, SEALED_SUFFIX, parse_segment_name

log = logging.getLogger(__name__)

Offsets = dict[str, int]
"""``{node: last seq read}``, JSON as it is in Spark's checkpoint."""


@dataclass(frozen=True, order=True)
class Segment:
    """A sealed segment file; sorting a node's segments sorts them by seq."""

    node: str
    first_seq: int
    path: str


def scan(directory: str) -> dict[str, list[Segment]]:
    """Sealed segments under ``directory/date=*/``, per node, in seq order.

    ``*.jsonl.open`` (still being written) and anything that is not a segment
    are ignored; a missing directory is an empty journal.
    """
    nodes: dict[str, list[Segment]] = {}
    try:
        dates = os.listdir(directory)
    except FileNotFoundError:
        return nodes
    for date_dir in dates:
        folder = os.path.join(directory, date_dir)
        if not date_dir.startswith(DATE_DIR) or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            parsed = parse_segment_name(name)
            if parsed is None or not name.endswith(SEALED_SUFFIX):
                continue
            node, first_seq = parsed
            nodes.setdefault(node, []).append(Segment(node, first_seq, os.path.join(folder, name)))
    for segments in nodes.values():
        segments.sort()
    return nodes


class SegmentIndex:
    """The journal's newest seq per node, remembering it for each newest segment.

    Only a node's newest sealed segment is read, from its end: older ones
    end where the next one starts.  Sealed segments never change, so the
    answer is kept while the segment stays the newest.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._last: dict[str, int] = {}

    def latest(self) -> Offsets:
        """``{node: seq of the last well-formed record in its newest sealed segment}``."""
        kept: dict[str, int] = {}
        offsets: Offsets = {}
        for node, segments in scan(self.directory).items():
            newest = segments[-1]
            last = self._last.get(newest.path)
            if last is None:
                last = last_seq(newest)
            kept[newest.path] = offsets[node] = last
        self._last = kept
        return offsets


def advance(
    start: Offsets,
    available: Offsets,
    target: Offsets | None = None,
    max_records: int | None = None,
) -> Offsets:
    """The end offset of the next micro-batch.

    Never goes back (a node keeps its start if its segments were deleted),
    never past ``target`` (the journal's end when a ``trigger(availableNow=True)``
    query started), and moves at most ``max_records`` seqs in all, shared
    fairly (max-min) between the nodes that have something new.
    """
    end = dict(start)
    pending: dict[str, int] = {}
    for node, last in available.items():
        done = start.get(node, 0)
        if target is not None:
            last = min(last, max(target.get(node, 0), done))
        if last > done:
            pending[node] = last - done
    budget = max_records
    ordered = sorted(pending.items(), key=lambda item: (item[1], item[0]))
    for i, (node, count) in enumerate(ordered):
        if budget is not None:
            count = min(count, budget // (len(ordered) - i))
            budget -= count
        if count:
            end[node] = start.get(node, 0) + count
    return end


Task = tuple[str, int, int]
"""``(segment path, after seq, up to seq)``: one Spark task's share of a micro-batch."""


def plan(nodes: dict[str, list[Segment]], start: Offsets, end: Offsets) -> list[Task]:
    """``(path, after, upto)`` for each segment holding seqs in ``(start, end]``.

    A node's segments are contiguous in seq, so a segment ends where the next
    one begins: only names are needed.  The reader keeps ``after < seq <=
    upto``, so a record is never read by two micro-batches, and a segment
    sealed after ``end`` was taken waits for the next one.
    """
    tasks: list[Task] = []
    for node, segments in sorted(nodes.items()):
        after, upto = start.get(node, 0), end.get(node, 0)
        if upto <= after:
            continue
        for i, segment in enumerate(segments):
            last = segments[i + 1].first_seq - 1 if i + 1 < len(segments) else None
            if segment.first_seq <= upto and (last is None or last > after):
                tasks.append((segment.path, after, upto))
    return tasks


def starting_offsets(option: str, index: SegmentIndex) -> Offsets:
    """The ``startingOffsets`` option: ``earliest``, ``latest`` or a JSON ``{node: seq}``."""
    if option == "earliest":
        return {}
    if option == "latest":
        return index.latest()
    parsed = json.loads(option)
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in parsed.items()
    ):
        raise ValueError(f"startingOffsets must be earliest, latest or {{node: seq}}: {option!r}")
    return parsed


def _integer(bits: int) -> Callable[[Any], int]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(value: Any) -> int:
        if type(value) is not int or not low <= value <= high:
            raise ValueError(value)
        return value

    return convert


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def _timestamp(value: Any) -> datetime:
    """ISO-8601 as the journal writes it; a zone-less time is UTC, like the batch loader's."""
    parsed = datetime.fromisoformat(_string(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(value)
    return value


def _binary(value: Any) -> bytes:
    return base64.b64decode(_string(value), validate=True)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "INT": _integer(32),
    "BIGINT": _integer(64),
    "STRING": _string,
    "TIMESTAMP": _timestamp,
    "MAP<STRING,STRING>": _string_map,
    "BINARY": _binary,
}
_COLUMNS = tuple((name, _CONVERTERS[kind]) for name, kind, _ in FIELDS)
_SEQ = [name for name, _ in _COLUMNS].index("seq")
_REQUIRED = ("seq", "event", "ts")


def parse_line(line: bytes) -> tuple[Any, ...] | None:
    """One journal line as a row in ``SPARK_DDL`` column order, or None when malformed.

    Malformed: not JSON, not an object, no ``seq``/``event``/``ts``, or a value
    of the wrong type (a row Spark could not convert would fail the query).
    """
    try:
        record = json.loads(line)
        if not isinstance(record, dict) or any(record.get(k) is None for k in _REQUIRED):
            return None
        return tuple(
            None if (value := record.get(name)) is None else convert(value)
            for name, convert in _COLUMNS
        )
    except (ValueError, binascii.Error):  # UnicodeDecodeError and JSONDecodeError included
        return None


def last_seq(segment: Segment, chunk: int = 1 << 16) -> int:
    """Seq of the last well-formed record of a segment (``first_seq - 1`` if it has none).

    Reads backwards from the end, so a 64 MiB segment costs one small read.
    Taken from the records rather than a line count: a garbage line then
    cannot move the offset past a record that was never read.
    """
    with open(segment.path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        partial = b""
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            lines = (f.read(step) + partial).split(b"\n")
            partial = lines.pop(0) if pos > 0 else b""
            for line in reversed(lines):
                row = parse_line(line)
                if row is not None:
                    return int(row[_SEQ])
            chunk *= 2  # one long line (a big body) costs a few reads, not many
    return segment.first_seq - 1


def read_segment(path: str, after: int = 0, upto: int | None = None) -> Iterator[tuple[Any, ...]]:
    """Rows of ``path`` with ``after < seq <= upto``; malformed lines are skipped and logged.

    Runs in Spark's Python workers: the count goes to the executor's log,
    never into an exception (garbage in one line must not stop a stream).
    """
    malformed = 0
    with open(path, "rb") as f:
        for line in f:
            row = parse_line(line)
            if row is None:
                malformed += 1
                continue
            seq = row[_SEQ]
            if seq > after and (upto is None or seq <= upto):
                yield row
    if malformed:
        log.warning("mqserver-journal: %d malformed lines skipped in %s", malformed, path)
