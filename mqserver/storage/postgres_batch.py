# -*- test-case-name: tests.unit.test_storage_postgres_batch -*-
"""A batch of storage ops as the few set-wide statements PostgreSQL runs for it.

Runs on the reactor thread (it is the snapshot of the broker's ``Message``
objects, which keep changing after ``apply`` returns), so it must be cheap:
one dict store per message op, no SQL, no I/O.

Why net effects: a busy broker's batch is mostly ``enqueue`` and ``remove``,
often of the same messages (published and acked within one commit).  Every
message op is a write keyed by seq, so only the last one per seq matters: a
batch becomes a delete (ranges and ``seq = ANY(...)``, ``seq_runs``), one
``COPY`` of new rows and, rarely, one upsert of rows that may exist
(requeues in place), whatever its length.  A message published and acked in the same batch is never
written at all, only deleted (in case an earlier try of this same batch
committed).  ``delete_queue`` deletes a range (every message and binding of
a queue) rather than keys, so it is a barrier: the message writes before it
are flushed first.  The other ops (declare, bind, unbind, put, delete) touch
tables no message op touches and are rare; they run as ``executemany`` runs
in their own order, as in the SQLite store.

A ``COPY`` cannot upsert.  An ``enqueue`` names a seq the broker has never
used, so its row cannot exist, except when an earlier try of the batch did
commit (its answer was lost with the connection) or for a caller that breaks
that rule; the store then sees a unique violation and runs the batch again
with every row upserted (``MessageWrites.rows_to_upsert``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mqserver.model import (
    BIND,
    DECLARE,
    DELETE,
    DELETE_QUEUE,
    ENQUEUE,
    PUT,
    REMOVE,
    REQUEUE,
    UNBIND,
    Message,
)

MESSAGE_COLUMNS = (
    "seq", "queue", "id", "body", "event", "headers", "created_at", "expires_at", "retry",
    "source",
)
#: how binary COPY in and out encodes ``MESSAGE_COLUMNS``.  ``headers`` (a json
#: column) travels as its text: encoded here on the reactor thread, and a json
#: value's binary form is its text (psycopg's json type would encode it again)
MESSAGE_TYPES = (
    "int8", "bytea", "bytea", "bytea", "bytea", "text", "float8", "float8", "int4", "text",
)

UPSERT_QUEUE = (
    "INSERT INTO queues (name, delete_when_unused, delete_when_unused_bare, dead_letter, "
    "max_length, default_ttl, overflow) VALUES (%s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (name) DO UPDATE SET delete_when_unused = EXCLUDED.delete_when_unused, "
    "delete_when_unused_bare = EXCLUDED.delete_when_unused_bare, "
    "dead_letter = EXCLUDED.dead_letter, max_length = EXCLUDED.max_length, "
    "default_ttl = EXCLUDED.default_ttl, overflow = EXCLUDED.overflow"
)
BIND_SQL = "INSERT INTO bindings (queue, event) VALUES (%s, %s) ON CONFLICT DO NOTHING"
UNBIND_SQL = "DELETE FROM bindings WHERE queue = %s AND event = %s"
DROP_QUEUE = (
    "DELETE FROM messages WHERE queue = %s",
    "DELETE FROM bindings WHERE queue = %s",
    "DELETE FROM queues WHERE name = %s",
)
PUT_SQL = (
    "INSERT INTO records (namespace, key, value) VALUES (%s, %s, %s) "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value"
)
DELETE_SQL = "DELETE FROM records WHERE namespace = %s AND key = %s"

#: a run of at least this many consecutive seqs is deleted as one range
MIN_RUN = 8

Row = tuple[Any, ...]
# a message's last write in the batch: its row and whether the seq is new
# (True: COPY it), or None: delete the seq
_Write = tuple[Row, bool] | None


@dataclass
class MessageWrites:
    """The net effect of consecutive message ops on the ``messages`` table."""

    deletes: list[int] = field(default_factory=list)
    inserts: list[Row] = field(default_factory=list)
    upserts: list[Row] = field(default_factory=list)

    def rows_to_upsert(self) -> list[Row]:
        """Every row, for the retry after a unique violation."""
        return self.inserts + self.upserts


@dataclass
class Statements:
    """Other ops of the batch: ``executemany(sql, rows)`` in order."""

    runs: list[tuple[str, list[Row]]] = field(default_factory=list)


Step = MessageWrites | Statements


@dataclass
class EncodedBatch:
    """What the store thread executes for one ``apply``, in one transaction."""

    steps: list[Step]
    next_seq: int  # the highest seq of the batch + 1, 0 if it has none
    ops: int


def message_row(message: Message) -> Row:
    """The ``messages`` row of a message.

    Headers are JSON with every non-ASCII character escaped: a header a client
    sent may hold a NUL or a lone surrogate, which PostgreSQL text (and UTF-8)
    cannot carry but a ``\\u`` escape (four hex digits) in a json value can, so no client can
    make a batch fail forever.
    """
    headers = message.headers
    return (
        message.seq, message.queue, message.id, message.body, message.event,
        None if headers is None else json.dumps(headers),
        message.created_at, message.expires_at, message.retry, message.source,
    )


def seq_runs(seqs: list[int]) -> tuple[list[int], list[int], list[int]]:
    """``seqs`` as (singles, starts, ends): each run of ``MIN_RUN`` or more
    consecutive seqs becomes a range ``starts[i]..ends[i]``, the rest stay single.

    Why: a consumer acks a queue's messages in seq order, so a batch's
    deletes are mostly long runs.  One index range scan per run costs a
    fraction of a B-tree descent per seq (``seq = ANY(array)``): 10,000
    acks of one queue, 6 to 9 ms instead of 28 to 41.  Short runs stay
    single, where a range join costs more than the descents it saves.  A
    range holds only seqs of ``seqs``, so it deletes nothing else.
    Runs in the store thread, not on the reactor's.
    """
    singles: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    ordered = sorted(seqs)
    first = 0
    for n in range(1, len(ordered) + 1):
        if n < len(ordered) and ordered[n] == ordered[n - 1] + 1:
            continue
        if n - first >= MIN_RUN:
            starts.append(ordered[first])
            ends.append(ordered[n - 1])
        else:
            singles += ordered[first:n]
        first = n
    return singles, starts, ends


def _flush(writes: dict[int, _Write]) -> MessageWrites:
    step = MessageWrites()
    for seq, write in writes.items():
        if write is None:
            step.deletes.append(seq)
        elif write[1]:
            step.inserts.append(write[0])
        else:
            step.upserts.append(write[0])
    # a message published and removed in this batch is deleted only (see the
    # module docstring), and a row is never both deleted and written
    return step


def encode_batch(ops: list[tuple[Any, ...]]) -> EncodedBatch:
    """The steps of one batch; see the module docstring.  Raises on an unknown op."""
    steps: list[Step] = []
    writes: dict[int, _Write] = {}
    statements: Statements | None = None
    next_seq = 0

    def run(sql: str, row: Row) -> None:
        nonlocal statements
        if statements is None:
            statements = Statements()
            steps.append(statements)
        runs = statements.runs
        if runs and runs[-1][0] is sql:
            runs[-1][1].append(row)
        else:
            runs.append((sql, [row]))

    for op in ops:
        kind = op[0]
        if kind == ENQUEUE:
            message = op[1]
            writes[message.seq] = (message_row(message), True)
            if message.seq >= next_seq:
                next_seq = message.seq + 1
        elif kind == REMOVE:
            writes[op[2]] = None
        elif kind == REQUEUE:
            message, old_seq = op[1], op[2]
            seq = message.seq
            if seq == old_seq:
                # in place: still new if this batch made it, else it may exist
                before = writes.get(seq)
                writes[seq] = (message_row(message), before is not None and before[1])
            else:
                writes[old_seq] = None
                writes[seq] = (message_row(message), True)
            if seq >= next_seq:
                next_seq = seq + 1
        elif kind == DELETE_QUEUE:
            if writes:
                steps.append(_flush(writes))
                writes = {}
            statements = None
            for sql in DROP_QUEUE:
                run(sql, (op[1],))
        elif kind == DECLARE:
            o = op[2]
            run(UPSERT_QUEUE, (op[1], o.delete_when_unused, o.delete_when_unused_bare,
                               o.dead_letter, o.max_length, o.default_ttl, o.overflow))
        elif kind == BIND:
            run(BIND_SQL, (op[1], op[2]))
        elif kind == UNBIND:
            run(UNBIND_SQL, (op[1], op[2]))
        elif kind == PUT:
            run(PUT_SQL, (op[1], op[2], op[3]))
        elif kind == DELETE:
            run(DELETE_SQL, (op[1], op[2]))
        else:
            raise ValueError(f"unknown storage op {kind!r}")
    if writes:
        steps.append(_flush(writes))
    return EncodedBatch(steps, next_seq, len(ops))
