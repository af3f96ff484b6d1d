"""BrokerService: start-up order, the TTL sweep on the injected clock, shutdown."""

from __future__ import annotations

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail
from twisted.internet.testing import MemoryReactorClock

from mqserver.broker.core import Broker
from mqserver.broker.service import BrokerService
from mqserver.storage.memory import MemoryStore


class Child(Service):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def startService(self) -> None:
        super().startService()
        self.log.append("child started")


class SlowStore(MemoryStore):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.opening: Deferred = Deferred()

    def open(self):
        self.log.append("open called")
        d = super().open()
        return self.opening.addCallback(lambda _: d).addCallback(self._opened)

    def _opened(self, recovered):
        self.log.append("store open")
        return recovered


def test_listeners_start_only_after_the_store_is_open():
    log: list[str] = []
    reactor = MemoryReactorClock()
    store = SlowStore(log)
    service = BrokerService(Broker(store, reactor))
    Child(log).setServiceParent(service)
    service.startService()
    assert log == ["open called"]
    store.opening.callback(None)
    assert log == ["open called", "store open", "child started"]
    assert service.ready.called


def test_a_failing_ttl_sweep_is_logged_and_runs_again():
    reactor = MemoryReactorClock()
    broker = Broker(MemoryStore(), reactor)
    service = BrokerService(broker, ttl_interval=1.0)
    calls = []

    def broken() -> int:
        calls.append(reactor.seconds())
        raise RuntimeError("sweep bug")

    broker.expire_due = broken
    service.startService()
    reactor.advance(1)
    reactor.advance(1)
    reactor.advance(1)
    assert len(calls) == 3


def test_expired_messages_are_swept_on_the_clock():
    reactor = MemoryReactorClock()
    broker = Broker(MemoryStore(), reactor)
    service = BrokerService(broker, ttl_interval=1.0)
    service.startService()
    broker.publish_to_queue(b"q", b"m", b"x", ttl=2)
    reactor.advance(1)
    assert len(broker.queues[b"q"].ready) == 1
    reactor.advance(1)
    reactor.advance(1)
    assert len(broker.queues[b"q"].ready) == 0


def test_open_failure_fails_ready_and_stops_with_status_1():
    reactor = MemoryReactorClock()

    class Broken(MemoryStore):
        def open(self):
            return fail(OSError("locked by another server"))

    service = BrokerService(Broker(Broken(), reactor))
    service.startService()
    errors = []
    service.ready.addErrback(errors.append)
    assert errors and "locked" in service.storage_error
    assert reactor.triggers["after"]["shutdown"]  # exit status 1 after shutdown


def test_stop_closes_the_store():
    reactor = MemoryReactorClock()
    store = MemoryStore()
    service = BrokerService(Broker(store, reactor))
    service.startService()
    d = service.stopService()
    assert d.called and not store.is_open
