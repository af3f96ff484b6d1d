# -*- test-case-name: tests.unit.test_ha_claim -*-
"""The active node's claim on the database: an advisory lock plus a lease row.

Why both:

- **The lock fences.**  The claim is the PostgreSQL store's own session
  advisory lock (``mqserver.storage.postgres``, one per database and
  schema), taken with ``pg_try_advisory_lock`` on the connection that then
  becomes the store's only session.  Every write of the active goes through
  that session, so a node whose session ended (killed, terminated, database
  restarted, network cut) cannot commit anything, whatever it believes.  A
  ``kill -9`` ends the session at once: the lock frees, and the next poll of
  a standby takes it.
- **The lease detects the silent.**  A hung or stopped process, or a
  vanished machine whose TCP connection nobody closed, keeps its session and
  its lock.  So the active renews a lease row (``mqserver_lease``: the
  writer session's backend pid, a deadline in the *database's* clock) every
  ``renew`` seconds from a second connection, and a standby that finds the
  lock holder's lease expired calls ``pg_terminate_backend`` on that
  session, then takes the lock.  One clock (the database's) judges expiry,
  so the nodes' clocks do not matter.
- **The active fences itself first.**  It counts its lease from when it
  *sent* the last successful renewal, which is before the database stamped
  the deadline, and gives up the role when ``lease - renew`` seconds have
  passed without one (``Lease``): it stops serving before any standby may
  take over.  A renewal also checks that the writer session still holds the
  lock, so a database restart under an idle active is noticed within one
  ``renew`` interval.

The lease table lives outside the versioned schema on purpose: standbys read
it before any node has opened (or upgraded) the store, and a node holding
the lock creates it if missing (``CREATE TABLE IF NOT EXISTS``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.storage.postgres import DEFAULT_PARAMS, LOCK_KEY
from mqserver.storage.worker import StoreThread

log = Logger()

_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
_CREATE_LEASE = (
    "CREATE TABLE IF NOT EXISTS mqserver_lease ("
    "id int PRIMARY KEY DEFAULT 1 CHECK (id = 1), pid int NOT NULL, node text NOT NULL, "
    "http text NOT NULL, acquired_at timestamptz NOT NULL, deadline timestamptz NOT NULL)"
)
_WRITE_LEASE = (
    "INSERT INTO mqserver_lease (id, pid, node, http, acquired_at, deadline) "
    "VALUES (1, pg_backend_pid(), %s, %s, clock_timestamp(), "
    "clock_timestamp() + make_interval(secs => %s)) "
    "ON CONFLICT (id) DO UPDATE SET pid = EXCLUDED.pid, node = EXCLUDED.node, "
    "http = EXCLUDED.http, acquired_at = EXCLUDED.acquired_at, deadline = EXCLUDED.deadline"
)
# the holder of our lock, and whether its lease ran out (NULL: it has no
# lease row, e.g. an mqserver without --ha, which is never terminated)
_HOLDER = (
    "SELECT l.pid, (SELECT s.deadline < clock_timestamp() FROM mqserver_lease s "
    "WHERE s.id = 1 AND s.pid = l.pid), (SELECT s.node FROM mqserver_lease s "
    "WHERE s.id = 1 AND s.pid = l.pid) "
    "FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = %s AND l.objid = %s"
)
_HOLDER_NO_LEASE = (
    "SELECT l.pid, NULL::boolean, NULL::text FROM pg_locks l WHERE l.locktype = 'advisory' "
    "AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = %s AND l.objid = %s"
)
_TERMINATE = "SELECT pg_terminate_backend(%s, %s)"
# renewed only while the writer session still holds the lock
_RENEW = (
    "UPDATE mqserver_lease SET deadline = clock_timestamp() + make_interval(secs => %s) "
    "WHERE id = 1 AND pid = %s AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = %s "
    "AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.classid = %s AND l.objid = %s)"
)
# a clean stop: the next active need not wait for what is left of our lease
_RELEASE = "UPDATE mqserver_lease SET deadline = clock_timestamp() WHERE id = 1 AND pid = %s"
_ACTIVE_NODE = "SELECT node, http, pid, deadline > clock_timestamp() FROM mqserver_lease"
# how long the previous holder's lease still runs, if it was another session's
_PREVIOUS_LEASE = (
    "SELECT GREATEST(0, extract(epoch FROM deadline - clock_timestamp()))::float8, node "
    "FROM mqserver_lease WHERE id = 1 AND pid <> pg_backend_pid()"
)


@dataclass(frozen=True)
class Claimed:
    """A won claim: the session holding the lock, and how long to wait before serving.

    ``handover`` is the previous holder's lease time left, capped at
    ``HASettings.handover``: a previous active whose session ended while its
    process lives on (database restart, network cut) notices at its next
    renewal, which finds our lease row, and must have stopped serving first.
    """

    conn: psycopg.Connection[Any]
    key: int
    handover: float
    previous: str | None


@dataclass(frozen=True)
class HASettings:
    """``--ha-*`` options; see docs/ha.md for what each bounds."""

    node: str
    http: str = ""  # what the lease row shows operators, e.g. the node's /health address
    lease: float = 5.0
    renew: float = 1.0
    poll: float = 0.5
    keepalive: float = 2.0

    @property
    def handover(self) -> float:
        """Longest wait of a new active for a live previous one to notice (two renewals)."""
        return 2 * self.renew

    def __post_init__(self) -> None:
        if self.renew <= 0 or self.poll <= 0 or self.lease < 3 * self.renew:
            raise ValueError("--ha-lease must be at least 3 x --ha-renew, both positive, "
                             "and --ha-poll positive")

    def connect_params(self) -> dict[str, str]:
        """libpq parameters that end a silently dead TCP connection in bounded time.

        ``tcp_user_timeout`` fails a write the peer does not acknowledge, and
        keepalives an idle connection whose peer is gone; both within about
        one lease, so a network cut to the database ends the session (and the
        role) even when nothing is being written.
        """
        idle = max(1, int(self.keepalive))
        return {
            **DEFAULT_PARAMS,
            "connect_timeout": str(max(2, int(self.lease))),
            "keepalives": "1", "keepalives_idle": str(idle), "keepalives_interval": str(idle),
            "keepalives_count": "3", "tcp_user_timeout": str(int(self.lease * 1000)),
        }


def split_key(key: int) -> tuple[int, int]:
    """A bigint advisory key as ``pg_locks`` shows it: (classid, objid), unsigned 32-bit halves."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def connect(dsn: str, settings: HASettings) -> psycopg.Connection[Any]:
    params = settings.connect_params()
    params.update(psycopg.conninfo.conninfo_to_dict(dsn))
    return psycopg.connect(**params, autocommit=True)


