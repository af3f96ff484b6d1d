"""Storage faults: no confirm for what was not stored, and no hole once the store heals."""

from __future__ import annotations

import errno
import random
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from mqserver.broker.core import Broker
from mqserver.faults import FaultyStore
from mqserver.interfaces import IMessageStore
from mqserver.storage.sqlite import SQLiteStore
from mqserver.testing import RecordingSink

DISK_FULL = OSError(errno.ENOSPC, "No space left on device")


def test_faulty_store_provides_the_interface(tmp_path: Path) -> None:
    verifyObject(IMessageStore, FaultyStore(SQLiteStore(tmp_path / "db")))


def _errors(d: Any) -> list[Any]:
    errors: list[Any] = []
    d.addErrback(errors.append)
    return errors


@pytest_twisted.inlineCallbacks
def test_a_fault_confirms_nothing_and_healing_leaves_no_hole(tmp_path: Path) -> Any:
    """The broker serves from memory through the fault; the retry stores it all, in order."""
    clock = Clock()
    store = FaultyStore(SQLiteStore(tmp_path / "mqserver.sqlite3"))
    broker = Broker(store, clock)
    broker.load((yield store.open()))
    sink = RecordingSink()
    consumer = broker.consume(broker.connection_opened("test", "peer", sink), b"c", b"q")
    broker.publish_to_queue(b"q", b"m1", b"stored before")
    done = broker.durable()
    clock.advance(0)
    yield done

    store.fail_with(DISK_FULL)
    broker.publish_to_queue(b"q", b"m2", b"during the fault")
    broker.publish_to_queue(b"q", b"m3", b"acked during the fault")
    refused = _errors(broker.durable())
    clock.advance(0)
    assert refused and "No space left" in refused[0].getErrorMessage()
    assert broker.writer.failing and store.refused == 1
    # memory keeps serving: deliveries and acks go on
    assert sink.bodies() == [b"stored before", b"during the fault", b"acked during the fault"]
    assert broker.ack(consumer, b"m3") and broker.ack(consumer, b"m1")
    later = _errors(broker.durable())
    clock.advance(0.5)  # first retry: still failing, and the later waiter hears it
    assert later and store.refused == 2

    store.heal()
    healed = broker.durable()
    clock.advance(1.0)
    yield healed
    assert not broker.writer.failing and broker.writer.last_error is None
    yield store.close()

    reopened = SQLiteStore(tmp_path / "mqserver.sqlite3")
    recovered = yield reopened.open()
    yield reopened.close()
    # m2 is unacked (it comes back ready); m1 and m3 were acked: their
    # removals went out after the enqueues they undo, so neither comes back
    assert [m.id for m in recovered.queues[b"q"].messages] == [b"m2"]


@pytest_twisted.inlineCallbacks
def test_random_faults_leave_the_healed_store_exactly_where_memory_is(tmp_path: Path) -> Any:
    """Seeded random publishes, acks, rejects and faults; then heal, restart, compare."""
    rng = random.Random(7)
    clock = Clock()
    sqlite = SQLiteStore(tmp_path / "mqserver.sqlite3")
    store = FaultyStore(sqlite)
    broker = Broker(store, clock)
    broker.load((yield store.open()))
    consumer = broker.consume(broker.connection_opened("test", "peer", RecordingSink()),
                              b"c", b"q", window=5)
    confirmed: set[bytes] = set()
    acked: set[bytes] = set()
    for step in range(400):
        roll = rng.random()
        if roll < 0.08:
            store.fail_with(DISK_FULL) if store.error is None else store.heal()
        elif roll < 0.6:
            mid = b"m%d" % step
            broker.publish_to_queue(b"q", mid, b"body %d" % step)
            broker.durable().addCallbacks(lambda _, m=mid: confirmed.add(m), lambda _: None)
        elif consumer.unacked:
            mid = rng.choice(list(consumer.unacked))
            if roll < 0.85:
                broker.ack(consumer, mid)
                acked.add(mid)
            else:
                broker.reject(consumer, mid)
        clock.advance(rng.choice([0, 0, 0.5, 1.0]))
        yield sqlite.run_thd(lambda _: None)  # the batch handed to the thread has run
    store.heal()
    while broker.writer.failing or broker.writer.ops:
        clock.advance(1.0)
        yield sqlite.run_thd(lambda _: None)
    assert store.refused > 10 and confirmed and acked
    in_memory = sorted([*broker.queues[b"q"].ready, *consumer.unacked.values()],
                       key=lambda m: m.seq)
    yield store.close()

    reopened = SQLiteStore(tmp_path / "mqserver.sqlite3")
    recovered = yield reopened.open()
    yield reopened.close()
    stored = recovered.queues[b"q"].messages
    assert [(m.id, m.seq, m.retry) for m in stored] == [
        (m.id, m.seq, m.retry) for m in in_memory
    ]
    assert not acked & {m.id for m in stored}
    assert confirmed - acked <= {m.id for m in stored}
