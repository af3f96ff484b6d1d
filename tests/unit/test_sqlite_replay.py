"""A SQLite open that replays (``sqlite_replay``): the plan from the index, checked
against a model (the messages written), whatever the queues, seqs and odd rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import reactor

from mqserver.model import ENQUEUE, Message
from mqserver.packed import Backlog, Chunk
from mqserver.storage.sqlite import encode_ops, schema_script, upgrade_steps
from mqserver.storage.sqlite_chunks import ChunkReader, SQLiteChunk
from mqserver.storage.sqlite_replay import expiring_queues, queue_sizes, recover_thd, spans
from mqserver.storage.worker import StoreThread
from mqserver.testing import message

SIZE = 3


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Backlog, "chunk_size", SIZE)


@pytest.fixture
def thread() -> Iterator[StoreThread]:
    """A store thread of its own (the reactor need not run: nothing is fired on it)."""
    thread = StoreThread(reactor, "test-sqlite-replay")
    thread.start()
    yield thread
    thread.stop()


def database(messages: list[Message]) -> sqlite3.Connection:
    """An in-memory database at the current schema holding ``messages`` as the
    store writes them; usable from the store's thread too (one at a time)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.executescript("\n".join(schema_script(name) for name in upgrade_steps(0)))
    statements, _ = encode_ops([(ENQUEUE, m) for m in messages])
    for sql, rows in statements:
        conn.executemany(sql, rows)
    return conn


def recovered(conn: sqlite3.Connection, thread: StoreThread) -> tuple[Any, ChunkReader]:
    reader = ChunkReader(thread, lambda: conn, Path("test.sqlite3"))
    return recover_thd(conn, reader), reader


odd = st.fixed_dictionaries({}, optional={
    "expires_at": st.sampled_from([None, 5000.0]), "retry": st.integers(0, 2),
    "headers": st.sampled_from([None, {"h": "1"}]), "event": st.sampled_from([b"e", b"f"]),
    "source": st.sampled_from([None, "mqks", "phpmq"]),
})
rows = st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.integers(1, 3), odd),
                max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(rows=rows)
def test_a_replay_recovers_exactly_the_messages_written(thread: StoreThread,
                                                        rows: list[Any]) -> None:
    """Each queue's messages in seq order, whatever the queues' sizes, gaps between
    seqs and odd rows; its whole chunks without a TTL unread until checked (and
    none of those holds a TTL), the rest read at the open."""
    messages, seq = [], 0
    for queue, gap, fields in rows:
        seq += gap
        messages.append(message(seq, queue=queue, **{"event": b"e", "source": "mqks", **fields}))
    conn = database(messages)
    state, reader = recovered(conn, thread)
    expected: dict[bytes, list[Message]] = {}
    for m in messages:
        expected.setdefault(m.queue, []).append(m)
    assert set(state.queues) == set(expected)
    lazy = 0
    for name, rq in state.queues.items():
        chunks = rq.messages.chunks
        assert all(chunk.count == SIZE for chunk in chunks)
        assert len(rq.messages.tail) == len(expected[name]) % SIZE
        for chunk in chunks:
            if isinstance(chunk, SQLiteChunk):
                lazy += 1
                assert chunk.unchecked  # nothing read at the open
            else:
                assert type(chunk) is Chunk and chunk.expiry_values()
    assert reader.unread == lazy
    for name, rq in state.queues.items():
        assert list(rq.messages) == expected[name]
        assert all(m.queue is name for m in rq.messages.tail)
    assert reader.unread == 0
    assert state.next_seq == seq + 1


def test_with_no_queue_of_a_whole_chunk_one_scan_reads_everything(
        thread: StoreThread) -> None:
    messages = [message(seq, queue=b"q%d" % (seq % 3)) for seq in range(1, 7)]
    state, reader = recovered(database(messages), thread)
    assert reader.unread == 0
    assert [list(state.queues[b"q%d" % n].messages) for n in (1, 2, 0)] == \
        [messages[0::3], messages[1::3], messages[2::3]]


def test_one_queue_is_counted_without_a_group_and_several_with_one() -> None:
    one = database([message(seq) for seq in (1, 2, 5)])
    assert queue_sizes(one) == {b"q": 3}
    several = database([message(seq, queue=b"q%d" % (seq % 2)) for seq in range(1, 6)])
    assert queue_sizes(several) == {b"q0": 2, b"q1": 3}
    assert queue_sizes(database([])) == {}


def test_spans_of_consecutive_seqs_are_arithmetic_and_others_walk_the_index() -> None:
    conn = database([message(seq, queue=b"q%d" % (seq > 7)) for seq in range(1, 8)]
                    + [message(seq, queue=b"q1") for seq in (10, 11, 15, 16, 20, 30, 31)])
    assert spans(conn, b"q0", 7, SIZE) == [(1, 3), (4, 6)]
    assert spans(conn, b"q1", 7, SIZE) == [(10, 15), (16, 30)]
    assert spans(conn, b"q1", 2, SIZE) == []


def test_the_expiry_mark_spares_the_scan_and_a_scan_that_finds_none_clears_it() -> None:
    conn = database([message(1), message(2, queue=b"r", expires_at=5000.0)])
    assert conn.execute("SELECT value FROM meta WHERE key = 'expiring'").fetchone() == (1,)
    assert expiring_queues(conn) == {b"r"}
    conn.execute("DELETE FROM messages WHERE seq = 2")
    assert expiring_queues(conn) == set()
    assert conn.execute("SELECT value FROM meta WHERE key = 'expiring'").fetchone() == (0,)
    # the mark is trusted: an expiry written behind the store's back is not looked for
    conn.execute("UPDATE messages SET expires_at = 5000.0 WHERE seq = 1")
    assert expiring_queues(conn) == set()
