"""Dispatch by priority with shared slots (eMQP workers), and retry limits."""

from __future__ import annotations

from mqserver.broker.core import MAX_RETRIES
from mqserver.broker.queue import Slots
from mqserver.model import QueueOptions
from mqserver.testing import RecordingSink


def connect(broker):
    sink = RecordingSink()
    return broker.connection_opened("test", "peer", sink), sink


def test_highest_priority_with_credit_first_round_robin_among_equals(broker, clock):
    low_conn, low = connect(broker)
    a_conn, a = connect(broker)
    b_conn, b = connect(broker)
    broker.consume(low_conn, b"low", b"q", window=10, priority=1)
    broker.consume(a_conn, b"a", b"q", window=2, priority=5)
    broker.consume(b_conn, b"b", b"q", window=2, priority=5)
    for n in range(6):
        broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    clock.advance(0)
    assert a.bodies() == [b"0", b"2"]
    assert b.bodies() == [b"1", b"3"]
    assert low.bodies() == [b"4", b"5"]


def test_shared_slots_span_queues_and_ready_refills(broker, clock):
    conn, sink = connect(broker)
    slots = Slots()
    broker.consume(conn, b"w:a", b"a", priority=10, slots=slots)
    broker.consume(conn, b"w:b", b"b", priority=0, slots=slots)
    broker.publish_to_queue(b"a", b"r1", b"1")
    broker.publish_to_queue(b"b", b"r2", b"2")
    clock.advance(0)
    assert sink.delivered == []  # no READY yet
    broker.add_slots(slots)
    clock.advance(0)
    assert len(sink.delivered) == 1 and slots.free == 0
    broker.add_slots(slots)
    clock.advance(0)
    assert sorted(sink.bodies()) == [b"1", b"2"]


def test_cancel_leaves_the_shared_slots(broker, clock):
    conn, _ = connect(broker)
    slots = Slots(1)
    consumer = broker.consume(conn, b"w", b"q", slots=slots)
    broker.cancel(consumer)
    assert slots.consumers == []


def test_retry_limit_dead_letters_after_too_many_redeliveries(broker, clock):
    broker.declare_queue(b"q", QueueOptions(dead_letter=b"dlq"))
    conn, sink = connect(broker)
    broker.publish_to_queue(b"q", b"job", b"x", headers={MAX_RETRIES: "1"})
    consumer = broker.consume(conn, b"c", b"q")
    clock.advance(0)
    assert broker.reject(consumer, b"job")  # retry 1: allowed
    clock.advance(0)
    broker.cancel(consumer)  # retry 2: over the limit
    assert not broker.queues[b"q"].ready
    dead = broker.queues[b"dlq"].ready[0]
    assert dead.headers["x-dead-letter-reason"] == "retries"
    assert sink.seen == [(b"job", 0), (b"job", 1)]


def test_mixed_queue_switches_to_priority_dispatch(broker, clock):
    plain_conn, plain = connect(broker)
    broker.consume(plain_conn, b"plain", b"q")
    worker_conn, worker = connect(broker)
    broker.consume(worker_conn, b"w", b"q", priority=1, window=1)
    broker.publish_to_queue(b"q", b"m1", b"1")
    broker.publish_to_queue(b"q", b"m2", b"2")
    clock.advance(0)
    assert worker.bodies() == [b"1"] and plain.bodies() == [b"2"]
