"""The claim (``mqserver.ha.claim``) against a real PostgreSQL server.

Two claimants compete for one database; the lease row decides when a silent
holder may be terminated; the lease notices a writer session that lost the
lock; a fenced store never reconnects.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater

from mqserver.ha.claim import Claimant, HASettings, Lease, split_key
from mqserver.model import ENQUEUE, Message
from mqserver.storage.errors import SessionLostError
from mqserver.storage.postgres import PostgresStore

FAST = {"lease": 1.5, "renew": 0.5, "poll": 0.1}


def test_settings_refuse_a_lease_shorter_than_three_renewals() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        HASettings("n", lease=1.0, renew=0.5)
    assert HASettings("n").handover == 2.0


def test_split_key_matches_pg_locks_halves() -> None:
    assert split_key(-1) == (0xFFFF_FFFF, 0xFFFF_FFFF)
    assert split_key((7 << 32) | 9) == (7, 9)


@pytest_twisted.inlineCallbacks
def test_one_claimant_wins_and_a_silent_one_is_terminated_after_its_lease(
    postgres_dsn: str,
) -> Any:
    first = Claimant(postgres_dsn, HASettings("a", **FAST), reactor)
    second = Claimant(postgres_dsn, HASettings("b", **FAST), reactor)
    try:
        won = yield first.attempt()
        assert won is not None and won.previous is None and won.handover == 0.0
        assert (yield second.attempt()) is None  # held, lease still valid
        assert second.last_seen["node"] == "a" and second.last_seen["lease_valid"]
        assert second.terminated == 0
        # nobody renews: the lease runs out, the holder is terminated
        yield deferLater(reactor, 1.7, lambda: None)
        assert (yield second.attempt()) is None
        assert second.terminated == 1
        with pytest.raises(psycopg.OperationalError):
            won.conn.execute("SELECT 1")
        taken = yield second.attempt()
        assert taken is not None and taken.previous == "a"
        assert taken.handover == 0.0  # the previous lease had run out
        taken.conn.close()
    finally:
        yield first.close()
        yield second.close()


@pytest_twisted.inlineCallbacks
def test_a_holder_without_a_lease_row_is_never_terminated(postgres_dsn: str) -> Any:
    """A plain ``--storage=postgres`` server (no ``--ha``) holds the lock with no lease."""
    plain = PostgresStore(postgres_dsn)
    yield plain.open()
    claimant = Claimant(postgres_dsn, HASettings("b", **FAST), reactor)
    try:
        assert (yield claimant.attempt()) is None
        assert (yield claimant.attempt()) is None
        assert claimant.terminated == 0
    finally:
        yield claimant.close()
        yield plain.close()


@pytest_twisted.inlineCallbacks
def test_lease_renews_and_reports_a_lost_writer_session(postgres_dsn: str) -> Any:
    claimant = Claimant(postgres_dsn, HASettings("a", **FAST), reactor)
    won = yield claimant.attempt()
    reasons: list[str] = []
    lease = Lease(postgres_dsn, HASettings("a", **FAST), reactor, reasons.append)
    lease.start(won.conn.info.backend_pid, won.key)
    try:
        yield deferLater(reactor, 1.2, lambda: None)
        assert lease.renewals >= 1 and not reasons
        won.conn.close()  # the writer session ends: the lock frees
        yield deferLater(reactor, 0.7, lambda: None)
        assert reasons == ["the store's database session no longer holds the claim"]
    finally:
        yield lease.stop()
        yield claimant.close()


def test_lease_gives_up_when_no_renewal_succeeds_in_time() -> None:
    """Counted from the send time of the last success, on the node's own clock."""
    clock = Clock()
    reasons: list[str] = []
    lease = Lease("host=127.0.0.1 port=1", HASettings("a", **FAST), clock, reasons.append,
                  monotonic=clock.seconds)
    lease.valid_since = clock.seconds()
    lease._renewing = True  # a renewal hangs (network cut): no answer, no error
    lease._loop.clock = clock
    lease._loop.start(0.5, now=False)
    clock.advance(0.5)
    assert not reasons
    clock.pump([0.5, 0.5])
    assert reasons == ["no lease renewal succeeded for 1 s"]
    assert not lease._loop.running


@pytest_twisted.inlineCallbacks
def test_fenced_store_never_reconnects_and_reports_the_loss(
    postgres_cluster: Any, postgres_dsn: str,
) -> Any:
    claimant = Claimant(postgres_dsn, HASettings("a", **FAST), reactor)
    won = yield claimant.attempt()
    store = PostgresStore(postgres_dsn)
    store.adopt(won.conn)
    losses: list[str] = []
    store.session_lost = losses.append
    try:
        yield store.open()
        message = Message(b"m1", b"q", b"body", 1)
        yield store.apply([(ENQUEUE, message)])
        postgres_cluster.restart("immediate")
        for _ in range(2):  # the first fails on the dead session, the next refuses to connect
            with pytest.raises((psycopg.OperationalError, SessionLostError)):
                yield store.apply([(ENQUEUE, Message(b"m2", b"q", b"body", 2))])
        assert len(losses) == 1 and "session is gone" in losses[0]
        assert store.reconnects == 0
    finally:
        yield store.close()
        yield claimant.close()


@pytest_twisted.inlineCallbacks
def test_a_released_lease_lets_the_next_active_serve_without_waiting(postgres_dsn: str) -> Any:
    first = Claimant(postgres_dsn, HASettings("a", **FAST), reactor)
    second = Claimant(postgres_dsn, HASettings("b", **FAST), reactor)
    won = yield first.attempt()
    lease = Lease(postgres_dsn, HASettings("a", **FAST), reactor, lambda reason: None)
    lease.start(won.conn.info.backend_pid, won.key)
    try:
        won.conn.close()  # a clean stop closes the store first...
        yield lease.stop(release=True)  # ...then ends the lease
        taken = yield second.attempt()
        assert taken is not None and taken.previous == "a" and taken.handover == 0.0
        taken.conn.close()
    finally:
        yield first.close()
        yield second.close()


@pytest_twisted.inlineCallbacks
def test_a_database_restart_ends_the_lease_at_the_next_renewal(
    postgres_cluster: Any, postgres_dsn: str,
) -> Any:
    """The renewal's own idle connection is dead too: it connects again at once."""
    claimant = Claimant(postgres_dsn, HASettings("a", **FAST), reactor)
    won = yield claimant.attempt()
    reasons: list[str] = []
    lease = Lease(postgres_dsn, HASettings("a", **FAST), reactor, reasons.append)
    lease.start(won.conn.info.backend_pid, won.key)
    try:
        yield deferLater(reactor, 0.7, lambda: None)
        assert lease.renewals >= 1
        postgres_cluster.restart("immediate")
        yield deferLater(reactor, 0.6, lambda: None)  # one renewal interval, and a bit
        assert reasons == ["the store's database session no longer holds the claim"]
    finally:
        yield lease.stop()
        yield claimant.close()