def lock_key(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute(LOCK_KEY).fetchone()[0])  # type: ignore[index]


def active_node(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The lease row (who is or was active), or None if no node ever was."""
    if conn.execute("SELECT to_regclass('mqserver_lease')").fetchone()[0] is None:  # type: ignore[index]
        return None
    row = conn.execute(_ACTIVE_NODE).fetchone()
    if row is None:
        return None
    return {"node": row[0], "http": row[1], "backend_pid": row[2], "lease_valid": bool(row[3])}


class Claimant:
    """A standby's attempts to take the claim, one per poll, in a thread of its own.

    Keeps one candidate connection between attempts; the one that wins the
    lock is handed to the store (``PostgresStore.adopt``) and never used here
    again.
    """

    def __init__(self, dsn: str, settings: HASettings, reactor: Any) -> None:
        self.dsn = dsn
        self.settings = settings
        self._thread = StoreThread(reactor, "mqserver-ha-claim")
        self._conn: psycopg.Connection[Any] | None = None  # claim thread only
        self.terminated = 0  # silent actives this node terminated
        self.last_seen: dict[str, Any] | None = None  # the lease row at the last attempt

    def attempt(self) -> Deferred[Claimed | None]:
        """The claim (a session holding the lock, lease written), or None while another has it."""
        if not self._thread.running:
            self._thread.start()
        return self._thread.run(self._attempt_thd)

    def close(self) -> Deferred[None]:
        return self._thread.stop_after(self._close_thd)

    def _close_thd(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _attempt_thd(self) -> Claimed | None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._close_thd()
            conn = self._conn = connect(self.dsn, self.settings)
        try:
            key = lock_key(conn)
            if conn.execute(_TRY_LOCK, (key,)).fetchone()[0]:  # type: ignore[index]
                self._conn = None
                handover, previous = self._write_lease_thd(conn)
                return Claimed(conn, key, handover, previous)
            self.last_seen = active_node(conn)
            self._take_over_silent_thd(conn, key)
        except psycopg.OperationalError:
            self._close_thd()
            raise
        return None

    def _write_lease_thd(self, conn: psycopg.Connection[Any]) -> tuple[float, str | None]:
        """Write our lease; how long the previous holder's lease still ran, and its node."""
        s = self.settings
        try:
            conn.execute(_CREATE_LEASE)
            previous = conn.execute(_PREVIOUS_LEASE).fetchone()
            conn.execute(_WRITE_LEASE, (s.node, s.http, s.lease))
            # a transaction of the active left open by a hung process would
            # hold row locks; the server ends one idle for longer than a lease
            conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                         (f"{int(s.lease * 1000)}ms",))
        except BaseException:
            conn.close()
            raise
        if previous is None:
            return 0.0, None
        return min(float(previous[0]), s.handover), previous[1]

    def _take_over_silent_thd(self, conn: psycopg.Connection[Any], key: int) -> None:
        """Terminate the lock holder's session if its lease ran out (it is hung or gone)."""
        classid, objid = split_key(key)
        has_lease = conn.execute("SELECT to_regclass('mqserver_lease')").fetchone()[0]  # type: ignore[index]
        row = conn.execute(_HOLDER if has_lease else _HOLDER_NO_LEASE,
                           (classid, objid)).fetchone()
        if row is None or not row[1]:
            return
        pid, _, node = row
        log.warn("the active node {node!r} let its lease run out (hung, stopped or cut off): "
                 "terminating its database session (backend {pid}) to take over",
                 node=node, pid=pid)
        # waits (bounded) for the backend to be gone, so the next poll gets the lock
        conn.execute(_TERMINATE, (pid, int(self.settings.lease * 1000)))
        self.terminated += 1


