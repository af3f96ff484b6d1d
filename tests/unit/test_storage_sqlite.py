"""The SQLite backend: the storage contract, then what only SQLite has."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.model import DECLARE, ENQUEUE, PUT, QueueOptions
from mqserver.packed import Backlog
from mqserver.storage.errors import StoreFormatError, StoreLockedError
from mqserver.storage.sqlite import (
    SCHEMA_VERSION,
    SQLiteStore,
    schema_script,
    upgrade_steps,
)
from mqserver.storage.sqlite_rows import RowShape
from mqserver.testing import StoreContract, message


class TestSQLiteStore(StoreContract):
    def make_store(self, path: Path) -> SQLiteStore:
        return SQLiteStore(path / "mqserver.sqlite3")


class TestSQLiteStoreNormalSync(StoreContract):
    def make_store(self, path: Path) -> SQLiteStore:
        return SQLiteStore(path / "mqserver.sqlite3", sync="normal")


def schema_of(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
    conn.close()
    return [(name, " ".join((sql or "").split())) for name, sql in rows]


def make_v1(path: Path) -> None:
    """A database exactly as version 1 of the schema left it, with some state."""
    conn = sqlite3.connect(path)
    conn.executescript(schema_script("sqlite-v1.sql"))
    conn.execute("INSERT INTO queues (name, dead_letter, max_length) VALUES (?, ?, ?)",
                 (b"q", b"dlq", 5))
    conn.execute("INSERT INTO bindings VALUES (?, ?)", (b"q", b"ev"))
    for seq in (3, 9):
        conn.execute(
            "INSERT INTO messages (seq, queue, id, body, event, headers, created_at, retry) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, b"q", b"m%d" % seq, b"body", b"ev", '{"h": "1"}', 10.0 + seq, 1),
        )
    conn.commit()
    conn.close()


def test_upgrade_steps_cover_every_version():
    assert upgrade_steps(0) == ["sqlite-v1.sql", "sqlite-v1-to-v2.sql", "sqlite-v2-to-v3.sql",
                                "sqlite-v3-to-v4.sql"]
    assert upgrade_steps(1) == ["sqlite-v1-to-v2.sql", "sqlite-v2-to-v3.sql",
                                "sqlite-v3-to-v4.sql"]
    assert upgrade_steps(SCHEMA_VERSION) == []


@pytest_twisted.inlineCallbacks
def test_upgrade_from_v1_keeps_the_data(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    make_v1(path)
    store = SQLiteStore(path)
    recovered = yield store.open()
    yield store.apply([(PUT, b"ns", b"k", b"v")])  # a v2 table works at once
    yield store.close()
    queue = recovered.queues[b"q"]
    assert [(m.id, m.seq, m.retry, m.headers) for m in queue.messages] == [
        (b"m3", 3, 1, {"h": "1"}), (b"m9", 9, 1, {"h": "1"}),
    ]
    assert queue.options == QueueOptions(dead_letter=b"dlq", max_length=5)
    assert queue.bindings == {b"ev"}
    assert recovered.next_seq == 10
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone() == (10,)
        # v4: no message has an expiry (``sqlite_replay.expiring_queues``)
        assert conn.execute("SELECT value FROM meta WHERE key = 'expiring'").fetchone() == (0,)
    conn.close()


@pytest_twisted.inlineCallbacks
def test_the_upgrade_to_v4_marks_a_database_holding_an_expiry(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    make_v1(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE messages SET expires_at = 5000.0 WHERE seq = 9")
    conn.close()
    store = SQLiteStore(path)
    recovered = yield store.open()
    yield store.close()
    assert [m.expires_at for m in recovered.queues[b"q"].messages] == [None, 5000.0]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'expiring'").fetchone() == (1,)
    conn.close()


@pytest_twisted.inlineCallbacks
def test_a_fresh_database_equals_an_upgraded_one(tmp_path: Path) -> Any:
    make_v1(tmp_path / "old.sqlite3")
    for name in ("old.sqlite3", "new.sqlite3"):
        store = SQLiteStore(tmp_path / name)
        yield store.open()
        yield store.close()
    assert schema_of(tmp_path / "old.sqlite3") == schema_of(tmp_path / "new.sqlite3")


@pytest_twisted.inlineCallbacks
def test_a_newer_schema_is_refused(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    make_v1(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    with pytest.raises(StoreFormatError, match="schema version 99"):
        yield SQLiteStore(path).open()


@pytest_twisted.inlineCallbacks
def test_a_foreign_database_is_refused(tmp_path: Path) -> Any:
    path = tmp_path / "other.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER)")
    conn.close()
    with pytest.raises(StoreFormatError, match="not an mqserver database"):
        yield SQLiteStore(path).open()


@pytest_twisted.inlineCallbacks
def test_a_second_server_cannot_open_the_file(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    first = SQLiteStore(path)
    yield first.open()
    with pytest.raises(StoreLockedError, match="in use by another process"):
        yield SQLiteStore(path).open()
    yield first.close()
    second = SQLiteStore(path)
    yield second.open()
    yield second.close()


@pytest.mark.parametrize(("sync", "level"), [("full", 2), ("normal", 1)])
@pytest_twisted.inlineCallbacks
def test_wal_and_sync_mode(tmp_path: Path, sync: str, level: int) -> Any:
    store = SQLiteStore(tmp_path / "mqserver.sqlite3", sync=sync)
    yield store.open()
    modes = yield store.run_thd(lambda conn: (
        conn.execute("PRAGMA journal_mode").fetchone()[0],
        conn.execute("PRAGMA synchronous").fetchone()[0],
        conn.execute("PRAGMA locking_mode").fetchone()[0],
    ))
    yield store.close()
    assert modes == ("wal", level, "exclusive")


def test_unknown_sync_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="full, normal"):
        SQLiteStore(tmp_path / "x.sqlite3", sync="off")


@pytest_twisted.inlineCallbacks
def test_group_commit_one_transaction_per_batch_off_the_reactor_thread(tmp_path: Path) -> Any:
    """A turn's 1,000 publishes are one batch, one transaction, run in the store thread."""
    store = SQLiteStore(tmp_path / "mqserver.sqlite3")
    clock = Clock()
    broker = Broker(store, clock)
    broker.load((yield store.open()))
    statements: list[tuple[int, str]] = []
    yield store.run_thd(lambda conn: conn.set_trace_callback(
        lambda sql: statements.append((threading.get_ident(), sql))
    ))
    for n in range(1000):
        broker.publish_to_queue(b"q", b"m%d" % n, b"body")
    done = broker.durable()
    clock.advance(0)
    yield done
    yield store.run_thd(lambda conn: conn.set_trace_callback(None))
    commits = [sql for _, sql in statements if sql.strip().upper() == "COMMIT"]
    assert len(commits) == 1
    assert store.transactions == 1 and store.last_batch_ops == 1001  # declare + 1,000
    assert broker.writer.batches == 1
    assert threading.get_ident() not in {ident for ident, _ in statements}
    recovered = yield _reopened(store)
    assert len(recovered.queues[b"q"].messages) == 1000


