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
from typing import Any

from mqserver.packed import Chunk
from mqserver.storage import log_records as records
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


def message_fields(segments: dict[int, bytes], location: int) -> tuple[Any, ...]:
    """The fields of the ENQUEUE or REQUEUE record at ``location`` (``Message``'s order)."""
    data = segments[location >> 64]
    return records.message_fields(data, *head_at(data, location))


_ENQUEUE_FLAGS = _FRAME + 1 + _FLAGS_AT  # from a frame's start: an ENQUEUE's flags byte
_REQUEUE_FLAGS = _FRAME + 9 + _FLAGS_AT  # a REQUEUE's (its old seq first)


def any_expiry(segments: dict[int, bytes], locations: list[int]) -> bool:
    """Whether a message at one of ``locations`` has a TTL (its flags byte alone read).

    Every live message of a replay goes through here: ``head_at`` inline, the
    segment looked up only when it changes (half the time of a call a message).
    """
    number, data, enqueue = -1, b"", records.K_ENQUEUE
    for location in locations:
        if location >> 64 != number:
            number = location >> 64
            data = segments[number]
        start = (location >> 32) & _MASK
        if data[start + (_ENQUEUE_FLAGS if data[start + _FRAME] == enqueue
                         else _REQUEUE_FLAGS)] & _HAS_EXPIRES:
            return True
    return False


class ReplayChunk(PendingChunk):
    """A chunk whose messages are still in the replayed segments (module docstring)."""

    __slots__ = ("_decoded", "_locations", "_lock", "_segments")

    origin = "log replay"

    def __init__(self, queue: bytes, segments: dict[int, bytes], locations: list[int],
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


__all__ = ["DECODE_ERRORS", "ReplayChunk", "any_expiry", "head_at", "message_fields"]
