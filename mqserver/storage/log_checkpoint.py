# -*- test-case-name: tests.unit.test_log_checkpoint -*-
"""The log's checkpoint: its recovery state at a durable position, so a crash
restart walks only the records after it.

A clean stop writes the clean-shutdown snapshot (``log_snapshot``); after a
``kill -9`` the store replays its segments, about a microsecond a record (a
million ready messages are a million records and their commits).  While
the server runs, the store therefore writes ``<log dir>/checkpoint`` now and
then: the segments, the next seq and the whole ``LogIndex`` (each queue's
``SeqIndex`` as its runs, holes and dict entries; declares, bindings and
records by location) as they stand after every record up to a position
(segment, offset).

**Why the position is durable and the index exactly the index there.**  The
index moves when a batch is *encoded*, on the reactor thread, before the
store thread writes it.  The capture (``capture``) is taken on the reactor
thread right after a batch was handed to the store thread: the index then
stands for every batch encoded so far, and the position is where the last of
them ends, the store's own count of the active segment's size.  The write
(``write_thd``) is queued on the store thread behind those batches, which
runs jobs in order: when it runs, every one of them was written, the active
segment's size on disk must equal the position (else a write went wrong and
no checkpoint is written), and it fsyncs the segment (older ones were fsynced
when they were sealed) before it writes the checkpoint atomically (temporary
file, fsync, rename, fsync of the directory).  So a checkpoint never names a
position past what is on disk.

**Recovery** (``log_checkpoint_recovery``) loads it, walks the records after
its position (``log_recovery.walk_thd``) and builds exactly what a full
replay would; anything doubtful (a segment missing or changed, a torn tail
before the position, a checksum) replays the whole log instead.  Compaction
and rolls need nothing here: a capture is taken between batches, and
compaction's copies and deletes are checked and re-pointed by the walk.

**Cost.**  ``capture`` copies the index on the reactor thread (the runs'
arrays, and each queue's dict entries, in C; at most ``CAPTURE_DICT_ENTRIES``
of those, so under a millisecond); ``encode`` and the file writes run in the
store thread.  The store writes one after ``every_bytes`` written since the
last, ``every_seconds`` after a write otherwise, at every start and once an
index at rest is archived (``Checkpointer``; ``--log-checkpoint``,
docs/operations.md).
"""

from __future__ import annotations

import operator
import os
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.storage import snapshot
from mqserver.storage.log_index import LogIndex
from mqserver.storage.log_segment import SegmentFiles
from mqserver.storage.log_seq_index import HOLES
from mqserver.storage.log_snapshot import (
    read_live,
    read_records,
    read_runs,
    write_live,
    write_records,
    write_runs,
)
from mqserver.storage.snapshot_sections import SectionReader, SectionWriter, SnapshotError
from mqserver.storage.worker import StoreThread

log = Logger()

FILENAME = "checkpoint"
MAGIC = b"MQLOGCKP"
VERSION = 2  # 2: ``LogIndex.ttl_seq`` (version 1 was never released)
_HEADER = struct.Struct("<8sHHQI")  # magic, version, flags, payload length, crc32(payload)
_BIG_ENDIAN = 1
_FLAGS = _BIG_ENDIAN if sys.byteorder == "big" else 0
_PLACE = (1 << 64) - 1


class CheckpointError(Exception):
    """The checkpoint cannot stand for the log: replay all of it."""


def parse(value: str) -> tuple[int, float]:
    """``--log-checkpoint``: ``MIB:SECONDS`` or ``off`` -> (bytes, seconds); 0: never."""
    if value == "off":
        return 0, 0.0
    mib, sep, seconds = value.partition(":")
    try:
        every_bytes, every_seconds = int(mib) * 1024 * 1024, float(seconds) if sep else 0.0
    except ValueError:
        every_bytes = every_seconds = -1
    if every_bytes < 0 or every_seconds < 0 or not sep:
        raise ValueError(f"--log-checkpoint must be MIB:SECONDS or off, not {value!r}")
    return every_bytes, every_seconds


@dataclass
class Capture:
    """The index and where it stands, copied on the reactor thread (``capture``)."""

    segment: int
    offset: int
    next_seq: int
    ttl_seq: int
    segments: list[tuple[int, int]]  # (number, size), oldest first
    live: dict[int, int]
    queues: list[tuple[Any, ...]]  # name, last, the runs' 4 arrays, holes, dict keys, values
    declares: dict[bytes, int]
    bindings: dict[bytes, dict[bytes, int]]
    records: dict[bytes, dict[bytes, int]]