@pytest_twisted.inlineCallbacks
def _reopened(store: SQLiteStore) -> Any:
    yield store.close()
    again = SQLiteStore(store.path)
    recovered = yield again.open()
    yield again.close()
    return recovered


@pytest_twisted.inlineCallbacks
def test_a_failing_batch_is_rolled_back_whole(tmp_path: Path) -> Any:
    store = SQLiteStore(tmp_path / "mqserver.sqlite3")
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])
    broken = message(3)
    broken.body = None  # type: ignore[assignment]  # NOT NULL fails after message 2 went in
    with pytest.raises(sqlite3.IntegrityError):
        yield store.apply([(ENQUEUE, message(2)), (ENQUEUE, broken)])
    yield store.apply([(ENQUEUE, message(4))])  # the store goes on
    recovered = yield _reopened(store)
    assert [m.seq for m in recovered.queues[b"q"].messages] == [1, 4]


@pytest_twisted.inlineCallbacks
def test_commit_time_is_published_for_metrics(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite3")
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions())])
    metrics = store.metrics()
    yield store.close()
    assert metrics["commits_total"] == 1
    assert metrics["commit_seconds_total"] >= metrics["last_commit_seconds"] > 0


# -- the clean-shutdown snapshot -------------------------------------------------


@pytest_twisted.inlineCallbacks
def closed_clean(path: Path) -> Any:
    """A database with two messages, closed with a snapshot; what it recovered."""
    store = SQLiteStore(path)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1)),
                       (ENQUEUE, message(2))])
    yield store.close()
    store = SQLiteStore(path)
    recovered = yield store.open()
    assert (yield store.close_clean(recovered))
    return recovered


