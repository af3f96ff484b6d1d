"""Publishing runs: the same as the single publishes they stand for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.broker.overflow import DROP_HEAD, REJECT_PUBLISH, QueueFullError
from mqserver.model import ENQUEUE, QueueOptions
from mqserver.testing import DurableMemoryStore, RecordingSink

QUEUE_OPTIONS = st.builds(
    QueueOptions,
    default_ttl=st.none() | st.just(5.0),
    max_length=st.none() | st.integers(0, 4),
    overflow=st.sampled_from([DROP_HEAD, REJECT_PUBLISH]),
    dead_letter=st.none() | st.just(b"dlq"),
)
ROUTES = {b"one": [b"q0"], b"two": [b"q0", b"q1"], b"none": [], b"new": [b"fresh"]}
RUNS = st.lists(
    st.tuples(
        st.sampled_from(["event", "queue"]),
        st.sampled_from(sorted(ROUTES)),
        st.integers(1, 6),  # messages in the run
        st.none() | st.just({"k": "v"}),
        st.none() | st.just(2.0),
    ),
    max_size=8,
)


def scenario(options, runs, as_runs: bool):
    """Every queue's ready messages, the counters, the refusals and the stored
    ops, after ``runs`` published as runs or one message at a time."""
    clock = Clock()
    store = DurableMemoryStore()
    broker = Broker(store, clock)
    for name, queue_options in zip((b"q0", b"q1"), options, strict=True):
        broker.declare_queue(name, queue_options)
    for event, names in ROUTES.items():
        for name in names:
            broker.bindings.bind(name, event)
    conn = broker.connection_opened("test", "peer", RecordingSink())
    broker.consume(conn, b"c", b"q1", window=1)  # a consumer: the run kicks its queue
    refused = []
    for number, (kind, target, count, headers, ttl) in enumerate(runs):
        entries = [(b"m%d-%d" % (number, n), b"body %d" % n) for n in range(count)]
        name = target if kind == "event" else (ROUTES[target] or [b"direct"])[0]
        try:
            if as_runs and kind == "event":
                broker.publish_event_run(name, entries, headers, ttl, "test")
            elif as_runs:
                broker.publish_to_queue_run(name, entries, headers, ttl, "test")
            else:
                publish = broker.publish_event if kind == "event" else broker.publish_to_queue
                for stored, (message_id, body) in enumerate(entries):
                    try:
                        publish(name, message_id, body, headers, ttl, "test")
                    except QueueFullError as e:
                        e.stored = stored
                        raise
        except QueueFullError as e:
            refused.append((number, e.queue, e.stored))
    clock.advance(0)
    clock.advance(0)
    ready = {
        name: [(m.id, m.body, m.event, m.headers, m.expires_at, m.source, m.retry)
               for m in queue.ready]
        for name, queue in broker.queues.items()
    }
    counters = {
        name: (queue.enqueued, queue.delivered, queue.refused, queue.dead_lettered,
               queue.ttl_ready)
        for name, queue in broker.queues.items()
    }
    enqueued = {}
    for op in store.ops:
        if op[0] == ENQUEUE:
            enqueued.setdefault(op[1].queue, []).append(op[1].id)
    return (ready, counters, refused, enqueued,
            (broker.published, broker.queued, broker.unroutable))


@settings(max_examples=300, deadline=None)
@given(options=st.lists(QUEUE_OPTIONS, min_size=2, max_size=2), runs=RUNS)
def test_a_run_stores_what_its_publishes_one_by_one_store(options, runs):
    """Routes to one queue, two, none and a new one; TTLs, headers, max-length
    with drop-head (and dead-lettering) or reject-publish, a consumer: the
    queues, counters, refusals and stored ops must come out the same."""
    assert scenario(options, runs, as_runs=True) == scenario(options, runs, as_runs=False)


def test_a_refused_run_says_how_many_went_in_before(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=2, overflow=REJECT_PUBLISH))
    with pytest.raises(QueueFullError) as raised:
        broker.publish_to_queue_run(b"q", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")])
    assert raised.value.stored == 2
    assert [m.id for m in broker.queues[b"q"].ready] == [b"a", b"b"]
    assert broker.queues[b"q"].refused == 1


def test_a_run_shares_one_time_and_kicks_its_queue_once(broker, clock):
    clock.advance(100)
    conn = broker.connection_opened("test", "peer", RecordingSink())
    broker.consume(conn, b"c", b"q", window=None)
    broker.publish_to_queue_run(b"q", [(b"a", b"1"), (b"b", b"2")])
    assert len(clock.getDelayedCalls()) == 1  # one pump for the run
    clock.advance(0)
    assert [(m.id, m.created_at) for _, m in conn.sink.delivered] == [(b"a", 100), (b"b", 100)]


@pytest.mark.parametrize("limit", [None, 3])
def test_a_run_that_swaps_a_packed_queue_back_keeps_every_message(broker, limit):
    """``pack_ready`` may swap a queue's ready messages to or from the packed form
    in the middle of a run: the rest of the run must go to the new one (it went
    to the emptied old one and was lost in memory, though stored; issue 17)."""
    from mqserver.broker.ready import CHUNK, PackedReady

    broker.pack_ready_after = 3
    broker.declare_queue(b"q", QueueOptions(max_length=limit))
    broker.publish_to_queue_run(b"q", [(b"p%d" % n, b"") for n in range(CHUNK + 2)])
    assert isinstance(broker.queues[b"q"].ready, PackedReady)
    broker.purge(b"q")
    broker.publish_to_queue(b"q", b"a", b"1")
    broker.publish_to_queue_run(b"q", [(b"b", b"2"), (b"c", b"3"), (b"d", b"4")])
    assert [m.id for m in broker.queues[b"q"].ready] == [b"a", b"b", b"c", b"d"][-(limit or 4):]
