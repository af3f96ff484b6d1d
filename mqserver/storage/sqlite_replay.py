# -*- test-case-name: tests.unit.test_sqlite_replay -*-
"""What a SQLite open that replays recovers (no clean-shutdown snapshot to start from).

Queues, bindings, records and the next seq are read as they are (plain
``sqlite3``: no sqlite-utils import on the way to serving).  The
messages are planned from the ``(queue, seq)`` index, in SQLite: each
queue's count, and the first and last seq of each of its whole chunks
(``Backlog.chunk_size`` messages), without a row of Python per message.
Each such chunk becomes a ``sqlite_chunks.SQLiteChunk``, read once the
broker serves; the rest is read at once:

- a chunk holding a message with a TTL: the broker's expiry heap needs
  every expiry time at the load.  Meta ``expiring`` (schema version 4),
  which every batch that writes an expiry sets, says when there is none
  without a scan of the table; otherwise a scan finds the queues that hold
  one, and the chunks of those are looked at one by one;
- each queue's last, partial chunk, and the queues smaller than a chunk
  (with no queue of a whole chunk, one scan of the table reads them all:
  ``sqlite_rows.read_messages_thd``, as before the chunks).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import fields

from mqserver.model import QueueOptions, Recovered, RecoveredQueue
from mqserver.packed import Backlog, packing_queue, share_recovered_values
from mqserver.storage.sqlite_chunks import ChunkReader
from mqserver.storage.sqlite_rows import RowShape, read_messages_thd, read_span_thd

_LOW_QUEUE = "SELECT min(queue) FROM messages"
_HIGH_QUEUE = "SELECT max(queue) FROM messages"
_COUNT_ALL = "SELECT count(*) FROM messages"
_COUNTS = "SELECT queue, count(*) FROM messages GROUP BY queue"
_FIRST_SEQ = "SELECT min(seq) FROM messages WHERE queue = ? AND seq > ?"
_LAST_SEQ = "SELECT max(seq) FROM messages WHERE queue = ?"
# the seq ``OFFSET`` rows on (a walk of the index in SQLite, no row in Python)
_NTH_SEQ = "SELECT seq FROM messages WHERE queue = ? AND seq > ? ORDER BY seq LIMIT 1 OFFSET ?"
_EXPIRING_MARK = "SELECT value FROM meta WHERE key = 'expiring'"
_EXPIRING_QUEUES = "SELECT DISTINCT queue FROM messages WHERE expires_at IS NOT NULL"
_NONE_EXPIRING = "INSERT OR REPLACE INTO meta (key, value) VALUES ('expiring', 0)"
_EXPIRING_IN = ("SELECT 1 FROM messages WHERE expires_at IS NOT NULL AND queue = ? "
                "AND seq BETWEEN ? AND ? LIMIT 1")
_MAX_SEQ = "SELECT max(seq) FROM messages"
_BEFORE_ANY = -(1 << 63)  # a seq below every seq SQLite can hold




_OPTIONS = [field.name for field in fields(QueueOptions)]  # the queues table's columns too
_QUEUES = f"SELECT name, {', '.join(_OPTIONS)} FROM queues"


def recover_thd(conn: sqlite3.Connection, reader: ChunkReader) -> Recovered:
    """The store's state, its big backlogs as chunks of ``reader`` (module docstring).

    Plain ``sqlite3``: sqlite-utils' import would be 40 ms more of a restart
    after a crash (``sqlite``'s module docstring)."""
    recovered = Recovered()
    queues = recovered.queues
    queue = packing_queue(queues)

    for name, *values in conn.execute(_QUEUES):
        options = dict(zip(_OPTIONS, values, strict=True))
        options["delete_when_unused_bare"] = bool(options["delete_when_unused_bare"])
        queue(name).options = QueueOptions(**options)
    for name, event in conn.execute("SELECT queue, event FROM bindings"):
        queue(name).bindings.add(event)
    next_seq = plan_thd(conn, queue, reader, Backlog.chunk_size)
    reader.opened()
    for namespace, key, value in conn.execute("SELECT namespace, key, value FROM records"):
        recovered.records.setdefault(namespace, {})[key] = value
    stored = conn.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()
    recovered.next_seq = max(next_seq, stored[0] if stored else 1)
    share_recovered_values(queues.values())
    return recovered


def plan_thd(conn: sqlite3.Connection, queue: Callable[[bytes], RecoveredQueue],
             reader: ChunkReader, size: int) -> int:
    """Every message into ``queue(name).messages`` (a ``Backlog``), each queue's whole
    chunks of ``size`` without a TTL as ``SQLiteChunk``\\ s of ``reader``, the rest
    read now; the seq after the last one (1 for none).  With no queue of
    ``size`` messages, one scan reads them all (``read_messages_thd``)."""
    sizes = queue_sizes(conn)
    if all(count < size for count in sizes.values()):
        return read_messages_thd(conn, queue)
    expiring = expiring_queues(conn)
    for name, count in sizes.items():
        backlog = queue(name).messages
        after = _BEFORE_ANY
        for first, last in spans(conn, name, count, size):
            if name in expiring and conn.execute(_EXPIRING_IN, (name, first, last)).fetchone():
                backlog.append_chunk(read_span_thd(conn, name, first, last, size))
            else:
                backlog.append_chunk(reader.chunk(name, size, first, last))
            after = last
        params = (name, after)
        shape = RowShape(conn, "queue = ? AND seq > ?", params)
        backlog.extend(shape.message(row) for row in conn.execute(shape.select, params))
    highest = conn.execute(_MAX_SEQ).fetchone()[0]
    return 1 if highest is None else highest + 1


def expiring_queues(conn: sqlite3.Connection) -> set[bytes]:
    """The queues holding a message with an expiry: none if the mark says so (meta
    ``expiring``, set by every batch that writes one), else a scan of the table
    (0.15 s per 1M rows), which clears the mark when it finds none."""
    mark = conn.execute(_EXPIRING_MARK).fetchone()
    if mark is not None and not mark[0]:
        return set()
    found = {row[0] for row in conn.execute(_EXPIRING_QUEUES)}
    if not found:
        conn.execute(_NONE_EXPIRING)  # its own transaction: nothing else writes yet
    return found


def queue_sizes(conn: sqlite3.Connection) -> dict[bytes, int]:
    """Each queue's number of messages (from the index; one queue: SQLite's count
    of the table's rows, which reads no row)."""
    low = conn.execute(_LOW_QUEUE).fetchone()[0]
    if low is None:
        return {}
    if conn.execute(_HIGH_QUEUE).fetchone()[0] == low:
        return {low: conn.execute(_COUNT_ALL).fetchone()[0]}
    return dict(conn.execute(_COUNTS).fetchall())


def spans(conn: sqlite3.Connection, queue: bytes, count: int,
          size: int) -> list[tuple[int, int]]:
    """The first and last seq of each of the ``count // size`` whole chunks of
    ``queue``'s ``count`` messages, oldest first: arithmetic when its seqs are
    consecutive (one queue's burst), else a walk of the index, a chunk a step."""
    whole = count // size
    if not whole:
        return []
    first = conn.execute(_FIRST_SEQ, (queue, _BEFORE_ANY)).fetchone()[0]
    if conn.execute(_LAST_SEQ, (queue,)).fetchone()[0] - first == count - 1:
        return [(start, start + size - 1) for start in range(first, first + whole * size, size)]
    found = []
    after = _BEFORE_ANY
    for _ in range(whole):
        start = conn.execute(_FIRST_SEQ, (queue, after)).fetchone()[0]
        after = conn.execute(_NTH_SEQ, (queue, after, size - 1)).fetchone()[0]
        found.append((start, after))
    return found


__all__ = ["expiring_queues", "plan_thd", "queue_sizes", "recover_thd", "spans"]