def capture(index: LogIndex, segments: dict[int, int], active: int, next_seq: int) -> Capture:
    """What a checkpoint holds, at the end of the last batch encoded into ``active``."""
    queues = []
    for name, by_seq in index.messages.items():
        first = by_seq.first
        queues.append((name, by_seq.last, by_seq.starts[first:], by_seq.counts[first:],
                       by_seq.segments[first:], by_seq.places[first:], list(by_seq.holes),
                       array("q", by_seq), list(by_seq.values())))
    return Capture(active, segments[active], next_seq, index.ttl_seq, list(segments.items()),
                   dict(index.live), queues, dict(index.declares),
                   {name: dict(events) for name, events in index.bindings.items()},
                   {name: dict(keys) for name, keys in index.records.items()})


def encode(point: Capture) -> bytes:
    """The checkpoint file: header, then one checksummed payload (store thread)."""
    out = SectionWriter()
    for value in (point.segment, point.offset, point.next_seq, point.ttl_seq):
        out.u64(value)
    out.u32(len(point.segments))
    for number, size in point.segments:
        out.u64(number)
        out.u64(size)
    write_live(out, point.live)
    out.u32(len(point.queues))
    for name, last, starts, counts, in_segments, places, holes, seqs, locations in point.queues:
        write_runs(out, name, last, starts, counts, in_segments, places)
        for column in (array("q", holes), seqs,
                       array("Q", map(operator.rshift, locations, repeat(64))),
                       array("Q", map(operator.and_, locations, repeat(_PLACE)))):
            out.array(column)
    write_records(out, point.declares, point.bindings, point.records)
    payload = b"".join(out.parts)
    return _HEADER.pack(MAGIC, VERSION, _FLAGS, len(payload), zlib.crc32(payload)) + payload


@dataclass
class Checkpoint:
    """A checkpoint read back (``decode``)."""

    segment: int
    offset: int
    next_seq: int
    segments: list[tuple[int, int]]
    index: LogIndex


def decode(data: bytes) -> Checkpoint:
    """The file's contents back; ``CheckpointError`` if anything does not check."""
    if len(data) < _HEADER.size:
        raise CheckpointError(f"{len(data)} bytes, shorter than its header")
    magic, version, flags, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CheckpointError(f"not a version {VERSION} log checkpoint")
    payload = data[_HEADER.size:]
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise CheckpointError("its length or checksum does not match")
    try:
        return _decode(SectionReader(payload, (flags & _BIG_ENDIAN) != (_FLAGS & _BIG_ENDIAN)))
    except (SnapshotError, OverflowError, ValueError) as e:
        raise CheckpointError(str(e)) from e


def _decode(section: SectionReader) -> Checkpoint:
    segment, offset, next_seq, ttl_seq = (section.u64(), section.u64(), section.u64(),
                                          section.u64())
    segments = [(section.u64(), section.u64()) for _ in range(section.count())]
    index = LogIndex()
    index.ttl_seq = ttl_seq
    read_live(section, index)
    for _ in range(section.count()):
        name, by_seq = read_runs(section)
        index.messages[name] = by_seq
        by_seq.holes = set(section.array("q"))
        by_seq.hole_limit = max(HOLES, len(by_seq.holes))
        seqs = section.array("q")
        in_segments, places = section.array("Q", len(seqs)), section.array("Q", len(seqs))
        by_seq.update(zip(seqs, map(operator.or_, map(operator.lshift, in_segments, repeat(64)),
                                    places), strict=True))
    read_records(section, index)
    section.end()
    if not segments or segments[-1] != (segment, offset):
        raise CheckpointError("its position is not the end of its last segment")
    return Checkpoint(segment, offset, next_seq, segments, index)


def write_thd(files: SegmentFiles, path: Path, point: Capture) -> tuple[bool, str]:
    """Write ``point`` once the log up to its position is on disk (store thread);
    (written, a line to log)."""
    started = time.perf_counter()
    size = files.active_size_thd()
    if files.active != point.segment or size != point.offset:
        return False, (f"log checkpoint not written: the log is at segment {files.active} "
                       f"offset {size}, the index at segment {point.segment} offset "
                       f"{point.offset}")
    files.fsync_thd()
    data = encode(point)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    snapshot.fsync_directory(path.parent)
    return True, (f"log checkpoint written at segment {point.segment} offset {point.offset}: "
                  f"{len(data)} bytes in {time.perf_counter() - started:.3f} s")


CAPTURE_DICT_ENTRIES = 16_384
"""The most queue dict entries (``SeqIndex``) a checkpoint copies; with more it
waits.  Each capture of a filling queue's dict (up to ``ARCHIVE_AT``, 262,144)
and its encoding in the store thread, while the broker packs the backlog,
left 12-15 MB more RSS at rest for 1M messages; a wait is short: a filling
queue's dict is archived every 262,144 messages (then a due checkpoint is
taken at the next batch), and a backlog at rest is archived within seconds
(``rested``).  The runs cost next to nothing to copy."""


