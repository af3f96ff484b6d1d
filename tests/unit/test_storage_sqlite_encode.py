"""The SQLite store's ``encode_ops``: its inline ENQUEUE/REMOVE runs against one op at a time.

``encode_ops`` extends the current run inline for the two hot ops and
through ``add`` for the rest; ``one_at_a_time`` below is the plain grouping
it replaced.  Both must give the same statements, rows and next seq.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
    QueueOptions,
)
from mqserver.storage import sqlite
from mqserver.testing import message


def one_at_a_time(ops: list[tuple[Any, ...]]) -> tuple[sqlite.Statements, int]:
    """Each op's (sql, row) pairs on their own, grouped where the sql repeats; the
    expiry mark once, last, if an op stored an expiry."""
    pairs: list[tuple[str, tuple[Any, ...]]] = []
    next_seq = 0
    expiring = False
    for op in ops:
        statements, op_next = sqlite.encode_ops([op])
        expiring = expiring or (sqlite.EXPIRING, [()]) in statements
        pairs += [(sql, row) for sql, rows in statements for row in rows
                  if sql != sqlite.EXPIRING]
        next_seq = max(next_seq, op_next)
    if expiring:
        pairs.append((sqlite.EXPIRING, ()))
    grouped: sqlite.Statements = []
    for sql, row in pairs:
        if grouped and grouped[-1][0] == sql:
            grouped[-1][1].append(row)
        else:
            grouped.append((sql, [row]))
    return grouped, next_seq


QUEUE = st.sampled_from([b"q", b"r"])
SEQ = st.integers(1, 30)
MESSAGE = st.builds(
    message, SEQ, QUEUE, headers=st.none() | st.just({"k": "ü"}), event=st.none() | st.just(b"e"),
    expires_at=st.none() | st.just(5000.0),
)
OP = st.one_of(
    st.tuples(st.just(ENQUEUE), MESSAGE),
    st.tuples(st.just(REMOVE), QUEUE, SEQ),
    st.tuples(st.just(REQUEUE), MESSAGE, SEQ),
    st.tuples(st.just(DECLARE), QUEUE, st.just(QueueOptions(default_ttl=5.0))),
    st.tuples(st.sampled_from([BIND, UNBIND]), QUEUE, st.just(b"ev")),
    st.tuples(st.just(DELETE_QUEUE), QUEUE),
    st.tuples(st.just(PUT), st.just(b"ns"), st.just(b"k"), st.just(b"v")),
    st.tuples(st.just(DELETE), st.just(b"ns"), st.just(b"k")),
)


@settings(max_examples=300)
@given(st.lists(OP, max_size=30))
def test_runs_are_the_same_as_encoding_one_op_at_a_time(ops):
    assert sqlite.encode_ops(ops) == one_at_a_time(ops)


def test_consecutive_enqueues_and_removes_share_one_executemany():
    ops = [(ENQUEUE, message(1)), (ENQUEUE, message(2)), (REMOVE, b"q", 1), (REMOVE, b"q", 2),
           (ENQUEUE, message(3))]
    statements, next_seq = sqlite.encode_ops(ops)
    assert [(sql, len(rows)) for sql, rows in statements] == [
        (sqlite._UPSERT_MESSAGE, 2), (sqlite._DELETE_MESSAGE, 2), (sqlite._UPSERT_MESSAGE, 1)]
    assert statements[1][1] == [(1, b"q"), (2, b"q")]
    assert next_seq == 4


def test_a_batch_that_stores_an_expiry_sets_the_mark_once_at_its_end():
    """What a replay trusts to skip its scan for expiries (``sqlite_replay``)."""
    plain = [(ENQUEUE, message(1)), (REMOVE, b"q", 1)]
    assert (sqlite.EXPIRING, [()]) not in sqlite.encode_ops(plain)[0]
    for expiring in ((ENQUEUE, message(2, expires_at=5000.0)),
                     (REQUEUE, message(3, expires_at=5000.0), 1)):
        statements, _ = sqlite.encode_ops([*plain, expiring, (ENQUEUE, message(4))])
        assert statements[-1] == (sqlite.EXPIRING, [()])
        assert [sql for sql, _ in statements].count(sqlite.EXPIRING) == 1
