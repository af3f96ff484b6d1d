"""A SQLite replay's chunks read when needed (``sqlite_chunks``): counted at the open,
read in the store's thread for whichever thread checks them, whole after the
store closed; one whose rows are not the ones counted is withheld by the broker."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread

from mqserver.broker.core import Broker
from mqserver.broker.ready import PackedReady
from mqserver.model import ENQUEUE, Message
from mqserver.packed import Backlog, check_thd
from mqserver.storage.sqlite import SQLiteStore
from mqserver.storage.sqlite_chunks import ChunkReader, SQLiteChunk
from mqserver.storage.worker import StoreThread
from mqserver.testing import message

SIZE = 4


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Backlog, "chunk_size", SIZE)


def sent(count: int, queue: bytes = b"q") -> list[Message]:
    return [message(seq, queue=queue, event=b"e", source="mqks") for seq in range(1, count + 1)]


@pytest_twisted.inlineCallbacks
def written(path: Path, messages: list[Message]) -> Any:
    """``messages`` in a database the next open replays (closed without a snapshot)."""
    store = SQLiteStore(path)
    yield store.open()
    yield store.apply([(ENQUEUE, m) for m in messages])
    yield store.close()


@pytest_twisted.inlineCallbacks
def opened(path: Path) -> Any:
    """(an open store replaying ``path``, its recovered state)."""
    store = SQLiteStore(path)
    recovered = yield store.open()
    return store, recovered


def unread(chunks: list[Any]) -> int:
    return sum(isinstance(chunk, SQLiteChunk) and chunk._sound is None for chunk in chunks)


@pytest_twisted.inlineCallbacks
def test_chunks_are_counted_at_the_open_and_read_when_checked(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    messages = sent(10)
    yield written(path, messages)
    store, recovered = yield opened(path)
    try:
        backlog = recovered.queues[b"q"].messages
        assert len(backlog) == 10 and [chunk.count for chunk in backlog.chunks] == [4, 4]
        assert unread(backlog.chunks) == 2 and [m.seq for m in backlog.tail] == [9, 10]
        assert [chunk.seq_range for chunk in backlog.chunks] == [(1, 4), (5, 8)]
        first = backlog.chunks[0]
        assert first.unchecked and first.check() is None and not first.unchecked
        assert first.unpack() == messages[:4]
        # from the reactor's thread pool, as the broker's service checks them
        yield deferToThread(check_thd, backlog.chunks)
        assert unread(backlog.chunks) == 0
        assert list(backlog) == messages
    finally:
        yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_read_reads_ahead_in_its_queue(tmp_path: Path) -> Any:
    """A consumer draining at once finds the next chunks read: each read waits
    behind the batches queued before it, so one chunk a read would not keep up."""
    path = tmp_path / "mqserver.sqlite3"
    ahead = ChunkReader.read_ahead
    whole = ahead + 4
    messages = sent(SIZE * whole)
    others = [message(seq, queue=b"other") for seq in range(len(messages) + 1,
                                                            len(messages) + 1 + SIZE * 2)]
    yield written(path, messages + others)
    store, recovered = yield opened(path)
    try:
        chunks = recovered.queues[b"q"].messages.chunks
        assert chunks[0].check() is None
        yield store.run_thd(lambda conn: None)  # the reads ahead are done
        assert unread(chunks) == whole - 1 - ahead
        assert unread(recovered.queues[b"other"].messages.chunks) == 2  # its own queue's only
        assert chunks[ahead + 1].check() is None  # the next read goes on from there
        yield store.run_thd(lambda conn: None)
        assert unread(chunks) == 0 and list(recovered.queues[b"q"].messages) == messages
    finally:
        yield store.close()


@pytest_twisted.inlineCallbacks
def test_threads_checking_one_chunk_at_once_share_one_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    yield written(path, sent(8))
    store, recovered = yield opened(path)
    reads = []
    original = ChunkReader._read_one_thd

    def counted(self: ChunkReader, chunk: SQLiteChunk) -> None:
        if chunk._sound is None:
            reads.append(chunk.seq_range)
        original(self, chunk)

    monkeypatch.setattr(ChunkReader, "_read_one_thd", counted)
    try:
        chunk = recovered.queues[b"q"].messages.chunks[1]
        results: list[Any] = []
        checkers = [threading.Thread(target=lambda: results.append(chunk.check()))
                    for _ in range(4)]
        for thread in checkers:
            thread.start()
        yield deferToThread(lambda: [thread.join() for thread in checkers])
        assert results == [None] * 4 and reads == [(5, 8)]
    finally:
        yield store.close()


@pytest_twisted.inlineCallbacks
def test_the_close_reads_what_is_left_so_the_recovered_state_stays_whole(
        tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    messages = sent(9)
    yield written(path, messages)
    store, recovered = yield opened(path)
    yield store.close()
    backlog = recovered.queues[b"q"].messages
    assert unread(backlog.chunks) == 0 and list(backlog) == messages


@pytest_twisted.inlineCallbacks
def test_rows_that_are_not_the_ones_counted_make_the_chunk_one_check_reports(
        tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    yield written(path, sent(8))
    store, recovered = yield opened(path)
    try:
        chunks = recovered.queues[b"q"].messages.chunks
        # a row gone behind the broker's back, another one's headers not JSON
        yield store.run_thd(lambda conn: conn.execute("DELETE FROM messages WHERE seq = 2"))
        yield store.run_thd(lambda conn: conn.execute(
            "UPDATE messages SET headers = '{nope' WHERE seq = 6"))
        problems = [chunk.check() for chunk in chunks]
        assert "3 rows found (seqs 1 to 4) where the open counted 4" in problems[0]
        assert "its rows cannot be read" in problems[1]
        assert chunks[0].describe() == (
            f"SQLite replay: 4 messages of queue b'q' (seqs 1 to 4) in the database {path}")
    finally:
        yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_broker_withholds_a_chunk_whose_rows_changed_and_serves_the_rest(
        tmp_path: Path, logged: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(ChunkReader, "read_ahead", 0)  # a read is the chunk asked for
    path = tmp_path / "mqserver.sqlite3"
    messages = sent(13)
    yield written(path, messages)
    store, recovered = yield opened(path)
    try:
        broker = Broker(store, Clock())
        broker.pack_ready_after = 2
        broker.pack_chunk = SIZE
        broker.load(recovered)
        ready = broker.queues[b"q"].ready
        assert isinstance(ready, PackedReady) and len(ready) == 13
        yield store.run_thd(lambda conn: conn.execute("DELETE FROM messages WHERE seq = 7"))
        assert ready.popleft() == messages[0]  # the front chunk alone was read
        assert unread(ready.chunks) == 2
        yield deferToThread(check_thd, broker.unchecked_chunks())
        broker.settle_recovered()
        assert broker.withheld == 4 and len(ready) == 8
        assert [m.seq for m in ready] == [2, 3, 4, 9, 10, 11, 12, 13]
        assert any("SQLite replay: 4 messages of queue b'q' (seqs 5 to 8)" in line
                   and "withheld until the next start" in line for line in logged), logged
    finally:
        yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_clean_stop_right_after_a_replay_writes_the_unread_chunks_into_its_snapshot(
        tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    messages = sent(11)
    yield written(path, messages)
    store, recovered = yield opened(path)
    assert unread(recovered.queues[b"q"].messages.chunks) == 2
    assert (yield store.close_clean(recovered))
    store, again = yield opened(path)
    yield store.close()
    assert store.from_snapshot and list(again.queues[b"q"].messages) == messages


@pytest_twisted.inlineCallbacks
def test_a_clean_stop_with_a_chunk_that_cannot_be_read_writes_no_snapshot(
        tmp_path: Path, logged: list[str]) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    messages = sent(8)
    yield written(path, messages)
    store, recovered = yield opened(path)
    yield store.run_thd(lambda conn: conn.execute(
        "UPDATE messages SET headers = '{nope' WHERE seq = 3"))
    assert not (yield store.close_clean(recovered))
    assert any("not written: SQLite replay: 4 messages of queue b'q' (seqs 1 to 4)" in line
               for line in logged), logged
    with sqlite3.connect(path) as conn:  # the row is still there for the next start
        conn.execute("UPDATE messages SET headers = NULL WHERE seq = 3")
    conn.close()
    store, again = yield opened(path)
    yield store.close()
    assert not store.from_snapshot and list(again.queues[b"q"].messages) == messages


def test_a_check_once_the_store_thread_stopped_reports_it_at_once() -> None:
    thread = StoreThread(reactor, "test-stopped")
    reader = ChunkReader(thread, lambda: pytest.fail("no connection is asked for"),
                         Path("db"))
    chunk = reader.chunk(b"q", 4, 1, 4)
    assert reader.unread == 1
    assert chunk.check() == "the store closed before it was read"
    assert reader.unread == 0 and chunk.unchecked


@pytest_twisted.inlineCallbacks
def test_a_posted_call_that_fails_is_logged_and_the_thread_goes_on(logged: list[str]) -> Any:
    thread = StoreThread(reactor, "test-posted")
    thread.start()
    try:
        thread.post(lambda: 1 / 0)
        assert (yield thread.run(lambda: "next")) == "next"
        yield deferToThread(lambda: None)  # the log call queued from the thread ran
        assert any("test-posted: a posted call failed" in line for line in logged), logged
        assert thread.is_current() is False
        assert (yield thread.run(thread.is_current)) is True
    finally:
        thread.stop()
    with pytest.raises(RuntimeError, match="not running"):
        thread.post(lambda: None)
