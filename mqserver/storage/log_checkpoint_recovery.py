# -*- test-case-name: tests.unit.test_log_checkpoint -*-
"""Recovery from the log's checkpoint (``log_checkpoint``): load it, walk the
records after its position, and build what a full replay would.

**Anything doubtful replays the whole log** (``recover_thd`` returns None and
says why): the checkpoint is a shortcut, never a source of truth.  It is not
used when its checksum or format does not check, a segment it lists is
missing (other than heads compaction deleted since), a sealed segment's size
changed, the position's segment is shorter than the position (a torn or
truncated tail before it), a segment after it is missing, a DECLARE or PUT
the index points at is not there, or the walk leaves the index pointing into
a deleted segment (compaction deleted a head whose live records the tail
does not re-point).

**Compaction and rolls.**  A roll starts a new segment: the position may be
in any segment, and every segment after it is walked whole.  Compaction
copies a head's live records to the tail and then deletes the head; if the
head went after the checkpoint, every copy is after the position, and the
walk re-points the index to it (a BIND's live record is its newest, as a
DECLARE's: ``LogIndex.bind``), so the deleted heads' live bytes come to
zero.  A full replay never sees those heads; the walk from the checkpoint
gives the same index, live bytes included.

**Options and records** are not in the checkpoint: once the walk is done,
each is read back from the DECLARE or PUT record the index points at, as a
full replay would have kept it.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

from mqserver.model import DECLARE, PUT, Recovered
from mqserver.storage import log_records as records
from mqserver.storage.log_checkpoint import Checkpoint, CheckpointError, decode
from mqserver.storage.log_recovery import RecoveryResult, Replay, finish, walk_thd
from mqserver.storage.log_segment import Data, SegmentFiles


def recover_thd(files: SegmentFiles, path: Path,
                notes: list[tuple[str, str]]) -> RecoveryResult | None:
    """The recovery from the checkpoint at ``path`` and the records after it; None
    (with the reason in ``notes``) if there is none or it is doubtful: replay all."""
    if not path.exists():
        return None
    started = time.perf_counter()
    try:
        point = decode(path.read_bytes())
        gone, tail = _check_segments(files, point)
        replay = Replay()
        replay.index, replay.next_seq = point.index, point.next_seq
        # what came after it is walked, and what it knows has no TTL is not read
        replay.plain = range(point.index.ttl_seq + 1, point.next_seq)
        result = RecoveryResult(Recovered(), replay.index, {}, replay.next_seq)
        # the position's segment, from the position; or, once compaction deleted
        # it, every segment left, all of them after it
        start = records.HEADER_SIZE if point.segment in gone else point.offset
        kept = walk_thd(files, replay, result, tail, start)
        if point.segment not in gone and point.segment not in kept:
            raise CheckpointError(f"segment {point.segment}, where it stands, is unreadable")
        index = replay.index
        for number in gone:
            if index.live.pop(number, 0):
                raise CheckpointError(f"segment {number}, deleted by compaction, still holds "
                                      "live records after the walk")
        sizes = dict(point.segments)
        for number, live in index.live.items():
            if number not in kept and number not in gone:
                if number not in sizes:
                    raise CheckpointError(f"its index points into segment {number}, "
                                          "which it does not list")
                if live > 0:  # the messages and records there, decoded from it
                    kept[number] = files.map_thd(number)  # sealed: before the position
        _reread(replay, kept)
    except (CheckpointError, OSError) as e:
        notes.append(("warn", f"log checkpoint {path} not used ({e}); replaying the whole log"))
        return None
    result.segments = dict(sorted({**{n: s for n, s in point.segments if n not in gone},
                                   **result.segments}.items()))
    result.checkpoint = (point.segment, point.offset)
    result.notes[:0] = [*notes, ("info", (
        f"log checkpoint {path} used: from segment {point.segment} offset {point.offset}, "
        f"{replay.walked} records ({result.walked} bytes) walked after it"))]
    return finish(files, replay, result, kept, started)


def _check_segments(files: SegmentFiles, point: Checkpoint) -> tuple[set[int], list[int]]:
    """(the segments it lists that compaction deleted since, the segments to walk),
    if the segments are as the checkpoint left them but for what came after
    its position; ``CheckpointError`` otherwise.

    Compaction deletes only the oldest segment, once nothing in it is live:
    the segments left are consecutive, and those it lists below the first of
    them are gone, the position's own too when everything in it died or was
    copied after it (then every segment left is walked whole).  Their live
    records' copies are all after the position; a tombstone there only
    cancelled records in a segment as old, which the walk's check of live
    bytes in deleted segments catches (``recover_thd``).
    """
    numbers = files.segments_thd()
    if not numbers:
        raise CheckpointError("no segments left")
    first = numbers[0]
    if numbers != list(range(first, first + len(numbers))):
        raise CheckpointError("a segment is missing (a gap in the numbers)")
    listed = dict(point.segments)
    gone = {number for number in listed if number < first}
    if first > point.segment:
        return gone, numbers
    for number, size in listed.items():
        if number in gone:
            continue
        if number > numbers[-1]:
            raise CheckpointError(f"segment {number} it lists is missing")
        found = os.stat(files.path(number)).st_size
        if number == point.segment and found < size:
            raise CheckpointError(f"segment {number} is {found} bytes, shorter than its "
                                  f"position (offset {size})")
        if number != point.segment and found != size:
            raise CheckpointError(f"sealed segment {number} is {found} bytes, not {size}")
    unlisted = [number for number in numbers if number < point.segment and number not in listed]
    if unlisted:
        raise CheckpointError(f"segment(s) {unlisted} it does not list")
    return gone, [number for number in numbers if number >= point.segment]


def _reread(replay: Replay, kept: dict[int, Data]) -> None:
    """Each queue's options and each record, from the DECLARE and PUT records the
    index points at: what a full replay keeps as it goes."""
    index = replay.index
    replay.options = {queue: _record_at(kept, location, DECLARE, queue)[2]
                      for queue, location in index.declares.items()}
    replay.records = {namespace: {key: _record_at(kept, location, PUT, namespace, key)[3]
                                  for key, location in keys.items()}
                      for namespace, keys in index.records.items()}


def _record_at(kept: dict[int, Data], location: int, kind: str,
               *key: bytes) -> tuple[Any, ...]:
    data = kept.get(location >> 64)
    offset, size = (location >> 32) & 0xFFFFFFFF, location & 0xFFFFFFFF
    frames = [] if data is None else list(records.iter_frames(data, offset, offset + size))
    if len(frames) != 1 or frames[0][2] is None or frames[0][1] != size:
        raise CheckpointError(f"no record of {size} bytes at segment {location >> 64} "
                              f"offset {offset}")
    try:
        op = records.decode(frames[0][2])
    except (records.FormatError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"the record at segment {location >> 64} offset {offset} "
                              f"does not decode ({e})") from e
    if op[0] != kind or tuple(op[1:1 + len(key)]) != key:
        raise CheckpointError(f"the record at segment {location >> 64} offset {offset} is "
                              f"not the {kind} of {key!r}")
    return op
