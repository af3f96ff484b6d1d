# -*- test-case-name: tests.unit.test_storage_sqlite -*-
"""Reading the SQLite store's messages back at an open that replays (no snapshot).

The rows become each queue's ``Backlog`` a chunk at a time, packed from their
columns, never as a million ``Message`` objects first: sqlite3 makes an
object of every value it returns, and those objects are most of the open's
time and, freed, memory the allocator keeps.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from itertools import repeat
from typing import Any

from mqserver.model import Message, RecoveredQueue
from mqserver.packed import Backlog, Chunk


def _chunk(columns: list[tuple[Any, ...]]) -> Chunk:
    """A chunk of rows of ``SELECT seq, queue, id, body, event, headers, created_at,
    expires_at, retry, source``, given as columns (``zip(*rows)``)."""
    seqs, queues, ids, bodies, events, headers, created, expires, retries, sources = columns
    if headers.count(None) != len(headers):
        headers = tuple(None if value is None else json.loads(value) for value in headers)
    return Chunk.of_columns(ids, queues, bodies, seqs, events, headers, created, expires,
                            retries, sources)


def _message(row: tuple[Any, ...]) -> Message:
    seq, queue, mid, body, event, headers, created, expires, retry, source = row
    return Message(mid, queue, body, seq, event, None if headers is None else json.loads(headers),
                   created, expires, retry, source)


_COLUMNS = "seq, queue, id, body, event, headers, created_at, expires_at, retry, source"
_FIRST = "SELECT event, source FROM messages {where} ORDER BY seq LIMIT 1"
_NOT_PLAIN = ("SELECT 1 FROM messages WHERE NOT (event IS ? AND source IS ? AND headers IS NULL "
              "AND expires_at IS NULL AND retry = 0) {also} LIMIT 1")


class RowShape:
    """How recovery reads the messages: every column, or, when every message has
    the first one's event and source and no headers, expiry or retries (a
    backlog from one kind of publisher, the usual), the five columns that
    differ, the others filled in.  sqlite3 makes an object of every value it
    returns, and those are most of the open's time: half the values, a third
    less time.  Finding out costs a scan of the rows in SQLite (0.15 s per
    1M) when every row is plain, next to nothing when one is not.

    ``where`` (with ``params``) narrows it to some rows, ``SPAN``'s for one
    chunk (``read_span_thd``); ``select`` then reads them."""

    def __init__(self, conn: sqlite3.Connection, where: str = "",
                 params: tuple[Any, ...] = ()) -> None:
        first = conn.execute(_FIRST.format(where=f"WHERE {where}" if where else ""),
                             params).fetchone()
        self.plain = first is not None and conn.execute(
            _NOT_PLAIN.format(also=f"AND {where}" if where else ""), (*first, *params),
        ).fetchone() is None
        self.event, self.source = first or (None, None)
        columns = "seq, queue, id, body, created_at" if self.plain else _COLUMNS
        self.select = f"SELECT {columns} FROM messages {'WHERE ' if where else ''}{where} " \
                      "ORDER BY seq"

    def chunk(self, columns: list[tuple[Any, ...]]) -> Chunk:
        """``_chunk`` of columns in this shape."""
        if not self.plain:
            return _chunk(columns)
        seqs, queues, ids, bodies, created = columns
        count = len(seqs)
        return Chunk.of_columns(ids, queues, bodies, seqs, repeat(self.event, count),
                                repeat(None, count), created, repeat(None, count),
                                repeat(0, count), repeat(self.source, count))

    def message(self, row: tuple[Any, ...]) -> Message:
        """``_message`` of a row in this shape."""
        if not self.plain:
            return _message(row)
        seq, queue, mid, body, created = row
        return Message(mid, queue, body, seq, self.event, None, created, None, 0, self.source)


SPAN = "queue = ? AND seq BETWEEN ? AND ?"
"""The rows of one queue between two seqs (the ``(queue, seq)`` index's range)."""


def read_span_thd(conn: sqlite3.Connection, queue: bytes, first: int, last: int,
                  count: int) -> Chunk:
    """The ``count`` messages of ``queue`` from seq ``first`` to ``last`` as one chunk;
    ``SpanError`` if the rows are not exactly those (a row the open counted is
    gone), or what decoding them raised (headers that are not JSON)."""
    params = (queue, first, last)
    shape = RowShape(conn, SPAN, params)
    rows = conn.execute(shape.select, params).fetchall()
    if len(rows) != count or rows[0][0] != first or rows[-1][0] != last:
        found = f"{rows[0][0]} to {rows[-1][0]}" if rows else "none"
        raise SpanError(f"{len(rows)} rows found (seqs {found}) where the open counted {count}")
    return shape.chunk(list(zip(*rows, strict=True)))


class SpanError(Exception):
    """A chunk's rows are not the ones the open counted."""


def read_messages_thd(conn: sqlite3.Connection,
                      queue: Callable[[bytes], RecoveredQueue]) -> int:
    """Every message row into ``queue(name).messages`` (a ``Backlog``), in seq
    order; the seq after the last one read (1 for none)."""
    next_seq = 1
    # in seq order, the table's own (a scan, where ORDER BY queue, seq walked
    # the index and looked each row up); each queue's messages are in seq
    # order all the same
    shape = RowShape(conn)
    cursor = conn.execute(shape.select)
    # read a chunk's worth of rows at a time: a run of one queue's (one
    # queue's backlog: every run) is packed from its columns as it is; rows
    # of several queues are dealt to each queue's newest rows, packed into a
    # chunk of its Backlog as they reach its size.  Never messages first.
    size = cursor.arraysize = Backlog.chunk_size
    rows: dict[bytes, list[tuple[Any, ...]]] = {}
    while batch := cursor.fetchmany():
        next_seq = batch[-1][0] + 1
        columns = list(zip(*batch, strict=True))
        names = columns[1]
        name = names[0]
        if len(batch) == size and names.count(name) == size and not rows.get(name):
            queue(name).messages.append_chunk(shape.chunk(columns))
            continue
        for row in batch:
            pending = rows.get(row[1])
            if pending is None:
                pending = rows[row[1]] = []
            pending.append(row)
            if len(pending) == size:
                queue(row[1]).messages.append_chunk(shape.chunk(list(zip(*pending, strict=True))))
                pending.clear()
    for name, pending in rows.items():
        queue(name).messages.extend(shape.message(row) for row in pending)
    return next_seq


__all__ = ["SPAN", "RowShape", "SpanError", "read_messages_thd", "read_span_thd"]