class Lease:
    """The active's lease: renewed every ``renew`` s from a connection of its own.

    ``lost(reason)`` is called once, on the reactor thread, when the writer
    session no longer holds the lock (renewal updated no row) or when no
    renewal succeeded for ``lease - renew`` seconds (see the module
    docstring).  Renewing from a second connection keeps the lease alive
    while the store's session is busy with a long batch or the recovery.
    """

    def __init__(self, dsn: str, settings: HASettings, reactor: Any,
                 lost: Callable[[str], None], monotonic: Callable[[], float] = time.monotonic
                 ) -> None:
        self.dsn = dsn
        self.settings = settings
        self._lost = lost
        self._monotonic = monotonic
        self._thread = StoreThread(reactor, "mqserver-ha-lease")
        self._loop = LoopingCall(self._tick)
        self._loop.clock = reactor
        self._conn: psycopg.Connection[Any] | None = None  # lease thread only
        self._writer_pid = 0
        self._key = (0, 0)
        self._renewing = False
        self.valid_since = 0.0  # monotonic send time of the last successful renewal
        self.renewals = 0

    def start(self, writer_pid: int, key: int) -> None:
        self._writer_pid = writer_pid
        self._key = split_key(key)
        self.valid_since = self._monotonic()
        self._thread.start()
        self._loop.start(self.settings.renew, now=False)

    def stop(self, release: bool = False) -> Deferred[None]:
        """Stop renewing; ``release``: also end the lease now (a clean stop, the store closed)."""
        if self._loop.running:
            self._loop.stop()
        self._lost = _ignore
        if release and self._thread.running:
            self._thread.run(self._release_thd).addErrback(
                lambda f: log.warn("could not release the lease: {e}", e=f.getErrorMessage()))
        return self._thread.stop_after(self._close_thd)

    def _release_thd(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._close_thd()
            conn = self._conn = connect(self.dsn, self.settings)
        conn.execute(_RELEASE, (self._writer_pid,))

    def stale(self) -> bool:
        """True once no renewal succeeded for ``lease - renew`` s (e.g. after a SIGSTOP)."""
        s = self.settings
        return self._monotonic() - self.valid_since > s.lease - s.renew

    def _tick(self) -> None:
        s = self.settings
        if self.stale():
            self._give_up(f"no lease renewal succeeded for {s.lease - s.renew:g} s")
            return
        if self._renewing:
            return
        self._renewing = True
        sent = self._monotonic()
        d = self._thread.run(self._renew_thd)
        d.addCallbacks(self._renewed, self._failed, callbackArgs=(sent,))

    def _renewed(self, still_held: bool, sent: float) -> None:
        self._renewing = False
        if still_held:
            self.valid_since = sent
            self.renewals += 1
        else:
            self._give_up("the store's database session no longer holds the claim")

    def _failed(self, failure: Any) -> None:
        self._renewing = False
        log.warn("lease renewal failed ({e}); the role ends if none succeeds in time",
                 e=failure.getErrorMessage())

    def _give_up(self, reason: str) -> None:
        lost, self._lost = self._lost, _ignore
        if self._loop.running:
            self._loop.stop()
        lost(reason)

    def _renew_thd(self) -> bool:
        try:
            return self._renew_once_thd()
        except psycopg.OperationalError:
            # an idle connection that the server closed (a restart) is found
            # broken only when used: once more on a new one, so that one
            # renewal interval is all it takes to learn the claim is gone
            return self._renew_once_thd()

    def _renew_once_thd(self) -> bool:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._close_thd()
            conn = self._conn = connect(self.dsn, self.settings)
        try:
            cur = conn.execute(_RENEW, (self.settings.lease, self._writer_pid, self._writer_pid,
                                        *self._key))
        except psycopg.OperationalError:
            self._close_thd()
            raise
        return cur.rowcount == 1

    def _close_thd(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _ignore(reason: str) -> None:
    """``Lease.lost`` once it fired or the lease was stopped."""
