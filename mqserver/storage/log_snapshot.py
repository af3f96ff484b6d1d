# -*- test-case-name: tests.unit.test_log_snapshot -*-
"""The log's own section of the clean-shutdown snapshot: its segments as the clean
close left them, its next seq, and its index.

**When the snapshot stands for the log.**  Only if the segment files are
exactly those the clean close left: the same numbers, sizes and mtimes.
Every open starts a new segment, compaction only adds segments and deletes
the oldest, and recovery truncates a torn tail: any write after the close,
by this release or an older one, or a crash's repair, changes them.  The
store's first act after it read the snapshot is to start that new segment
(fsynced, with its directory), so from then on a crash replays.

**Why the index.**  The state alone would let the broker start, but the
store must still know where the live copy of every message, declare,
binding and record sits, and how many live bytes each segment holds
(compaction and its garbage ratio, ``log_index``).  Replaying the log to
rebuild it would cost most of what the snapshot saves, so it is kept here:
each queue's ``SeqIndex`` as its runs (``log_seq_index``: four arrays, split
at their holes), the few other locations as numbers.

**Its format.**  The section starts with ``FORMAT``; one written by a
release that kept the index in another form (before ``FORMAT``, the
section started with its number of segments) is refused, and the store
replays its log, as for a stale snapshot.
"""

from __future__ import annotations

import os
import time
from array import array
from pathlib import Path

from mqserver.model import Recovered
from mqserver.storage import snapshot
from mqserver.storage.log_index import LogIndex, SeqIndex
from mqserver.storage.log_recovery import RecoveryResult
from mqserver.storage.log_segment import SegmentFiles
from mqserver.storage.snapshot import SectionReader, SectionWriter, SnapshotError

Segments = list[tuple[int, int, int]]
"""(number, size, mtime in ns) of every segment, oldest first."""

_MASK = (1 << 64) - 1

FORMAT = 0x4C4F4732
"""The section's first u32 (b"2GOL" little-endian): the index as runs.  An older
section starts with its number of segments, far below it."""


def segments_thd(files: SegmentFiles) -> Segments:
    found = []
    for number in files.segments_thd():
        stat = os.stat(files.path(number))
        found.append((number, stat.st_size, stat.st_mtime_ns))
    return found


def encode(segments: Segments, next_seq: int, index: LogIndex) -> bytes:
    """The section; archives every queue's ``SeqIndex`` (the store is closing)."""
    out = SectionWriter()
    out.u32(FORMAT)
    out.u32(len(segments))
    for number, size, mtime in segments:
        out.u64(number)
        out.u64(size)
        out.u64(mtime)
    out.u64(next_seq)
    write_live(out, index.live)
    out.u32(len(index.messages))
    for queue, by_seq in index.messages.items():
        by_seq.archive()
        if by_seq.holes:
            by_seq.mend()
        first = by_seq.first
        write_runs(out, queue, by_seq.last, by_seq.starts[first:], by_seq.counts[first:],
                   by_seq.segments[first:], by_seq.places[first:])
    write_records(out, index.declares, index.bindings, index.records)
    return b"".join(out.parts)


# What the log's checkpoint (``log_checkpoint``) writes the same way.

def write_live(out: SectionWriter, live: dict[int, int]) -> None:
    """Each segment's live bytes (compaction's garbage ratio)."""
    out.u32(len(live))
    for segment, count in live.items():
        out.u64(segment)
        out.i64(count)


def read_live(section: SectionReader, index: LogIndex) -> None:
    for _ in range(section.count()):
        segment = section.u64()
        index.live[segment] = section.i64()
    index.live_total = sum(index.live.values())


def write_runs(out: SectionWriter, queue: bytes, last: int, *runs: array) -> None:
    """A queue's name, last archived seq and runs (``SeqIndex``'s four arrays)."""
    out.blob(queue)
    out.i64(last)
    for column in runs:
        out.array(column)


def read_runs(section: SectionReader) -> tuple[bytes, SeqIndex]:
    queue = section.some_blob()
    by_seq = SeqIndex()
    by_seq.last = section.i64()
    by_seq.starts = section.array("q")
    runs = len(by_seq.starts)
    by_seq.counts = section.array("I", runs)
    by_seq.segments = section.array("I", runs)
    by_seq.places = section.array("Q", runs)
    if runs and by_seq.starts[-1] + by_seq.counts[-1] - 1 > by_seq.last:
        raise SnapshotError(f"queue {queue!r}: its index runs past its last seq")
    return queue, by_seq


