# -*- test-case-name: tests.unit.test_storage_sqlite -*-
"""The SQLite backend (``--storage=sqlite``): one file, ``<data-dir>/mqserver.sqlite3``.

Design, and why:

- **One connection in one dedicated thread** (``StoreThread``).  SQLite calls
  block (an fsync per commit with ``synchronous=FULL``), so none runs on the
  reactor thread; and one connection means no "database is locked" between
  our own connections and no lock juggling.  Functions that run in the
  thread are ``*_thd``.
- **One transaction per ``apply`` batch** (group commit): the broker sends
  all ops of a reactor turn as one batch and waits for it, so a burst of
  10,000 publishes costs one commit, not 10,000.  Ops are turned into rows on
  the reactor thread *before* the hand-off, because the broker keeps
  mutating its ``Message`` objects (retry counts, seqs) after ``apply``
  returns.
- **WAL with ``locking_mode=EXCLUSIVE``**: WAL makes a commit one sequential
  append; the exclusive lock, taken at open, makes a second server on the
  same file fail at start instead of both writing to it.
- **Versioned schema**: ``schema/sqlite-v1.sql`` creates version 1, and
  ``schema/sqlite-vN-to-vM.sql`` steps upgrade one version each, in one
  transaction.  A new file runs the same steps, so a fresh database and an
  upgraded one cannot drift apart.
- **sqlite-utils** inspects the tables and runs the schema scripts when a
  database is created or upgraded.  It is imported only then: a start on
  a current schema, from the clean-shutdown snapshot or replaying
  (``sqlite_replay``), needs the stdlib ``sqlite3`` alone, and
  sqlite-utils' import (click, dateutil, pluggy, its regular expressions)
  would be some 40 ms of a 300 ms start.  The per-batch writes call
  ``executemany`` on the connection directly: sqlite-utils' ``insert_all``
  re-inspects the table on every call and, in older releases, commits on its
  own, which would split a batch into several transactions.

``--sqlite-sync``: ``full`` (the default) fsyncs the WAL at every commit, so
what a confirm acknowledged survives a power cut.  ``normal`` fsyncs only at
checkpoints: a process crash loses nothing, but a power cut or OS crash may
roll back the last transactions (the file is never corrupted).
"""

from __future__ import annotations

import json
import sqlite3
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.figures import Figure, figures
from mqserver.interfaces import ICleanShutdown, IMessageStore
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
    Recovered,
)
from mqserver.storage import snapshot, sqlite_snapshot
from mqserver.storage.errors import StoreClosedError, StoreFormatError, StoreLockedError
from mqserver.storage.sqlite_chunks import ChunkReader
from mqserver.storage.sqlite_replay import recover_thd
from mqserver.storage.worker import StoreThread

if TYPE_CHECKING:
    from sqlite_utils import Database

log = Logger()

FILENAME = "mqserver.sqlite3"
SCHEMA_VERSION = 4
SYNC_MODES = {"full": "FULL", "normal": "NORMAL"}

