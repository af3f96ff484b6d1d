# -*- test-case-name: tests.unit.test_storage_postgres -*-
"""The PostgreSQL backend (``--storage=postgres``, ``--postgres-dsn``).

Design, and why:

- **One session, owned by one dedicated thread** (``StoreThread``, as the
  SQLite store).  psycopg calls block, so none runs on the reactor thread;
  and every write of this store goes through that one connection, which
  holds the store's claim, a session advisory lock: a second mqserver on the
  same database and schema fails at start ("in use"), and a server whose
  session died cannot write until it has the lock again.  Functions that
  run in the thread are ``*_thd``.
- **One transaction per ``apply`` batch** (group commit), written with a
  handful of set-wide statements whatever the batch's length
  (``postgres_batch``): new messages by binary ``COPY``, deletes by
  ranges of consecutive seqs and ``seq = ANY(array)`` for the rest,
  upserts through a temporary staging table.  Ops are
  encoded on the reactor thread before the hand-off, because the broker keeps
  mutating its ``Message`` objects after ``apply`` returns.
- **Idempotent**: a failed batch is sent again, and its first try may have
  committed (the answer to ``COMMIT`` can be lost with the connection).  A
  ``COPY`` that meets an existing seq fails with a unique violation; the
  batch is then run again at once with every row upserted.
- **Reconnects on the next batch**: a broken connection fails the batch in
  flight (the broker's ``StoreWriter`` keeps it and retries, confirming
  nothing meanwhile); the retry connects again, takes the lock again, and
  writes.  A server that cannot get the lock back fails every batch.
  Except when **fenced** (active/standby, ``mqserver.ha``): the store then
  runs on a session that already holds the claim (``adopt``), and a lost
  session is never replaced: every later batch fails and ``session_lost``
  is called, because another node may hold the claim by now.
- **Versioned schema**: ``schema/postgres-v1.sql`` creates version 1 and
  ``schema/postgres-vN-to-vM.sql`` files upgrade one step each, all in one
  transaction at open, as for SQLite; a database from a newer release is
  refused.
- **Recovery streams**: ``open()`` reads the messages with ``COPY ... TO
  STDOUT (FORMAT BINARY)`` in seq order, row by row, not as one result set
  held twice in memory.

Durability is PostgreSQL's: a batch is confirmed when ``COMMIT`` returns,
which with ``synchronous_commit=on`` (the server's default) means the WAL is
flushed (and, with ``synchronous_standby_names``, on the synchronous
replica).  The store logs the session's setting at open and warns when it
is ``off``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqserver.interfaces import IMessageStore
from mqserver.model import Message, QueueOptions, Recovered, RecoveredQueue
from mqserver.packed import packing_queue, share_recovered_values
from mqserver.storage.errors import SessionLostError, StoreClosedError, StoreLockedError
from mqserver.storage.postgres_batch import (
    MESSAGE_COLUMNS,
    MESSAGE_TYPES,
    EncodedBatch,
    MessageWrites,
    Statements,
    encode_batch,
    seq_runs,
)
from mqserver.storage.postgres_schema import upgrade_thd
from mqserver.storage.worker import StoreThread

log = Logger()

_COLUMNS = ", ".join(MESSAGE_COLUMNS)
_COPY_IN = f"COPY messages ({_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_STAGE = "mqserver_message_stage"
_CREATE_STAGE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGE} (LIKE messages) ON COMMIT DELETE ROWS"
)
_COPY_STAGE = f"COPY {_STAGE} ({_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_UPSERT_STAGED = (
    f"INSERT INTO messages ({_COLUMNS}) SELECT {_COLUMNS} FROM {_STAGE} "
    "ON CONFLICT (seq) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in MESSAGE_COLUMNS[1:])
)
_CLEAR_STAGE = f"DELETE FROM {_STAGE}"
_DELETE_MESSAGES = "DELETE FROM messages WHERE seq = ANY(%s)"
_DELETE_RUNS = (
    "DELETE FROM messages m USING unnest(%s::int8[], %s::int8[]) AS r(first, last) "
    "WHERE m.seq BETWEEN r.first AND r.last"
)
_NEXT_SEQ = "UPDATE meta SET value = GREATEST(value, %s) WHERE key = 'next_seq'"
_COPY_OUT = (
    f"COPY (SELECT {_COLUMNS} FROM messages ORDER BY seq) TO STDOUT (FORMAT BINARY)"
)
# JIT compiling (10 ms and more) pays off for long analytic queries, never
# for these: but the planner's row estimate for the range delete grows with
# the table, and past jit_above_cost a delete of a few hundred ranges in a
# table of millions would be compiled
_NO_JIT = "SET jit = off"
# the store's claim: one lock per database and schema, so that servers in
# different schemas of one database do not exclude each other
LOCK_KEY = "SELECT hashtextextended('mqserver:' || current_schema(), 0)"
_LOCK = "SELECT pg_advisory_lock(%s)"
# libpq parameters a DSN may override.  The keepalives and the TCP user
# timeout bound how long a batch can hang on a database host that vanished
# (no FIN, no RST) to about 30 s, instead of the kernel's two hours: the
# batch then fails like any other lost session.
DEFAULT_PARAMS = {
    "application_name": "mqserver", "connect_timeout": "10",
    "keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
    "keepalives_count": "3", "tcp_user_timeout": "30000",
}


@implementer(IMessageStore)
class PostgresStore:
    """``IMessageStore`` in a PostgreSQL database; see the module docstring."""

    durable = True

    def __init__(self, dsn: str, reactor: Any = None, lock_wait: float = 10.0) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.dsn = dsn
        self.lock_wait = lock_wait
        self._thread = StoreThread(reactor, "mqserver-postgres")
        self._conn: psycopg.Connection[Any] | None = None  # used in the store thread only
        self.is_open = False
        self.transactions = 0  # committed apply batches, for tests and stats
        self.reconnects = 0
        self.upsert_retries = 0  # batches run again with upserts after a unique violation
        self.commit_seconds = 0.0
        self.last_commit_seconds = 0.0
        self.last_batch_ops = 0
        # fenced mode (mqserver.ha): the session handed to ``adopt``, used once
        self.fenced = False
        self._adopted: psycopg.Connection[Any] | None = None
        self.session_lost: Any = None  # called once with a reason, on the reactor thread

    def adopt(self, conn: psycopg.Connection[Any]) -> None:
        """Run on ``conn``, a session that holds the claim already, and never on another.

        Called before ``open``; from then on a lost session fails every
        batch (``SessionLostError``) and calls ``session_lost`` once.
        """
        self.fenced = True
        self._adopted = conn

    # -- reactor side -------------------------------------------------------

    def open(self) -> Deferred[Recovered]:
        def opened(result: tuple[Recovered, list[str], list[str]]) -> Recovered:
            recovered, notes, warnings = result
            for note in notes:
                log.info("{text}", text=note)
            for warning in warnings:
                log.warn("{text}", text=warning)
            self.is_open = True
            return recovered

        return self._thread.start_with(self._open_thd).addCallback(opened)

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        if not self.is_open:
            return fail(StoreClosedError("apply() on a closed PostgreSQL store"))
        try:
            batch = encode_batch(ops)
        except Exception:
            return fail()
        self.last_batch_ops = len(ops)
        d = self._thread.run(self._apply_thd, batch)
        d.addCallbacks(self._committed, self._apply_failed)
        return d

    def _apply_failed(self, failure: Failure) -> Failure:
        # in fenced mode a dropped session is never replaced (see adopt)
        if self.fenced and self._conn is None and self.session_lost is not None:
            lost, self.session_lost = self.session_lost, None
            lost(f"the store's database session is gone: {failure.getErrorMessage()}")
        return failure

    def _committed(self, _: None) -> None:
        self.transactions += 1

    def metrics(self) -> dict[str, float]:
        """Published by ``/health`` and ``/metrics`` (as ``mqserver_store_*``)."""
        return {
            "commits_total": self.transactions,
            "commit_seconds_total": self.commit_seconds,
            "last_commit_seconds": self.last_commit_seconds,
            "reconnects_total": self.reconnects,
        }

    def close(self) -> Deferred[None]:
        self.is_open = False
        return self._thread.stop_after(self._close_thd)

    def run_thd(self, function: Any, *args: Any) -> Deferred[Any]:
        """Run ``function(connection, *args)`` in the store thread (tests, maintenance)."""
        return self._thread.run(lambda: function(self._session_thd(), *args))

    # -- store thread -------------------------------------------------------

    def _connect_thd(self) -> psycopg.Connection[Any]:
        """A new session holding the store's lock."""
        if self.fenced:
            conn, self._adopted = self._adopted, None
            if conn is None or conn.closed or conn.broken:
                raise SessionLostError("the database session holding the claim is gone; "
                                       "this node is no longer active")
            conn.execute(_NO_JIT)
            return conn
        params = dict(DEFAULT_PARAMS)
        params.update(psycopg.conninfo.conninfo_to_dict(self.dsn))
        conn = psycopg.connect(**params, autocommit=True)
        try:
            key = conn.execute(LOCK_KEY).fetchone()[0]  # type: ignore[index]
            # a session that just went away (our own previous run, closed or
            # killed) may hold it for a few more milliseconds: wait, bounded
            conn.execute("SELECT set_config('lock_timeout', %s, false)",
                         (f"{max(1, int(self.lock_wait * 1000))}ms",))  # 0 would wait forever
            try:
                conn.execute(_LOCK, (key,))
            except psycopg.errors.LockNotAvailable:
                schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
                raise StoreLockedError(
                    f"database {conn.info.dbname!r} (schema {schema!r}) is in use by another "
                    f"process (another mqserver?): its session has held the advisory lock "
                    f"{key} for {self.lock_wait:g} s"
                ) from None
            conn.execute("RESET lock_timeout")
            conn.execute(_NO_JIT)
        except BaseException:
            conn.close()
            raise
        return conn

    def _session_thd(self) -> psycopg.Connection[Any]:
        """The store's session, connected (and locked) again if it was lost."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._drop_session_thd()
        conn = self._connect_thd()
        if self.is_open:
            self.reconnects += 1
        self._conn = conn
        return conn

    def _drop_session_thd(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _open_thd(self) -> tuple[Recovered, list[str], list[str]]:
        """What the store holds, and lines for the reactor to log (info, warnings)."""
        conn = self._connect_thd()
        try:
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
            notes = [f"PostgreSQL store: {conn.info.host}:{conn.info.port}/{conn.info.dbname}, "
                     f"server {conn.info.server_version}, synchronous_commit={sync}"]
            warnings = [] if sync != "off" else [
                "synchronous_commit=off: a confirm does not wait for the WAL flush, so a "
                "crash of the database server may lose confirmed messages"
            ]
            upgraded = upgrade_thd(conn)
            if upgraded:
                notes.append(upgraded)
            recovered = self._load_thd(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return recovered, notes, warnings

    def _load_thd(self, conn: psycopg.Connection[Any]) -> Recovered:
        recovered = Recovered()
        queues = recovered.queues
        queue = packing_queue(queues)

        with conn.transaction(), conn.cursor(binary=True) as cur:
            # one snapshot for every read: nothing else writes while we hold
            # the lock, but a consistent read costs nothing
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute(
                "SELECT name, delete_when_unused, delete_when_unused_bare, dead_letter, "
                "max_length, default_ttl, overflow FROM queues"
            )
            for name, *options in cur:
                queue(name).options = QueueOptions(*options)
            cur.execute("SELECT queue, event FROM bindings")
            for name, event in cur:
                queue(name).bindings.add(event)
            next_seq = 1
            current: RecoveredQueue | None = None
            with cur.copy(_COPY_OUT) as copy:
                copy.set_types(list(MESSAGE_TYPES))
                for seq, name, mid, body, event, headers, created, expires, retry, source in (
                    copy.rows()
                ):
                    if current is None or current.name != name:
                        current = queue(name)
                    current.messages.append(Message(
                        mid, name, body, seq, event,
                        None if headers is None else json.loads(headers),
                        created, expires, retry, source,
                    ))
                    next_seq = seq + 1
            cur.execute("SELECT namespace, key, value FROM records")
            for namespace, key, value in cur:
                recovered.records.setdefault(namespace, {})[key] = value
            cur.execute("SELECT value FROM meta WHERE key = 'next_seq'")
            stored = cur.fetchone()
        recovered.next_seq = max(next_seq, stored[0] if stored else 1)
        share_recovered_values(queues.values())
        return recovered

    def _apply_thd(self, batch: EncodedBatch) -> None:
        try:
            conn = self._session_thd()
            try:
                self._transaction_thd(conn, batch, upsert_all=False)
            except psycopg.errors.UniqueViolation:
                # an earlier try of this batch committed after all (see the
                # module docstring): the same batch again, as upserts
                self.upsert_retries += 1
                self._transaction_thd(conn, batch, upsert_all=True)
        except psycopg.OperationalError:
            # the session is gone or unusable: the next batch starts a new one
            self._drop_session_thd()
            raise

    def _transaction_thd(self, conn: psycopg.Connection[Any], batch: EncodedBatch,
                         upsert_all: bool) -> None:
        with conn.cursor(binary=True) as cur:
            cur.execute("BEGIN")
            try:
                for step in batch.steps:
                    if isinstance(step, MessageWrites):
                        self._write_messages_thd(cur, step, upsert_all)
                    else:
                        self._run_statements_thd(cur, step)
                if batch.next_seq:
                    cur.execute(_NEXT_SEQ, (batch.next_seq,))
                started = time.perf_counter()
                cur.execute("COMMIT")
                self.last_commit_seconds = time.perf_counter() - started
                self.commit_seconds += self.last_commit_seconds
            except BaseException:
                if not conn.closed and not conn.broken:
                    conn.execute("ROLLBACK")
                raise

    @staticmethod
    def _write_messages_thd(cur: psycopg.Cursor[Any], step: MessageWrites,
                            upsert_all: bool) -> None:
        if step.deletes:
            singles, starts, ends = seq_runs(step.deletes)
            if starts:
                cur.execute(_DELETE_RUNS, (starts, ends))
            if singles:
                cur.execute(_DELETE_MESSAGES, (singles,))
        inserts, upserts = step.inserts, step.upserts
        if upsert_all:
            inserts, upserts = [], step.rows_to_upsert()
        if inserts:
            _copy_rows(cur, _COPY_IN, inserts)
        if upserts:
            # made when first needed (most sessions never upsert), in the
            # transaction: a rollback takes it away again, and IF NOT EXISTS
            # makes it again
            cur.execute(_CREATE_STAGE)
            _copy_rows(cur, _COPY_STAGE, upserts)
            cur.execute(_UPSERT_STAGED)
            # emptied now, not at commit: a later step of this batch (after a
            # delete_queue) must not upsert these rows again
            cur.execute(_CLEAR_STAGE)

    @staticmethod
    def _run_statements_thd(cur: psycopg.Cursor[Any], step: Statements) -> None:
        for statement, rows in step.runs:
            cur.executemany(statement, rows)

    def _close_thd(self) -> None:
        self._drop_session_thd()


def _copy_rows(cur: psycopg.Cursor[Any], statement: str, rows: list[tuple[Any, ...]]) -> None:
    with cur.copy(statement) as copy:
        copy.set_types(list(MESSAGE_TYPES))
        for row in rows:
            copy.write_row(row)
