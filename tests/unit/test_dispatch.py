"""Dispatch by priority with shared slots (eMQP workers), deliveries settled on send,
and retry limits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver.broker import core
from mqserver.broker.core import MAX_RETRIES, Broker
from mqserver.broker.dispatch import DELIVERED, HELD, hand_over
from mqserver.broker.queue import Slots
from mqserver.model import DECLARE, ENQUEUE, REMOVE, QueueOptions
from mqserver.storage.memory import MemoryStore
from mqserver.testing import DurableMemoryStore, RecordingSink


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


def test_a_delivery_settled_on_send_is_acked_in_dispatch_without_another_pump(broker, clock):
    conn = broker.connection_opened("test", "peer", RecordingSink(settled_on_send=True))
    consumer = broker.consume(conn, b"c", b"q", window=2)
    for n in range(5):
        broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    clock.advance(0)
    # the window never fills: each delivery is acked as it is handed over
    assert conn.sink.bodies() == [b"0", b"1", b"2", b"3", b"4"]
    assert consumer.unacked == {} and (consumer.delivered, consumer.acked) == (5, 5)
    assert broker.queues[b"q"].acked == 5 and broker.in_flight() == 0
    assert clock.getDelayedCalls() == []  # no kick left a pump behind


def test_settled_on_send_is_removed_from_a_durable_store(clock):
    store = DurableMemoryStore()
    broker = Broker(store, clock)
    conn = broker.connection_opened("test", "peer", RecordingSink(settled_on_send=True))
    broker.consume(conn, b"c", b"q")
    broker.publish_to_queue(b"q", b"m1", b"1")
    clock.advance(0)
    clock.advance(0)
    assert [op[0] for op in store.ops] == [DECLARE, ENQUEUE, REMOVE]
    assert store.ops[-1] == (REMOVE, b"q", store.ops[1][1].seq)


def test_a_sink_that_does_not_settle_leaves_the_ack_to_the_client(broker, clock):
    conn, sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q", window=2)
    for n in range(3):
        broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    clock.advance(0)
    assert sink.bodies() == [b"0", b"1"] and list(consumer.unacked) == [b"m0", b"m1"]


def reference_by_priority(broker, queue, now):
    """Dispatch by priority as it was written first: the best group worked out per message."""
    ready, sent, held = queue.ready, 0, set()
    while ready:
        if sent >= broker.dispatch_batch:
            broker.count_delivered(queue, sent)
            return True
        best, best_priority = [], None
        for consumer in queue.consumers:
            if id(consumer) in held or not consumer.has_credit():
                continue
            if best_priority is None or consumer.priority > best_priority:
                best, best_priority = [consumer], consumer.priority
            elif consumer.priority == best_priority:
                best.append(consumer)
        if not best:
            break
        turn = queue.rr_by_priority.get(best_priority, 0) % len(best)
        queue.rr_by_priority[best_priority] = turn + 1
        outcome = hand_over(broker, queue, best[turn], ready.popleft(), now)
        if outcome == DELIVERED:
            sent += 1
            held.clear()
        elif outcome == HELD:
            held.add(id(best[turn]))
    broker.count_delivered(queue, sent)
    return False


consumer_plans = st.lists(
    st.tuples(
        st.integers(-1, 2),  # priority
        st.none() | st.integers(1, 3),  # window
        st.none() | st.integers(0, 2),  # which shared Slots, if any
        st.booleans(),  # manual ack
        st.booleans(),  # settled on send
    ),
    min_size=1, max_size=5,
)


def dispatch_trace(plans, ids, slot_credit, budget, reference):
    """Who got which message, with ``by_priority`` or the reference in the core."""
    clock = Clock()
    broker = Broker(MemoryStore(), clock, dispatch_batch=budget)
    shared = [Slots(free) for free in slot_credit]
    trace = []
    for n, (priority, window, slots, manual, settles) in enumerate(plans):
        sink = RecordingSink(settled_on_send=settles)
        conn = broker.connection_opened("test", "peer", sink)
        broker.consume(conn, b"c%d" % n, b"q", window=window, manual_ack=manual,
                       priority=priority, slots=None if slots is None else shared[slots])
    for n, message_id in enumerate(ids):
        broker.publish_to_queue(b"q", message_id, b"%d" % n)
    original = core.by_priority
    core.by_priority = reference_by_priority if reference else original
    try:
        for _ in range(3):
            clock.advance(0)
            for consumer in broker.queues[b"q"].consumers:
                trace.extend((consumer.id, m.body) for _, m in consumer.sink.delivered)
                consumer.sink.delivered.clear()
            for slots in shared:
                broker.add_slots(slots, 2)
    finally:
        core.by_priority = original
    return trace, [c.acked for c in broker.queues[b"q"].consumers]


@settings(max_examples=300, deadline=None)
@given(plans=consumer_plans,
       ids=st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), max_size=30),
       slot_credit=st.lists(st.integers(0, 4), min_size=3, max_size=3),
       budget=st.integers(1, 8))
def test_by_priority_hands_out_as_the_per_message_reference_does(plans, ids, slot_credit,
                                                                 budget):
    """The group of best consumers is kept between messages while nothing can
    have changed it; the order must be exactly the per-message pick's, with
    shared slots, windows, repeated ids (held consumers), budgets and
    deliveries settled on send."""
    assert dispatch_trace(plans, ids, slot_credit, budget, reference=False) == \
        dispatch_trace(plans, ids, slot_credit, budget, reference=True)
