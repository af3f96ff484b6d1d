# -*- test-case-name: tests.unit.test_sqlite_chunks -*-
"""A SQLite replay's big backlogs, read a chunk at a time once the broker serves.

A restart after a crash used to read every message row before the broker
listened: 1.4 s for a million 100-byte messages, nearly all of it sqlite3
making a Python object of each value it returns (``sqlite_rows``).  What
the broker needs at once is each queue's count and, per chunk, its seqs'
bounds; SQLite gives those from its ``(queue, seq)`` index without a row
of Python per message (``sqlite_replay``, a few ms per million rows).  Each
chunk's worth of a queue's rows is then a ``SQLiteChunk``, a
``pending_chunk.PendingChunk`` as a snapshot's ``LazyChunk`` and a log
replay's ``ReplayChunk`` are: counted and ordered at once, made whole by
``check``, which the broker's service runs in a thread once it listens
(``packed.check_thd``, front chunks first) and a queue runs before it reads
the chunk (``PackedReady``: a delivery waits for the chunk it reaches).

**One connection, one thread.**  ``check`` never reads itself: the store's
``StoreThread`` reads the chunk's rows (``sqlite_rows.read_span_thd``), in
the order the checks asked, between the broker's batches, and the checking
thread waits for it (``ChunkReader``).  A check in the store's thread
itself reads at once.

**Why the rows are still there.**  A chunk's rows are the messages of its
queue between its first and last seq, as the open counted them.  Only the
broker deletes a ready message's row, and only after it read the message:
a delivery, a purge, a move, an expiry or an overflow reads the chunk
first, so its read is queued before the batch that deletes a row (a check
waits for it), and a seq is never reused.  The one op that deletes rows
without reading them, a queue's deletion, takes the chunks out of the
broker with it.  Should a chunk's rows differ all the same, or not decode
(headers that are not JSON), ``check`` says so and the broker withholds
the chunk (``Broker.withhold``): logged, nothing damaged delivered, and its
rows stay for the next start.  A crash during the reads loses nothing:
reads write nothing.

**The store's close** reads the chunks still unread first (``read_all_thd``):
a clean stop writes them into its snapshot, and what an open recovered
stays whole after the store closed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from mqserver.packed import Chunk
from mqserver.storage.pending_chunk import PendingChunk
from mqserver.storage.sqlite_rows import read_span_thd
from mqserver.storage.worker import StoreThread


class SQLiteChunk(PendingChunk):
    """A chunk whose rows are still in the database (module docstring)."""

    __slots__ = ("_decoded", "_next", "_reader", "_waiting")

    origin = "SQLite replay"

    def __init__(self, reader: ChunkReader, queue: bytes, count: int, first: int,
                 last: int) -> None:
        super().__init__(queue, count, first, last)
        self._reader = reader
        self._decoded: Chunk | None = None  # the rows, until the slots take them
        self._waiting: threading.Event | None = None  # set once a read was asked for
        self._next: SQLiteChunk | None = None  # the queue's next chunk (``read_ahead``)

    def check(self) -> str | None:
        """None once the rows are read (kept until the first read of the content), else
        why they cannot be.  Thread-safe; waits for the store's thread."""
        if self._sound is None:
            self._reader.read(self)
        return None if self._sound else self._problem

    def span(self) -> tuple[bytes, int, int, int]:
        """(queue, first seq, last seq, count): what the rows must be."""
        return self._queue, self._first, self._last, self._count

    def _where(self) -> str:
        return f"the database {self._reader.path}"

    def _columns(self) -> Chunk:
        problem = self.check()
        if problem is not None:
            raise ValueError(f"{self.describe()}: {problem}")
        decoded, self._decoded = self._decoded, None
        assert decoded is not None
        return decoded