class Checkpointer:
    """When the log store writes its checkpoint (reactor thread): after
    ``every_bytes`` written since the last one (``wrote``, for every batch and
    compaction copy), or ``every_seconds`` after anything was written (or walked
    by the last recovery) otherwise; one at a time.

    Bytes bound the worst case, the records a crash restart walks; seconds
    make a quiet broker's next crash restart cheap.  A backlog at rest is
    the third occasion (``rested``): a burst then quiet is how most
    backlogs form, and a crash is likelier in the quiet than within the
    burst.  Not the burst's end itself: a checkpoint then copies up to
    ``ARCHIVE_AT`` dict entries a queue, and its temporaries, made in the
    store thread while the broker packs the backlog, left 13-15 MB more
    RSS at rest for 1M messages (docs/performance.md).  ``state`` gives the
    capture, or None while the store must not write one (a failed write or
    compaction, a close) or it would copy more than ``CAPTURE_DICT_ENTRIES``
    dict entries: a due one is then asked for again at every batch, tick
    and rest.

    Compaction deleting a segment at or after the standing checkpoint's
    position (``dropped``) writes a new one at once: the records after the
    position that went with it may have been tombstones, and a walk that
    cannot see them cannot use the checkpoint (``log_checkpoint_recovery``
    replays the whole log then).
    """

    def __init__(self, thread: StoreThread, files: SegmentFiles, path: Path, clock: Any,
                 state: Callable[[], Capture | None], every: str) -> None:
        self._thread, self._files, self.path, self._state = thread, files, path, state
        self.every_bytes, self.every_seconds = parse(every)
        self.unchecked = 0  # bytes a crash restart would walk that no checkpoint covers
        self.written = 0  # checkpoints written (tests, stats)
        self.standing: int | None = None  # the segment of the one on disk; 0: not known
        self._pending: Deferred[bool] | None = None
        self._ticker = LoopingCall(self._tick)
        self._ticker.clock = clock

    @property
    def enabled(self) -> bool:
        return bool(self.every_bytes or self.every_seconds)

    def start(self, unchecked: int, standing: int) -> None:
        """The store is open; a crash now would walk ``unchecked`` bytes: all of the
        log after a start from the clean-shutdown snapshot, what the recovery
        walked otherwise.  If any, a checkpoint is written at once: a crash soon
        after a start (before the first tick, or a second crash in a row) then
        walks only what came since.  The index a start holds is cheap to
        capture: a snapshot's is archived, a replay's at most ``ARCHIVE_AT``
        dict entries a queue."""
        self.unchecked, self.standing = unchecked, standing
        if self.every_seconds:
            self._ticker.start(self.every_seconds, now=False)
        if unchecked and self.enabled:
            self.now()

    def stop(self) -> None:
        if self._ticker.running:
            self._ticker.stop()

    def wrote(self, size: int) -> None:
        self.unchecked += size
        # not while one is being written: each batch until it is would queue
        # one more behind it; the first batch after it asks again
        if self.every_bytes and self.unchecked >= self.every_bytes and self._pending is None:
            self.now()

    def dropped(self, segment: int) -> None:
        """Compaction deleted ``segment``."""
        if self.enabled and self.standing is not None \
                and segment >= self.standing:
            self.now()

    def _tick(self) -> None:
        if self.unchecked and self._pending is None:
            self.now()

    def rested(self) -> None:
        """The index of every queue at rest is archived (``log_rest``): a checkpoint
        now holds runs alone, a fraction of one written with those queues' dict
        entries, and a crash restart decodes it in well under a millisecond
        rather than tens; its capture makes no temporaries to speak of."""
        if self.enabled and self._pending is None:
            self.now()

    def now(self) -> Deferred[bool]:
        """Capture the index now and write it once the log is on disk up to it; fires
        with whether it was written.  One in flight is waited for first."""
        if self._pending is not None:
            d: Deferred[bool] = Deferred()

            def again(result: Any) -> Any:
                self.now().chainDeferred(d)
                return result

            self._pending.addBoth(again)
            return d
        try:
            point = self._state()
        except Exception:
            log.failure("log checkpoint not captured")
            return succeed(False)
        if point is None:
            return succeed(False)
        self.unchecked = 0
        d = self._pending = self._thread.run(write_thd, self._files, self.path, point)
        return d.addCallbacks(self._done, self._failed, callbackArgs=(point.segment,))

    def _done(self, result: tuple[bool, str], segment: int) -> bool:
        self._pending = None
        written, text = result
        if not written:
            log.warn("{text}", text=text)
        elif not self.written:
            # the first one says the store writes them; the rest, every few
            # seconds while anything is written, are counted in /metrics
            log.info("{text} (the next ones are counted in /metrics: "
                     "mqserver_store_checkpoints_total)", text=text)
        if written:
            self.written += 1
            self.standing = segment
        return written

    def _failed(self, failure: Any) -> bool:
        self._pending = None
        self.unchecked = max(self.unchecked, 1)  # the next tick tries again
        log.error("log checkpoint not written ({e}); the last one stands",
                  e=failure.getErrorMessage())
        return False