_UPSERT_MESSAGE = (
    "INSERT OR REPLACE INTO messages (seq, queue, id, body, event, headers, created_at, "
    "expires_at, retry, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DELETE_MESSAGE = "DELETE FROM messages WHERE seq = ? AND queue = ?"
_UPSERT_QUEUE = (
    "INSERT OR REPLACE INTO queues (name, delete_when_unused, delete_when_unused_bare, "
    "dead_letter, max_length, default_ttl, overflow) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_BIND = "INSERT OR IGNORE INTO bindings (queue, event) VALUES (?, ?)"
_UNBIND = "DELETE FROM bindings WHERE queue = ? AND event = ?"
_DROP_QUEUE = (
    "DELETE FROM messages WHERE queue = ?",
    "DELETE FROM bindings WHERE queue = ?",
    "DELETE FROM queues WHERE name = ?",
)
_PUT = "INSERT OR REPLACE INTO records (namespace, key, value) VALUES (?, ?, ?)"
_DELETE = "DELETE FROM records WHERE namespace = ? AND key = ?"
_NEXT_SEQ = "UPDATE meta SET value = MAX(value, ?) WHERE key = 'next_seq'"
# a row with an expiry written: a replay looks for them (``sqlite_replay``)
EXPIRING = "UPDATE meta SET value = 1 WHERE key = 'expiring'"

Statements = list[tuple[str, list[tuple[Any, ...]]]]


def schema_script(name: str) -> str:
    """The text of one schema file shipped as package data."""
    return resources.files("mqserver.storage").joinpath("schema", name).read_text("utf-8")


def upgrade_steps(version: int) -> list[str]:
    """Script names that take a database at ``version`` (0: empty) to the latest."""
    steps = ["sqlite-v1.sql"] if version == 0 else []
    for start in range(max(version, 1), SCHEMA_VERSION):
        steps.append(f"sqlite-v{start}-to-v{start + 1}.sql")
    return steps


def message_row(message: Message) -> tuple[Any, ...]:
    headers = message.headers
    # ASCII-escaped JSON: a lone surrogate a client sent still encodes (as
    # text sqlite3 would refuse it, and fail every later batch)
    return (
        message.seq, message.queue, message.id, message.body, message.event,
        None if headers is None else json.dumps(headers),
        message.created_at, message.expires_at, message.retry, message.source,
    )


def encode_ops(ops: list[tuple[Any, ...]]) -> tuple[Statements, int]:
    """Ops as (sql, rows) runs in order, plus the highest seq seen + 1.

    Consecutive ops with the same statement share one ``executemany``; a
    batch that stores a message with an expiry ends with ``EXPIRING``.
    Runs on the reactor thread: this is the snapshot of the broker's objects.
    ENQUEUE and REMOVE, nearly every op of a busy broker, extend the current
    run inline (no call per op); the other ops go through ``add``.
    """
    statements: Statements = []
    next_seq = 0
    expiring = False
    current: str | None = None  # the statement of the last run, whose rows are ``rows``
    rows: list[tuple[Any, ...]] = []

    def add(statement: str, row: tuple[Any, ...]) -> None:
        nonlocal current, rows
        if statement is not current:
            current, rows = statement, []
            statements.append((current, rows))
        rows.append(row)

    for op in ops:
        kind = op[0]
        if kind == ENQUEUE:
            message = op[1]
            if current is not _UPSERT_MESSAGE:
                current, rows = _UPSERT_MESSAGE, []
                statements.append((current, rows))
            rows.append(message_row(message))
            if message.seq >= next_seq:
                next_seq = message.seq + 1
            if message.expires_at is not None:
                expiring = True
        elif kind == REMOVE:
            if current is not _DELETE_MESSAGE:
                current, rows = _DELETE_MESSAGE, []
                statements.append((current, rows))
            rows.append((op[2], op[1]))
        elif kind == REQUEUE:
            message, old_seq = op[1], op[2]
            if old_seq != message.seq:
                add(_DELETE_MESSAGE, (old_seq, message.queue))
            add(_UPSERT_MESSAGE, message_row(message))
            next_seq = max(next_seq, message.seq + 1)
            expiring = expiring or message.expires_at is not None
        elif kind == DECLARE:
            o = op[2]
            add(_UPSERT_QUEUE, (op[1], o.delete_when_unused, int(o.delete_when_unused_bare),
                                o.dead_letter, o.max_length, o.default_ttl, o.overflow))
        elif kind == BIND:
            add(_BIND, (op[1], op[2]))
        elif kind == UNBIND:
            add(_UNBIND, (op[1], op[2]))
        elif kind == DELETE_QUEUE:
            for sql in _DROP_QUEUE:
                add(sql, (op[1],))
        elif kind == PUT:
            add(_PUT, (op[1], op[2], op[3]))
        elif kind == DELETE:
            add(_DELETE, (op[1], op[2]))
        else:
            raise ValueError(f"unknown storage op {kind!r}")
    if expiring:
        statements.append((EXPIRING, [()]))
    return statements, next_seq


def _log_warning(text: str | None) -> None:
    if text:
        log.warn("{text}", text=text)


@implementer(IMessageStore, ICleanShutdown)
class SQLiteStore:
    """``IMessageStore`` on one SQLite file; see the module docstring."""

    durable = True
    # per batch, in an array: none outlives the fill in its arenas (``mqserver.figures``)
    transactions = Figure(int)  # committed apply batches, for tests and stats
    # COMMIT time (the WAL fsync with synchronous=FULL), for /metrics
    commit_seconds = Figure(float)
    last_commit_seconds = Figure(float)
    last_batch_ops = Figure(int)

    def __init__(self, path: str | Path, reactor: Any = None, sync: str = "full") -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"--sqlite-sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.path = Path(path)
        self.sync = sync
        self._thread = StoreThread(reactor, "mqserver-sqlite")
        self._conn: sqlite3.Connection | None = None  # used in the store thread only
        # reads the chunks of a replay left unread at the open (``sqlite_chunks``)
        self._reader: ChunkReader | None = None
        self.is_open = False
        self.figures = figures(SQLiteStore)
        # the clean-shutdown snapshot beside the database file, and whether
        # the last open started from it
        self.snapshot_path = self.path.with_name(snapshot.FILENAME)
        self.from_snapshot = False

    # -- reactor side -------------------------------------------------------

    def open(self) -> Deferred[Recovered]:
        def opened(result: tuple[Recovered, list[str]]) -> Recovered:
            recovered, notes = result
            for text in notes:
                log.info("{text}", text=text)
            self.is_open = True
            self._thread.run(snapshot.discard_after_open, self.snapshot_path).addCallback(
                _log_warning)
            return recovered

        return self._thread.start_with(self._open_thd).addCallback(opened)

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        if not self.is_open:
            return fail(StoreClosedError("apply() on a closed SQLite store"))
        try:
            statements, next_seq = encode_ops(ops)
        except Exception:
            return fail()
        self.last_batch_ops = len(ops)
        d = self._thread.run(self._apply_thd, statements, next_seq)
        d.addCallback(self._committed)
        return d

    def _committed(self, _: None) -> None:
        self.transactions += 1

    def metrics(self) -> dict[str, float]:
        """Published by ``/health`` and ``/metrics`` (as ``mqserver_store_*``)."""
        return {
            "commits_total": self.transactions,
            "commit_seconds_total": self.commit_seconds,
            "last_commit_seconds": self.last_commit_seconds,
        }

    def close(self) -> Deferred[None]:
        self.is_open = False
        return self._thread.stop_after(self._close_thd)

    def close_clean(self, state: Recovered) -> Deferred[bool]:
        """``ICleanShutdown``: close, then leave ``state`` as the snapshot the next
        open starts from (``sqlite_snapshot.save_thd``)."""
        self.is_open = False

        def logged(result: tuple[bool, str]) -> bool:
            saved, text = result
            (log.info if saved else log.error)("{text}", text=text)
            return saved

        def save() -> tuple[bool, str]:
            problem = self._read_all_thd(state)
            if problem is not None:
                self._close_thd()
                return False, f"clean-shutdown snapshot {self.snapshot_path} not written: {problem}"
            return sqlite_snapshot.save_thd(self._connection(), self._close_thd, self.path,
                                            self.snapshot_path, state)

        return self._thread.stop_after(save).addCallback(logged)

    def run_thd(self, function: Any, *args: Any) -> Deferred[Any]:
        """Run ``function(connection, *args)`` in the store thread (tests, maintenance)."""
        return self._thread.run(lambda: function(self._connection(), *args))

    # -- store thread -------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreClosedError("SQLite store is not open")
        return self._conn

    def _open_thd(self) -> tuple[Recovered, list[str]]:
        started = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # before the connection touches anything: what the snapshot must match
        files = sqlite_snapshot.fingerprint(self.path)
        # isolation_level=None: transactions are exactly the BEGIN/COMMIT we
        # issue, never ones the sqlite3 module opens or commits behind us.
        conn = sqlite3.connect(str(self.path), timeout=0.5, isolation_level=None)
        try:
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            try:
                conn.execute("PRAGMA journal_mode=wal")
                conn.execute("BEGIN EXCLUSIVE")
                conn.execute("COMMIT")
            except sqlite3.OperationalError as e:
                if "locked" in str(e):
                    raise StoreLockedError(
                        f"{self.path} is in use by another process (another mqserver?)"
                    ) from e
                raise
            conn.execute(f"PRAGMA synchronous={SYNC_MODES[self.sync]}")
            upgraded = self._upgrade_thd(conn)
            notes = [upgraded] if upgraded else []
            recovered = sqlite_snapshot.take_thd(conn, self.snapshot_path, files, notes)
            self.from_snapshot = recovered is not None
            if recovered is None:
                self._reader = ChunkReader(self._thread, self._connection, self.path)
                recovered = recover_thd(conn, self._reader)
                # what the bench reads as the store's own recovery time
                # (``bench.workloads.reported_recovery``)
                notes.append(f"SQLite {self.path}: {len(recovered.queues)} queues, "
                             f"{snapshot.message_count(recovered)} messages recovered in "
                             f"{time.perf_counter() - started:.3f} s (replay)")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return recovered, notes

    def _upgrade_thd(self, conn: sqlite3.Connection) -> str | None:
        """Bring the schema to SCHEMA_VERSION; returns what it did, for the reactor to log."""
        try:
            version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        except (sqlite3.OperationalError, TypeError):
            version = None  # no such table, or no row in it
        if version == SCHEMA_VERSION:
            return None  # every start but the first and an upgrade's: no sqlite-utils
        db = utils(conn)
        if version is None:
            if db.table_names():
                raise StoreFormatError(f"{self.path} has tables but is not an mqserver database")
            version = 0
        if version > SCHEMA_VERSION:
            raise StoreFormatError(
                f"{self.path} has schema version {version}; this mqserver knows up to "
                f"{SCHEMA_VERSION} (was it written by a newer release?)"
            )
        steps = upgrade_steps(version)
        if not steps:
            return None
        script = "\n".join(schema_script(name) for name in steps)
        try:
            db.executescript("BEGIN IMMEDIATE;\n" + script + "\nCOMMIT;")
        except BaseException:
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            raise
        if version == 0:
            return f"SQLite database {self.path} created at schema version {SCHEMA_VERSION}"
        return (f"SQLite schema of {self.path} upgraded from version {version} to "
                f"{SCHEMA_VERSION} ({', '.join(steps)})")

    def _apply_thd(self, statements: Statements, next_seq: int) -> None:
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            for sql, rows in statements:
                conn.executemany(sql, rows)
            if next_seq:
                conn.execute(_NEXT_SEQ, (next_seq,))
            started = time.perf_counter()
            conn.execute("COMMIT")
            took = time.perf_counter() - started
            self.last_commit_seconds = took
            self.commit_seconds += took
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _read_all_thd(self, state: Recovered | None = None) -> str | None:
        """Read the chunks the open left unread, before the connection goes; what
        is wrong with one of ``state``'s, if one cannot be read (no snapshot then)."""
        if self._reader is not None:
            self._reader.read_all_thd()
        for rq in () if state is None else state.queues.values():
            for chunk in getattr(rq.messages, "chunks", ()):
                problem = chunk.check() if chunk.unchecked else None
                if problem is not None:
                    return f"{chunk.describe()} cannot be read ({problem})"
        return None

    def _close_thd(self) -> None:
        if self._conn is not None:
            self._read_all_thd()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            # fold the WAL back so the file alone is the database
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()


def utils(conn: sqlite3.Connection) -> Database:
    """sqlite-utils on the store's connection, imported now (see the module's docstring)."""
    from sqlite_utils import Database

    # no sqlite-utils plugins on the broker's connection: looking for them
    # reads every installed package's entry points (~20 ms)
    return Database(conn, execute_plugins=False)