def write_records(out: SectionWriter, declares: dict[bytes, int],
                  bindings: dict[bytes, dict[bytes, int]],
                  records: dict[bytes, dict[bytes, int]]) -> None:
    """Where the live DECLARE, BIND and PUT records are."""
    write_locations(out, declares)
    for nested in (bindings, records):
        out.u32(len(nested))
        for name, locations in nested.items():
            out.blob(name)
            write_locations(out, locations)


def read_records(section: SectionReader, index: LogIndex) -> None:
    index.declares = read_locations(section)
    index.bindings = {section.some_blob(): read_locations(section)
                      for _ in range(section.count())}
    index.records = {section.some_blob(): read_locations(section)
                     for _ in range(section.count())}


def write_locations(out: SectionWriter, locations: dict[bytes, int]) -> None:
    out.u32(len(locations))
    for key, location in locations.items():
        out.blob(key)
        out.u64(location >> 64)
        out.u64(location & _MASK)


def decode(section: SectionReader, now: Segments) -> tuple[LogIndex, dict[int, int], int]:
    """(index, segment sizes, next seq) from the section, if ``now`` (the segments as
    they are) is what it recorded; ``SnapshotError`` otherwise."""
    found = section.u32()
    if found != FORMAT:
        raise SnapshotError(f"the log's section is in another format ({found:#x}; this "
                            f"mqserver reads {FORMAT:#x})")
    then = [(section.u64(), section.u64(), section.u64()) for _ in range(section.count())]
    if then != now:
        raise SnapshotError("stale: the log's segments changed since")
    next_seq = section.u64()
    index = LogIndex()
    index.ttl_seq = next_seq  # the section does not say which have a TTL: any may
    read_live(section, index)
    for _ in range(section.count()):
        queue, index.messages[queue] = read_runs(section)
    read_records(section, index)
    section.end()
    return index, {number: size for number, size, _ in now}, next_seq


def read_locations(section: SectionReader) -> dict[bytes, int]:
    locations = {}
    for _ in range(section.count()):
        key = section.some_blob()
        locations[key] = (section.u64() << 64) | section.u64()
    return locations




def save_thd(files: SegmentFiles, path: Path, state: Recovered, next_seq: int,
             index: LogIndex) -> tuple[bool, str]:
    """Write the snapshot of a clean close, the active segment fsynced first (the
    store thread, with the directory still locked); (saved, a line to log)."""
    started = time.perf_counter()
    try:
        files.fsync_thd()
        size = snapshot.write(path, state, snapshot.new_token(),
                              encode(segments_thd(files), next_seq, index))
    except Exception as e:  # the next open replays; the stop goes on
        return False, f"clean-shutdown snapshot {path} not written ({e})"
    return True, (f"clean-shutdown snapshot {path} written: {snapshot.message_count(state)} "
                  f"messages, {size} bytes, in {time.perf_counter() - started:.3f} s")


def recover_thd(files: SegmentFiles, path: Path,
                notes: list[tuple[str, str]]) -> RecoveryResult | None:
    """The recovery the snapshot at ``path`` stands for, if the segments are as it
    recorded them; None (with the reason in ``notes``): replay the log."""
    if not path.exists():
        return None
    started = time.perf_counter()

    def unchanged(section: SectionReader) -> tuple[LogIndex, dict[int, int], int]:
        return decode(section, segments_thd(files))

    try:
        saved = snapshot.read(path, accept=unchanged)
    except (SnapshotError, OSError) as e:
        notes.append(("warn", f"clean-shutdown snapshot {path} not used ({e}); "
                                    "replaying the log"))
        return None
    index, segments, next_seq = saved.extra
    recovered = saved.recovered
    return RecoveryResult(recovered, index, segments, next_seq, [*notes, (
        "info", f"clean-shutdown snapshot {path} used: {len(recovered.queues)} queues, "
                f"{snapshot.message_count(recovered)} messages read in "
                f"{time.perf_counter() - started:.3f} s (no replay)")])


__all__ = ["Segments", "decode", "encode", "read_locations", "recover_thd", "save_thd",
           "segments_thd", "write_locations"]
