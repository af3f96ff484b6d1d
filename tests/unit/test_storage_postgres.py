"""The PostgreSQL backend: the storage contract, then what only PostgreSQL has.

Every test module gets a cluster of its own (``postgres_cluster`` in
tests/conftest.py) and every test a fresh database on it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_twisted

from mqserver.model import DECLARE, DELETE_QUEUE, ENQUEUE, REMOVE, REQUEUE, QueueOptions
from mqserver.storage.errors import StoreLockedError
from mqserver.storage.postgres import PostgresStore
from mqserver.testing import StoreContract, message


class TestPostgresStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, postgres_dsn: str) -> None:
        self.dsn = postgres_dsn
        self.schemas: dict[Path, str] = {}

    def make_store(self, path: Path) -> PostgresStore:
        """A store in a schema of its own per path: what a directory is to a file store
        (some contract tests, and the durability machine, use several paths)."""
        if path not in self.schemas:
            name = "s_" + hashlib.sha1(str(path).encode()).hexdigest()[:16]
            query(self.dsn, f"CREATE SCHEMA {name}")
            self.schemas[path] = f"{self.dsn} options=-csearch_path={name}"
        return PostgresStore(self.schemas[path])


def query(dsn: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params or None)
        return cursor.fetchall() if cursor.description else []


def threads_of(store: PostgresStore) -> Any:
    """Which thread runs the store's statements (the reactor's must never)."""
    import threading

    return store.run_thd(lambda conn: threading.current_thread().name)


@pytest_twisted.inlineCallbacks
def test_one_transaction_per_batch_off_the_reactor_thread(postgres_dsn: str) -> Any:
    """1,000 publishes and 500 acks in one batch: one commit, one xid on every row."""
    store = PostgresStore(postgres_dsn)
    yield store.open()
    ops: list[tuple[Any, ...]] = [(DECLARE, b"q", QueueOptions())]
    ops += [(ENQUEUE, message(n)) for n in range(1, 1001)]
    ops += [(REMOVE, b"q", n) for n in range(1, 1001, 2)]
    yield store.apply(ops)
    assert "mqserver-postgres" in (yield threads_of(store))
    yield store.close()
    assert store.transactions == 1 and store.metrics()["commits_total"] == 1
    [(rows, xids)] = query(postgres_dsn, "SELECT count(*), count(DISTINCT xmin::text) FROM messages")
    assert (rows, xids) == (500, 1)


@pytest_twisted.inlineCallbacks
def test_acks_in_runs_delete_those_seqs_and_no_other(postgres_dsn: str) -> Any:
    """A run of acked seqs is deleted as one range: the seqs around and
    between the runs, not acked, stay; so do the unacked ones among singles."""
    store = PostgresStore(postgres_dsn)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()),
                       *[(ENQUEUE, message(n)) for n in range(1, 101)]])
    acked = [*range(10, 40), *range(41, 70), 80, 82, 84]
    yield store.apply([(REMOVE, b"q", n) for n in reversed(acked)])
    # and the planner's estimate for many ranges in a big table never makes it compile them
    assert (yield store.run_thd(lambda conn: conn.execute("SHOW jit").fetchone()[0])) == "off"
    yield store.close()
    left = [seq for (seq,) in query(postgres_dsn, "SELECT seq FROM messages ORDER BY seq")]
    assert left == [n for n in range(1, 101) if n not in acked]


@pytest_twisted.inlineCallbacks
def test_a_batch_applied_twice_leaves_the_same_state(postgres_dsn: str) -> Any:
    """The broker re-sends a failed batch, whose first try may have committed after all."""
    store = PostgresStore(postgres_dsn)
    yield store.open()
    batch = [(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1)), (ENQUEUE, message(2)),
             (REQUEUE, message(1, retry=1), 1), (REMOVE, b"q", 2), (ENQUEUE, message(3))]
    yield store.apply(batch)
    yield store.apply([*batch, (ENQUEUE, message(4))])
    assert store.upsert_retries == 1  # the COPY met seq 3, then the batch ran as upserts
    store = PostgresStore(postgres_dsn)
    recovered = yield store.open()
    yield store.close()
    assert [(m.seq, m.retry) for m in recovered.queues[b"q"].messages] == [(1, 1), (3, 0), (4, 0)]


@pytest_twisted.inlineCallbacks
def test_rows_upserted_before_a_queue_drop_are_not_written_after_it(postgres_dsn: str) -> Any:
    """delete_queue is a barrier: the staging table is emptied between the two halves."""
    store = PostgresStore(postgres_dsn)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])
    yield store.apply([
        (REQUEUE, message(1, retry=1), 1), (DELETE_QUEUE, b"q"),
        (DECLARE, b"q", QueueOptions()), (ENQUEUE, message(2)), (REQUEUE, message(2, retry=3), 2),
    ])
    store = PostgresStore(postgres_dsn)
    recovered = yield store.open()
    yield store.close()
    assert [(m.seq, m.retry) for m in recovered.queues[b"q"].messages] == [(2, 3)]


@pytest_twisted.inlineCallbacks
def test_any_header_text_survives(postgres_dsn: str) -> Any:
    """NUL and lone surrogates (JSON escapes allow both) must not fail a batch forever."""
    odd = message(1, headers={"nul": "a\x00b", "lone": "\ud800", "ü\u2603": "ß"})
    store = PostgresStore(postgres_dsn)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, odd)])
    yield store.close()
    store = PostgresStore(postgres_dsn)
    recovered = yield store.open()
    yield store.close()
    assert recovered.queues[b"q"].messages == [odd]


@pytest_twisted.inlineCallbacks
def test_a_second_server_on_the_same_schema_is_refused(postgres_dsn: str) -> Any:
    first = PostgresStore(postgres_dsn)
    yield first.open()
    second = PostgresStore(postgres_dsn, lock_wait=0.2)
    with pytest.raises(StoreLockedError, match="in use by another process"):
        yield second.open()
    # another schema of the same database is another store
    query(postgres_dsn, "CREATE SCHEMA other")
    third = PostgresStore(postgres_dsn + " options=-csearch_path=other", lock_wait=0.2)
    recovered = yield third.open()
    assert recovered.queues == {}
    yield third.close()
    yield first.close()
    # the lock goes with the session
    again = PostgresStore(postgres_dsn, lock_wait=5)
    yield again.open()
    yield again.close()


def terminate_store_sessions(dsn: str) -> int:
    [(count,)] = query(dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = 'mqserver'")
    return int(count)


@pytest_twisted.inlineCallbacks
def test_a_lost_session_fails_one_batch_and_the_next_reconnects(postgres_dsn: str) -> Any:
    store = PostgresStore(postgres_dsn)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])
    assert terminate_store_sessions(postgres_dsn) == 1
    with pytest.raises(psycopg.OperationalError):
        yield store.apply([(ENQUEUE, message(2))])
    yield store.apply([(ENQUEUE, message(2)), (ENQUEUE, message(3))])
    assert store.reconnects == 1
    yield store.close()
    store = PostgresStore(postgres_dsn)
    recovered = yield store.open()
    yield store.close()
    assert [m.seq for m in recovered.queues[b"q"].messages] == [1, 2, 3]


@pytest_twisted.inlineCallbacks
def test_a_store_that_lost_its_lock_writes_nothing(postgres_dsn: str) -> Any:
    """Fencing: once its session is gone, another holder of the lock keeps it from writing."""
    store = PostgresStore(postgres_dsn, lock_wait=0.2)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])
    terminate_store_sessions(postgres_dsn)
    usurper = PostgresStore(postgres_dsn)
    yield usurper.open()
    with pytest.raises(psycopg.OperationalError):
        yield store.apply([(ENQUEUE, message(2))])
    with pytest.raises(StoreLockedError):
        yield store.apply([(ENQUEUE, message(2))])
    yield usurper.close()
    yield store.apply([(ENQUEUE, message(2))])
    yield store.close()
    [(seqs,)] = query(postgres_dsn, "SELECT array_agg(seq ORDER BY seq) FROM messages")
    assert seqs == [1, 2]


@pytest_twisted.inlineCallbacks
def test_commit_time_and_settings_are_reported(postgres_dsn: str) -> Any:
    from twisted.logger import capturedLogs

    store = PostgresStore(postgres_dsn)
    with capturedLogs() as events:
        yield store.open()
    text = " ".join(e.get("text", "") for e in events)
    assert "synchronous_commit=on" in text and "schema created at version 1" in text
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])
    yield store.close()
    store = PostgresStore(postgres_dsn + " options=-csynchronous_commit=off")
    with capturedLogs() as events:
        yield store.open()
    assert any("may lose confirmed messages" in e.get("text", "") and
               e["log_level"].name == "warn" for e in events)
    yield store.apply([(ENQUEUE, message(2))])
    metrics = store.metrics()
    assert metrics["commit_seconds_total"] > 0 and metrics["commits_total"] == 1
    assert metrics["last_commit_seconds"] == pytest.approx(metrics["commit_seconds_total"])
    yield store.close()
