"""BrokerService: start-up order, the TTL sweep on the injected clock, shutdown."""

from __future__ import annotations

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail
from twisted.internet.testing import MemoryReactorClock
from zope.interface import implementer

from mqserver.broker.core import Broker
from mqserver.broker.service import BrokerService
from mqserver.interfaces import (
    ICleanShutdown,
    IClientConnection,
    IDeliverySink,
    IFlowControlled,
)
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


def test_an_open_started_before_the_service_is_awaited_not_repeated():
    log: list[str] = []
    store = SlowStore(log)
    service = BrokerService(Broker(store, MemoryReactorClock()))
    Child(log).setServiceParent(service)
    service.opening = store.open()  # as makeService does under ``twistd -n``
    service.startService()
    assert log == ["open called"] and service.opening is None
    store.opening.callback(None)
    assert log == ["open called", "store open", "child started"]
    assert service.ready.called


class GcCalls:
    """Records what ``BrokerService`` asks of ``gc`` (freezing and thresholds are
    recorded only: they would outlive the test in this process)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def collect(self, *generation: int) -> int:
        self.log.append(f"gc.collect{generation}")
        return 0

    def freeze(self) -> None:
        self.log.append("gc.freeze")

    def set_threshold(self, *thresholds: int) -> None:
        self.log.append("gc.set_threshold")


def test_the_recovered_state_is_frozen_after_a_young_collection_alone(monkeypatch):
    """No full collection on the way to listening (it found next to nothing)."""
    log: list[str] = []
    monkeypatch.setattr("mqserver.broker.service.gc", GcCalls(log))
    store = SlowStore(log)
    service = BrokerService(Broker(store, MemoryReactorClock()), tune_gc=True)
    Child(log).setServiceParent(service)
    service.startService()
    assert log == ["open called"]
    store.opening.callback(None)
    assert log == ["open called", "store open", "gc.collect(0,)", "gc.freeze",
                   "gc.set_threshold", "child started"]


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


class DurableStore(MemoryStore):
    """A memory store the broker treats as durable; each apply is a Deferred we fire."""

    durable = True

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.pending: list[Deferred] = []

    def apply(self, ops):
        d = super().apply(ops)
        waiting: Deferred = Deferred()
        self.pending.append(waiting)
        return waiting.addCallback(lambda _: d)

    def close(self):
        self.log.append("store closed")
        return super().close()


@implementer(IDeliverySink, IClientConnection, IFlowControlled)
class Client:
    """A connection the server may close; it goes away one reactor turn later."""

    def __init__(self, broker: Broker, reactor, log: list[str]) -> None:
        self.broker, self.reactor, self.log = broker, reactor, log
        self.reading = True
        self.connection = broker.connection_opened("test", "peer", self)
        self.delivered: list = []

    def deliver(self, consumer, message) -> None:
        self.delivered.append(message.id)

    def queue_changed(self, consumer) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self, reason: str) -> None:
        self.log.append(f"closed: {reason}")
        self.reactor.callLater(0, self.broker.connection_closed, self.connection)


class Listening(Service):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def stopService(self):
        super().stopService()
        self.log.append("stopped accepting")


def test_stop_accepts_nothing_answers_confirms_then_closes_connections_and_store():
    log: list[str] = []
    reactor = MemoryReactorClock()
    store = DurableStore(log)
    broker = Broker(store, reactor)
    service = BrokerService(broker)
    Listening(log).setServiceParent(service)
    service.startService()
    client = Client(broker, reactor, log)
    consumer = broker.consume(client.connection, b"c", b"q")
    broker.publish_to_queue(b"q", b"m1", b"body")
    broker.durable().addCallback(lambda _: log.append("confirmed"))
    reactor.advance(0)
    assert client.delivered == [b"m1"] and len(store.pending) == 1
    stopped = service.stopService()
    assert log == ["stopped accepting"]
    assert not client.reading  # no more requests are read
    store.pending[0].callback(None)
    assert log == ["stopped accepting", "confirmed", "closed: the server is shutting down"]
    reactor.advance(0)  # the connection goes; its unacked message is requeued (stored)
    assert not consumer.active and [m.id for m in broker.queues[b"q"].ready] == [b"m1"]
    reactor.advance(0.05)  # the service sees it gone; the requeue's op goes out
    assert len(store.pending) == 2 and not stopped.called
    store.pending[1].callback(None)
    assert stopped.called and log[-1] == "store closed"


def test_stop_with_a_failing_store_still_closes_everything():
    log: list[str] = []
    reactor = MemoryReactorClock()
    store = DurableStore(log)
    broker = Broker(store, reactor)
    service = BrokerService(broker)
    service.startService()
    Client(broker, reactor, log)
    broker.publish_to_queue(b"q", b"m1", b"body")
    reactor.advance(0)
    stopped = service.stopService()
    store.pending[0].errback(OSError(28, "No space left on device"))
    reactor.advance(0)
    assert log == ["closed: the server is shutting down"]
    reactor.advance(0.5)  # the last flush waits for one retry, which fails too
    store.pending[1].errback(OSError(28, "No space left on device"))
    assert stopped.called and log == ["closed: the server is shutting down", "store closed"]
    assert broker.writer.failing and not reactor.getDelayedCalls()


def test_abandon_stores_nothing_more_and_closes_everything_at_once():
    """An active that lost its claim (mqserver.ha): no flush, no retry, no confirm."""
    log: list[str] = []
    reactor = MemoryReactorClock()
    store = DurableStore(log)
    broker = Broker(store, reactor)
    service = BrokerService(broker)
    Listening(log).setServiceParent(service)
    service.startService()
    client = Client(broker, reactor, log)
    broker.consume(client.connection, b"c", b"q")
    broker.publish_to_queue(b"q", b"m1", b"body")
    confirms: list[object] = []
    broker.durable().addBoth(confirms.append)
    reactor.advance(0)
    store.pending[0].errback(ConnectionError("session gone"))  # the batch in flight fails
    done = service.abandon("no longer active")
    assert log == ["stopped accepting", "closed: no longer active"]
    reactor.advance(0.05)  # the connection goes; its requeue stores nothing
    assert done.called and log[-1] == "store closed"
    assert len(store.pending) == 1 and not reactor.getDelayedCalls()
    assert len(confirms) == 1 and confirms[0].check(ConnectionError)


def test_listeners_also_wait_for_listen_after():
    """mqserver.ha: recovery runs at once, the listeners wait for the old lease."""
    log: list[str] = []
    reactor = MemoryReactorClock()
    store = SlowStore(log)
    service = BrokerService(Broker(store, reactor))
    Child(log).setServiceParent(service)
    service.listen_after = Deferred()
    service.startService()
    store.opening.callback(None)
    assert log == ["open called", "store open"] and not service.ready.called
    service.listen_after.callback(None)
    assert log[-1] == "child started" and service.ready.called


@implementer(ICleanShutdown)
class CleanStore(DurableStore):
    """A durable store that keeps a snapshot at a clean close (``ICleanShutdown``)."""

    from_snapshot = False
    snapshot_path = None

    def close_clean(self, state):
        self.log.append("store closed with a snapshot")
        self.state = state
        return MemoryStore.close(self).addCallback(lambda _: True)


def _stop_with_one_message(outcome: str, withheld: int = 0) -> tuple[list[str], CleanStore]:
    log: list[str] = []
    reactor = MemoryReactorClock()
    store = CleanStore(log)
    broker = Broker(store, reactor)
    service = BrokerService(broker)
    service.startService()
    broker.withheld = withheld  # as Broker.withhold counts a damaged snapshot chunk
    broker.publish_to_queue(b"q", b"m1", b"body")
    reactor.advance(0)
    stopped = service.stopService()
    if outcome == "stored":
        store.pending[0].callback(None)
    else:
        store.pending[0].errback(OSError(28, "No space left on device"))
        reactor.advance(0.5)
        store.pending[1].errback(OSError(28, "No space left on device"))
    assert stopped.called
    return log, store


def test_a_stop_with_everything_stored_leaves_a_snapshot_of_the_state():
    log, store = _stop_with_one_message("stored")
    assert log == ["store closed with a snapshot"]
    assert [m.id for m in store.state.queues[b"q"].messages] == [b"m1"]


def test_a_stop_with_storage_failing_leaves_no_snapshot():
    log, _ = _stop_with_one_message("failing")
    assert log == ["store closed"]


def test_a_stop_after_withholding_a_damaged_snapshot_chunk_leaves_no_snapshot(logged):
    """The store still holds the withheld messages: a snapshot of what the broker
    holds would lose them, a replay gives them back."""
    log, _ = _stop_with_one_message("stored", withheld=4)
    assert log == ["store closed"]
    assert any("no clean-shutdown snapshot: 4 messages" in line for line in logged)
