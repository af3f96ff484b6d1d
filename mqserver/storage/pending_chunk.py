# -*- test-case-name: tests.unit.test_snapshot_chunks,tests.unit.test_log_chunks -*-
"""A chunk the broker counts and orders before its columns are at hand.

Three starts hand the broker such chunks: a clean-shutdown snapshot's
(``snapshot_chunks.LazyChunk``: the columns are still in the file), a log
replay's (``log_chunks.ReplayChunk``: still in the replayed segments) and a
SQLite replay's (``sqlite_chunks.SQLiteChunk``: still rows of the database,
read in the store's thread).  Each
knows its count and seqs, so the broker serves at once, and is made whole
by ``check``, which the broker's service runs in a thread once it listens
(``packed.check_thd``) and a queue runs before it reads the chunk
(``PackedReady``).  The first read of a content attribute then fills
the ``Chunk``'s own slots, and from then on it is an ordinary chunk.  What
differs between the two, where the columns come from, is ``check`` and
``_columns``.

Only chunks without TTLs wait: the broker's expiry heap needs every expiry
time at the load, so the stores make a chunk holding one whole at once.
"""

from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from typing import Any

from mqserver.packed import Chunk

# the slots the first read fills (the padding slots are no content)
CONTENT = frozenset(name for name in Chunk.__slots__ if not name.startswith("_pad"))


class PendingChunk(Chunk, metaclass=ABCMeta):
    """A chunk whose columns come later (module docstring)."""

    __slots__ = ("_count", "_first", "_last", "_problem", "_queue", "_share", "_sound")

    #: what recovered the chunk, first in ``describe`` (the broker's log line)
    origin = "recovered"

    def __init__(self, queue: bytes, count: int, first: int, last: int) -> None:
        self._queue = queue
        self._count, self._first, self._last = count, first, last
        self._sound: bool | None = None  # None: not checked yet
        self._problem = ""
        self._share: tuple[bytes, dict[bytes, bytes], dict[str, str]] | None = None

    @property
    def count(self) -> int:
        return self._count

    @property
    def first_expiry(self) -> float:
        return math.inf  # a chunk with TTLs is made whole at the start

    def expiry_values(self) -> list[float]:
        return []

    def share(self, queue: bytes, names: dict[bytes, bytes], sources: dict[str, str]) -> None:
        """Kept for the first read: sharing needs the columns."""
        self._share = (queue, names, sources)

    @property
    def unchecked(self) -> bool:
        """Not known to be sound: not checked yet, or damaged (``PackedReady.settle``)."""
        return self._sound is not True

    @property
    def seq_range(self) -> tuple[int, int]:
        """The first and last seq of its messages, as the start knew them."""
        return self._first, self._last

    @abstractmethod
    def check(self) -> str | None:
        """None once the columns can be had, else why not (thread-safe)."""

    def describe(self) -> str:
        """Which messages and whence: for the broker's log line about a chunk it withholds."""
        return (f"{self.origin}: {self._count} messages of queue {self._queue!r} (seqs "
                f"{self._first} to {self._last}) in {self._where()}")

    @abstractmethod
    def _where(self) -> str:
        """Where the columns are, for ``describe``."""

    @abstractmethod
    def _columns(self) -> Chunk:
        """The checked columns as an ordinary ``Chunk`` (on the reactor thread, once)."""

    def __getattr__(self, name: str) -> Any:
        # only reached while a content slot is unset: fill them all, then it is set
        if name not in CONTENT:
            raise AttributeError(name)
        chunk = self._columns()
        for slot in CONTENT:
            setattr(self, slot, getattr(chunk, slot))
        if self._share is not None:
            Chunk.share(self, *self._share)
            self._share = None
        return object.__getattribute__(self, name)


__all__ = ["CONTENT", "PendingChunk"]