class ChunkReader:
    """Reads one open's ``SQLiteChunk``\\ s in the store's thread, for any thread."""

    #: chunks a read reads after the one asked for (``read_thd``): 16 chunks in
    #: all, about 25 ms of the store's thread for 100-byte messages (the
    #: durability machine makes it 1, as its chunks are of 4 messages)
    read_ahead = 15

    def __init__(self, thread: StoreThread, connection: Callable[[], sqlite3.Connection],
                 path: Path) -> None:
        self._thread = thread
        self._connection = connection  # the store's, in its thread only
        self.path = path
        self._lock = threading.Lock()  # a chunk's state changes under it
        # not read yet (the store's close reads them): let go of once read,
        # so a consumed backlog is not kept alive here
        self._unread: set[SQLiteChunk] = set()
        self._last: dict[bytes, SQLiteChunk] = {}  # each queue's newest, while the open plans

    def chunk(self, queue: bytes, count: int, first: int, last: int) -> SQLiteChunk:
        """A new chunk of this reader's, after the ones made so far of ``queue``."""
        chunk = SQLiteChunk(self, queue, count, first, last)
        before = self._last.get(queue)
        if before is not None:
            before._next = chunk
        self._last[queue] = chunk
        self._unread.add(chunk)
        return chunk

    def opened(self) -> None:
        """Every chunk was made (the open is done)."""
        self._last.clear()

    @property
    def unread(self) -> int:
        return len(self._unread)

    def read(self, chunk: SQLiteChunk) -> None:
        """Have ``chunk`` read (sound or not) in the store's thread and wait for it."""
        if self._thread.is_current():
            self.read_thd(chunk)
            return
        with self._lock:
            if chunk._sound is not None:
                return
            waiting = chunk._waiting  # None: nobody asked yet
            if waiting is None:
                try:
                    self._thread.post(self.read_thd, chunk)
                except RuntimeError:  # the store closed: nothing will read it now
                    self._settle(chunk, None, "the store closed before it was read")
                    return
                # before the lock goes: the read's ``_settle`` waits for it
                waiting = chunk._waiting = threading.Event()
        waiting.wait()

    def read_thd(self, chunk: SQLiteChunk) -> None:
        """Read ``chunk``'s rows unless that was done, then up to ``read_ahead``
        unread chunks after it in its queue (the store's thread).

        Its waiters go on as soon as it is read.  Reading ahead keeps the
        reads ahead of a consumer: each read asked for waits behind the
        batches queued before it (a commit each), so one chunk a wait would
        let a consumer that drains at once catch up and wait at every chunk."""
        self._read_one_thd(chunk)
        ahead = chunk._next
        for _ in range(self.read_ahead):
            if ahead is None:
                break
            self._read_one_thd(ahead)
            ahead = ahead._next

    def _read_one_thd(self, chunk: SQLiteChunk) -> None:
        if chunk._sound is not None:
            return
        try:
            decoded, problem = read_span_thd(self._connection(), *chunk.span()), ""
        except Exception as e:  # any failure of a read is the chunk's, reported by check
            decoded, problem = None, f"its rows cannot be read ({e})"
        with self._lock:
            waiting = self._settle(chunk, decoded, problem)
        if waiting is not None:
            waiting.set()

    def _settle(self, chunk: SQLiteChunk, decoded: Chunk | None,
                problem: str) -> threading.Event | None:
        """Give ``chunk`` its outcome, unless it has one (the lock held); the event
        its waiters wait on."""
        if chunk._sound is None:
            chunk._decoded, chunk._problem = decoded, problem
            chunk._sound = decoded is not None
        self._unread.discard(chunk)
        # no small object outlives the read in a long-lived chunk (``packed``)
        waiting, chunk._waiting = chunk._waiting, None
        return waiting

    def read_all_thd(self) -> None:
        """Read every chunk not read yet, oldest first (the store's close)."""
        with self._lock:
            unread = sorted(self._unread, key=lambda chunk: chunk.seq_range)
        for chunk in unread:
            self._read_one_thd(chunk)


__all__ = ["ChunkReader", "SQLiteChunk"]
