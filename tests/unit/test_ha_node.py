"""The node's roles (``mqserver.ha.node.HANode``) on a fake clock.

The database side (claim, lease, fenced store) is tested against a real
PostgreSQL in test_ha_claim.py and, with real processes, in
tests/integration/test_ha_*.py; here its parts are stand-ins that the test
drives, so every order of events can be made to happen.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock

from mqserver.ha.claim import Claimed, HASettings
from mqserver.ha.node import HANode


class Claimant:
    def __init__(self) -> None:
        self.attempts: list[Deferred] = []
        self.last_seen = {"node": "other"}
        self.closed = False

    def attempt(self) -> Deferred:
        d: Deferred = Deferred()
        self.attempts.append(d)
        return d

    def close(self) -> Deferred:
        self.closed = True
        return succeed(None)


class Lease:
    made: list[Lease] = []

    def __init__(self, dsn: str, settings: HASettings, reactor: Any, lost: Any) -> None:
        self.lost = lost
        self.started: tuple[int, int] | None = None
        self.stopped: list[bool] = []
        self.is_stale = False
        Lease.made.append(self)

    def start(self, pid: int, key: int) -> None:
        self.started = (pid, key)

    def stale(self) -> bool:
        return self.is_stale

    def stop(self, release: bool = False) -> Deferred:
        self.stopped.append(release)
        return succeed(None)


class Service:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.ready: Deferred = Deferred()
        self.exit_on_start_failure = True
        self.listen_after: Deferred | None = None
        self.abandoning: Deferred = Deferred()

    def startService(self) -> None:
        self.log.append("recovering")

    def abandon(self, reason: str) -> Deferred:
        self.log.append(f"abandon: {reason}")
        return self.abandoning

    def stopService(self) -> Deferred:
        self.log.append("graceful stop")
        return succeed(None)


class Store:
    def __init__(self) -> None:
        self.adopted: Any = None
        self.session_lost: Any = None

    def adopt(self, conn: Any) -> None:
        self.adopted = conn


def claimed(handover: float = 0.0) -> Claimed:
    conn = SimpleNamespace(info=SimpleNamespace(backend_pid=42), close=lambda: None)
    return Claimed(conn, 7, handover, "other")  # type: ignore[arg-type]


def node() -> tuple[HANode, MemoryReactorClock, Claimant, list[Service], list[str], Any]:
    reactor, claimant, services, log = MemoryReactorClock(), Claimant(), [], []
    stores: list[Store] = []
    site = Factory()  # the broker's HTTP site

    def build_active(store: Store) -> tuple[Service, list[Any]]:
        stores.append(store)
        services.append(Service(log))
        return services[-1], [site]

    Lease.made.clear()
    ha = HANode("dsn", HASettings("me", lease=3.0, renew=1.0, poll=0.5), reactor, Store,
                build_active, claimant=claimant, lease=Lease)
    ha.switch()
    ha.startService()
    return ha, reactor, claimant, services, log, site


def promote(ha: HANode, reactor: MemoryReactorClock, claimant: Claimant,
            services: list[Service], handover: float = 0.0) -> Service:
    claimant.attempts[-1].callback(claimed(handover))
    assert ha.state == "promoting"
    reactor.advance(handover)
    service = services[-1]
    assert service.listen_after is not None and service.listen_after.called
    return service


def test_a_standby_polls_and_stays_standby_while_another_holds_the_claim() -> None:
    ha, reactor, claimant, services, _, _ = node()
    assert len(claimant.attempts) == 1 and ha.state == "standby"
    claimant.attempts[0].callback(None)
    reactor.advance(0.5)
    assert len(claimant.attempts) == 2 and not services
    assert ha.health()["active"] == {"node": "other"}
    assert ha.switches[0].current is not None and ha.promotions == 0


def test_an_unreachable_database_is_reported_and_tried_again() -> None:
    ha, reactor, claimant, _, _, _ = node()
    claimant.attempts[0].errback(ConnectionRefusedError("refused"))
    assert ha.last_error is not None and "refused" in ha.last_error and ha.state == "standby"
    reactor.advance(0.5)
    assert len(claimant.attempts) == 2


def test_promotion_recovers_at_once_and_serves_after_the_old_lease() -> None:
    ha, reactor, claimant, services, log, site = node()
    standby_site = ha.switches[0].current
    claimant.attempts[0].callback(claimed(handover=2.0))
    service = services[0]
    assert log == ["recovering"] and not service.exit_on_start_failure
    assert Lease.made[0].started == (42, 7)
    reactor.advance(1.9)
    assert not service.listen_after.called  # what is left of the old lease
    reactor.advance(0.1)
    assert service.listen_after.called
    service.ready.callback(None)
    assert ha.state == "active" and ha.promotions == 1
    assert ha.switches[0].current is site and standby_site is not site
    reactor.advance(5)
    assert len(claimant.attempts) == 1  # an active does not compete


def test_an_active_with_a_stale_lease_answers_new_http_connections_as_fenced() -> None:
    """Woken from a stop, its waiting connections run before the lease timer demotes it."""
    ha, reactor, claimant, services, _log, site = node()
    service = promote(ha, reactor, claimant, services)
    service.ready.callback(None)
    site.protocol = Protocol
    assert ha.switches[0].buildProtocol(None).factory is site
    assert ha.health()["status"] == "active"
    Lease.made[0].is_stale = True
    assert ha.switches[0].buildProtocol(None).factory is ha._standby
    assert ha.health()["status"] == "fenced" and ha.state == "active"


def test_losing_the_session_switches_http_to_standby_before_anything_else() -> None:
    ha, reactor, claimant, services, log, _ = node()
    service = promote(ha, reactor, claimant, services)
    service.ready.callback(None)
    standby = ha._standby
    Lease.made[0].lost("the store's database session is gone")
    assert ha.switches[0].current is standby and ha.state == "demoting"
    assert log[-1].startswith("abandon: this node is no longer active")
    assert Lease.made[0].stopped == [False]
    service.abandoning.callback(None)
    assert ha.state == "standby" and ha.demotions == 1 and ha.active is None
    reactor.advance(0.5)
    assert len(claimant.attempts) == 2  # competes again


def test_a_loss_during_recovery_demotes_once_recovery_is_done() -> None:
    ha, reactor, claimant, services, _, site = node()
    service = promote(ha, reactor, claimant, services)
    Lease.made[0].lost("no lease renewal succeeded for 2 s")
    assert ha.state == "promoting"
    service.ready.callback(None)
    assert ha.switches[0].current is not site and ha.state == "demoting"
    service.abandoning.callback(None)
    assert ha.state == "standby" and ha.promotions == 0 and ha.demotions == 1


def test_a_failed_recovery_goes_back_to_standby() -> None:
    ha, reactor, claimant, services, _, _ = node()
    service = promote(ha, reactor, claimant, services)
    service.ready.errback(ConnectionResetError("session lost during recovery"))
    service.abandoning.callback(None)
    assert ha.state == "standby" and "recovery failed" in ha.last_error


def test_stopping_an_active_node_stops_gracefully_and_releases_the_lease() -> None:
    ha, reactor, claimant, services, log, _ = node()
    service = promote(ha, reactor, claimant, services)
    service.ready.callback(None)
    stopped = ha.stopService()
    assert stopped.called and log[-1] == "graceful stop"
    assert Lease.made[0].stopped == [True] and claimant.closed


def test_stopping_while_promoting_waits_for_recovery_and_never_serves() -> None:
    ha, reactor, claimant, services, log, site = node()
    service = promote(ha, reactor, claimant, services)
    stopped = ha.stopService()
    assert not stopped.called
    service.ready.callback(None)
    assert stopped.called and log[-1] == "graceful stop"
    assert ha.switches[0].current is not site
    assert Lease.made[0].stopped == [False]