@pytest_twisted.inlineCallbacks
def test_a_clean_close_is_started_from_once(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    yield closed_clean(path)
    store = SQLiteStore(path)
    recovered = yield store.open()
    # the mark went before the open fired: a crash from now on replays
    marks = yield store.run_thd(
        lambda conn: conn.execute("SELECT * FROM meta WHERE key = 'snapshot'").fetchall())
    assert store.from_snapshot and marks == []
    yield store.close()
    assert not store.snapshot_path.exists()
    store = SQLiteStore(path)
    again = yield store.open()
    yield store.close()
    assert not store.from_snapshot
    assert [m.seq for m in again.queues[b"q"].messages] == \
        [m.seq for m in recovered.queues[b"q"].messages] == [1, 2]


OPENED_WITH = """
import sys
from twisted.internet.task import Clock
from mqserver.storage.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1], reactor=Clock())
store._open_thd()
print(store.from_snapshot, "sqlite_utils" in sys.modules)
"""


@pytest_twisted.inlineCallbacks
def test_a_start_on_a_current_schema_leaves_sqlite_utils_unimported(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    yield closed_clean(path)
    run = subprocess.run([sys.executable, "-c", OPENED_WITH, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "False"]
    # a replay (no snapshot now: the open above used it) reads plain sqlite3 too
    run = subprocess.run([sys.executable, "-c", OPENED_WITH, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert run.stdout.split() == ["False", "False"], run.stderr[-3000:]


@pytest_twisted.inlineCallbacks
def test_a_write_after_the_clean_close_makes_the_snapshot_stale(tmp_path: Path) -> Any:
    """An older release (which keeps the mark) or a hand edit: the files changed."""
    path = tmp_path / "mqserver.sqlite3"
    yield closed_clean(path)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM messages WHERE seq = 1")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    recovered = yield store.open()
    yield store.close()
    assert not store.from_snapshot and not store.snapshot_path.exists()
    assert [m.seq for m in recovered.queues[b"q"].messages] == [2]


@pytest_twisted.inlineCallbacks
def test_a_snapshot_without_the_mark_is_not_used(tmp_path: Path) -> Any:
    path = tmp_path / "mqserver.sqlite3"
    yield closed_clean(path)
    kept = (tmp_path / "mqserver.snapshot").read_bytes()
    store = SQLiteStore(path)
    yield store.open()  # uses it, and clears the mark
    yield store.apply([(ENQUEUE, message(3))])
    yield store.close()
    (tmp_path / "mqserver.snapshot").write_bytes(kept)  # an old copy put back
    store = SQLiteStore(path)
    recovered = yield store.open()
    yield store.close()
    assert not store.from_snapshot
    assert [m.seq for m in recovered.queues[b"q"].messages] == [1, 2, 3]


@pytest_twisted.inlineCallbacks
def test_a_replay_packs_each_queues_rows_in_order_and_logs_its_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: list[str]) -> Any:
    # chunks of 4: q1 alone fills two whole reads (each packed from its
    # columns), then reads of both queues are dealt to each queue's rows
    monkeypatch.setattr(Backlog, "chunk_size", 4)
    path = tmp_path / "mqserver.sqlite3"
    store = SQLiteStore(path)
    yield store.open()
    q1 = list(range(1, 9)) + list(range(10, 22, 2)) + [22, 23]
    yield store.apply([(ENQUEUE, message(seq, queue=b"q2" if seq not in q1 else b"q1",
                                          headers={"n": str(seq)} if seq % 5 == 0 else None))
                       for seq in range(1, 24)])
    yield store.close()
    store = SQLiteStore(path)
    recovered = yield store.open()
    yield store.close()
    assert not store.from_snapshot
    ones, twos = recovered.queues[b"q1"].messages, recovered.queues[b"q2"].messages
    assert [m.seq for m in ones] == q1 and [m.id for m in ones] == [b"m%d" % s for s in q1]
    assert [m.seq for m in twos] == [9, 11, 13, 15, 17, 19, 21]
    assert [m.headers for m in ones if m.seq % 5 == 0] == [{"n": "5"}, {"n": "10"},
                                                           {"n": "20"}]
    assert len(ones.chunks) == 4 and len(ones.tail) == 0
    assert len(twos.chunks) == 1 and len(twos.tail) == 3
    assert recovered.next_seq == 24
    assert any(f"SQLite {path}: 2 queues, 23 messages recovered in " in line
               and line.endswith(" s (replay)") for line in logged), logged


@pytest.mark.parametrize("odd", [{}, {"retry": 1}, {"expires_at": 5000.0},
                                 {"headers": {"h": "1"}}, {"event": b"other"}, {"source": None}])
@pytest_twisted.inlineCallbacks
def test_plain_rows_are_read_in_five_columns_and_any_other_in_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: dict[str, Any]) -> Any:
    # one event and source, no headers, expiry or retries: the other five
    # columns are filled in; one message otherwise makes the read take all
    monkeypatch.setattr(Backlog, "chunk_size", 4)
    sent = [message(seq, queue=b"q%d" % (seq % 2), event=b"e", source="mqks")
            for seq in range(1, 14)]
    for name, value in odd.items():
        setattr(sent[6], name, value)
    path = tmp_path / "mqserver.sqlite3"
    store = SQLiteStore(path)
    yield store.open()
    yield store.apply([(ENQUEUE, m) for m in sent])
    yield store.close()
    store = SQLiteStore(path)
    recovered = yield store.open()
    plain = yield store.run_thd(lambda conn: RowShape(conn).plain)
    yield store.close()
    assert plain == (not odd)
    for name in (b"q0", b"q1"):
        assert list(recovered.queues[name].messages) == [m for m in sent if m.queue == name]
