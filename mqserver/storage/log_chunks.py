# -*- test-case-name: tests.unit.test_log_chunks -*-
"""Chunks of a log replay decoded when they are needed, not before the broker serves.

A crash restart of the log store walks every record (``log_recovery``) and
then decodes each live message into a chunk: for a million messages the
decoding was half the replay (1.9 of 3.7 s of CPU on the build machine),
all of it before the server listened.  A ``ReplayChunk`` stands for a
chunk's worth of one queue's live messages by their seqs and their places
in the segments the replay read, so the broker counts and orders them at
once.  It is a ``pending_chunk.PendingChunk``, as a snapshot's ``LazyChunk``: made
whole by ``check``, which the broker's service runs in a thread once it
listens (``packed.check_thd``) and a queue runs before it reads the chunk
(``PackedReady``); the first read of a content attribute then
fills the chunk's own slots, and from then on it is an ordinary ``Chunk``.

Only chunks without TTLs wait: the broker's expiry heap needs every expiry
time at the load, so a chunk holding one is decoded at once (one flag byte
a message tells).  The segments' bytes stay in memory until every chunk of
the replay is decoded, a few seconds after the start.  A message that does
not decode (its record passed its CRC: only a bug or an edit makes one)
makes its chunk one ``check`` reports, which the broker withholds and
logs; its records stay in the log.
"""

from __future__ import annotations

import struct
import threading
from bisect import bisect_left
from collections.abc import Collection
from typing import Any

from mqserver.packed import Chunk
from mqserver.storage import log_records as records
from mqserver.storage.log_segment import Data
from mqserver.storage.log_seq_index import SeqIndex
from mqserver.storage.pending_chunk import PendingChunk

_MASK = 0xFFFFFFFF  # a location's offset, or its frame size (``log_index.loc``)
_FLAGS_AT = 28  # the flags byte in ``records.MESSAGE_HEAD``
_HAS_EXPIRES = 1
DECODE_ERRORS = (records.FormatError, struct.error, ValueError, UnicodeDecodeError)
_FRAME = records.FRAME_SIZE


def head_at(data: bytes, location: int) -> tuple[int, int]:
    """(where the message head of the record at ``location`` starts in its
    segment's ``data``, where the record ends)."""
    start = ((location >> 32) & _MASK) + _FRAME
    return start + (1 if data[start] == records.K_ENQUEUE else 9), \
        start - _FRAME + (location & _MASK)


def message_fields(segments: dict[int, Data], location: int) -> tuple[Any, ...]:
    """The fields of the ENQUEUE or REQUEUE record at ``location`` (``Message``'s order)."""
    data = segments[location >> 64]
    return records.message_fields(data, *head_at(data, location))


_ENQUEUE_FLAGS = _FRAME + 1 + _FLAGS_AT  # from a frame's start: an ENQUEUE's flags byte
_REQUEUE_FLAGS = _FRAME + 9 + _FLAGS_AT  # a REQUEUE's (its old seq first)
_EXPIRES_BIT = bytes(value & _HAS_EXPIRES for value in range(256))  # for bytes.translate


def expiring_seqs(segments: dict[int, Data], by_seq: SeqIndex,
                  plain: range = range(0)) -> list[int]:
    """The seqs of a queue's live messages with a TTL, in order (each flags byte
    read but those of ``plain``, seqs known to have none).

    Every live message of a replay goes through here.  An archived run
    (``log_seq_index``) is frames of one size one after the other in one
    segment: when they are all of one kind, their flags bytes are one
    strided slice of the segment, looked at in C, nearly always none set.
    Any other entry is read on its own.  A restart from a checkpoint knows
    the seqs between its ``LogIndex.ttl_seq`` and its next seq to be
    ``plain``: on mapped segments, a strided slice faults in every page
    (19 ms for a million messages).
    """
    found: list[int] = []
    holes = by_seq.holes
    for start, count, segment, place in by_seq.runs():
        if not count or (start in plain and start + count - 1 in plain):
            continue
        data = segments[segment]
        offset, size = place >> 32, place & _MASK
        end = offset + count * size
        kinds = data[offset + _FRAME:end:size]
        at = (_ENQUEUE_FLAGS if kinds.count(records.K_ENQUEUE) == count
              else _REQUEUE_FLAGS if kinds.count(records.K_REQUEUE) == count else 0)
        if at:
            flags = data[offset + at:end:size]
            if b"\x01" in flags.translate(_EXPIRES_BIT):
                found += (start + n for n, value in enumerate(flags)
                          if value & _HAS_EXPIRES and start + n not in holes)
        else:
            base = (segment << 64) | place
            found += (seq for seq in range(start, start + count)
                      if seq not in holes and _expires(data, base + (seq - start) * (size << 32)))
    found += (seq for seq, location in by_seq.items()
              if seq not in plain and _expires(segments[location >> 64], location))
    found.sort()
    return found


def _expires(data: bytes, location: int) -> bool:
    start = (location >> 32) & _MASK
    return bool(data[start + (_ENQUEUE_FLAGS if data[start + _FRAME] == records.K_ENQUEUE
                              else _REQUEUE_FLAGS)] & _HAS_EXPIRES)


def any_within(seqs: list[int], first: int, last: int) -> bool:
    """Whether sorted ``seqs`` hold one from ``first`` to ``last``."""
    at = bisect_left(seqs, first)
    return at < len(seqs) and seqs[at] <= last


class ReplayChunk(PendingChunk):
    """A chunk whose messages are still in the replayed segments (module docstring)."""

    __slots__ = ("_decoded", "_locations", "_lock", "_segments")

    origin = "log replay"

    def __init__(self, queue: bytes, segments: dict[int, Data], locations: Collection[int],
                 first: int, last: int, lock: threading.Lock) -> None:
        super().__init__(queue, len(locations), first, last)
        self._segments, self._locations = segments, locations
        self._lock = lock  # one for the replay's chunks: a check changes the state under it
        self._decoded: Chunk | None = None  # the messages, until the slots take them

    def check(self) -> str | None:
        """None once the messages are decoded (kept until the first read), else why
        they do not.  Thread-safe: the broker's service calls it in a thread."""
        if self._sound is None:
            with self._lock:
                if self._sound is None:
                    segments, locations = self._segments, self._locations
                    try:
                        rows = [message_fields(segments, location) for location in locations]
                        self._decoded = Chunk.of_columns(*zip(*rows, strict=True))
                        self._sound = True
                    except DECODE_ERRORS as e:
                        self._problem = f"a message does not decode ({e})"
                        self._sound = False
                    self._segments = self._locations = None  # type: ignore[assignment]
        return None if self._sound else self._problem

    def _where(self) -> str:
        return "the log"

    def _columns(self) -> Chunk:
        problem = self.check()
        if problem is not None:
            raise records.FormatError(f"{self.describe()}: {problem}")
        decoded, self._decoded = self._decoded, None
        assert decoded is not None
        return decoded


__all__ = ["DECODE_ERRORS", "ReplayChunk", "any_within", "expiring_seqs", "head_at",
           "message_fields"]
