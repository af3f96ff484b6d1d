"""The queue core on a fake clock: routing, dispatch, settling, lifecycle."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.model import QueueOptions
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink


def connect(broker: Broker, sink: RecordingSink | None = None):
    sink = sink or RecordingSink()
    return broker.connection_opened("test", "127.0.0.1:1", sink), sink


def test_publish_event_copies_to_every_bound_queue(broker, clock):
    broker.reconfigure(b"q1", replace=[b"e1"])
    broker.reconfigure(b"q2", replace=[b"e1", b"e2"])
    assert broker.publish_event(b"e1", b"m1", b"d") == 2
    assert broker.publish_event(b"e2", b"m2", b"d") == 1
    assert broker.publish_event(b"nobody", b"m3", b"d") == 0
    assert [len(broker.queues[q].ready) for q in (b"q1", b"q2")] == [1, 2]
    assert broker.unroutable == 1
    assert broker.queued == 3


def test_mask_bindings_route(broker):
    broker.reconfigure(b"q", replace=[b"user.*.connected", b"*.deleted"])
    for event in (b"user.1.connected", b"user..connected", b"post.deleted"):
        assert broker.publish_event(event, b"m", b"d") == 1, event
    for event in (b"user.1.2.connected", b"user.connected", b"a.b.deleted"):
        assert broker.publish_event(event, b"m", b"d") == 0, event


def test_round_robin_and_fifo(broker, clock):
    conn_a, a = connect(broker)
    conn_b, b = connect(broker)
    broker.consume(conn_a, b"a", b"q", manual_ack=False)
    broker.consume(conn_b, b"b", b"q", manual_ack=False)
    for n in range(6):
        broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    clock.advance(0)
    assert a.bodies() == [b"0", b"2", b"4"]
    assert b.bodies() == [b"1", b"3", b"5"]


def test_queue_buffers_without_consumers(broker, clock):
    broker.publish_to_queue(b"q", b"m1", b"one")
    broker.publish_to_queue(b"q", b"m2", b"two")
    conn, sink = connect(broker)
    broker.consume(conn, b"c", b"q")
    clock.advance(0)
    assert sink.bodies() == [b"one", b"two"]


def test_window_limits_unacked_and_ack_refills(broker, clock):
    conn, sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q", window=2)
    for n in range(5):
        broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    clock.advance(0)
    assert sink.bodies() == [b"0", b"1"]
    assert broker.ack(consumer, b"m0")
    clock.advance(0)
    assert sink.bodies() == [b"0", b"1", b"2"]
    assert not broker.ack(consumer, b"unknown")
    broker.set_window(consumer, 0)
    broker.ack(consumer, b"m1")
    clock.advance(0)
    assert len(sink.delivered) == 3


def test_reject_goes_to_tail_with_retry(broker, clock):
    conn, sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q", window=1)
    broker.publish_to_queue(b"q", b"m1", b"one")
    broker.publish_to_queue(b"q", b"m2", b"two")
    clock.advance(0)
    assert broker.reject(consumer, b"m1")
    clock.advance(0)
    broker.ack(consumer, b"m2")
    clock.advance(0)
    assert sink.seen == [(b"m1", 0), (b"m2", 0), (b"m1", 1)]


def test_cancel_requeues_in_original_order_with_retry(broker, clock):
    conn_a, a = connect(broker)
    broker.publish_to_queue(b"q", b"m1", b"1")
    broker.publish_to_queue(b"q", b"m2", b"2")
    broker.publish_to_queue(b"q", b"m3", b"3")
    consumer = broker.consume(conn_a, b"a", b"q", window=2)
    clock.advance(0)
    assert a.bodies() == [b"1", b"2"]
    broker.connection_closed(conn_a)
    assert not consumer.active
    conn_b, b = connect(broker)
    broker.consume(conn_b, b"b", b"q")
    clock.advance(0)
    assert b.seen == [(b"m1", 1), (b"m2", 1), (b"m3", 0)]


def test_restore_keeps_seq_order_across_consumers(broker, clock):
    conn_a, a = connect(broker)
    conn_b, b = connect(broker)
    for n in range(1, 4):
        broker.publish_to_queue(b"q", b"m%d" % n, b"%d" % n)
    broker.consume(conn_a, b"a", b"q", window=1)
    broker.consume(conn_b, b"b", b"q", window=2)
    clock.advance(0)
    assert a.bodies() == [b"1"] and b.bodies() == [b"2", b"3"]
    broker.connection_closed(conn_b)
    broker.connection_closed(conn_a)
    assert [m.id for m in broker.queues[b"q"].ready] == [b"m1", b"m2", b"m3"]


def test_dead_letter_moves_to_target_or_deletes(broker, clock):
    broker.declare_queue(b"q", QueueOptions(dead_letter=b"dlq"))
    conn, _sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q")
    broker.publish_to_queue(b"q", b"m1", b"one")
    broker.publish_to_queue(b"plain", b"m2", b"two")
    clock.advance(0)
    assert broker.dead_letter(consumer, b"m1", b"rejected")
    moved = broker.queues[b"dlq"].ready[0]
    assert (moved.id, moved.body) == (b"m1", b"one")
    assert moved.headers["x-dead-letter-reason"] == "rejected"
    plain = broker.consume(conn, b"p", b"plain")
    clock.advance(0)
    assert broker.dead_letter(plain, b"m2", b"rejected")
    assert not broker.queues[b"plain"].ready
    assert broker.queues[b"q"].dead_lettered == 1


def test_ttl_expiry_sweep_and_at_delivery(broker, clock):
    broker.publish_to_queue(b"q", b"m1", b"short", ttl=5)
    broker.publish_to_queue(b"q", b"m2", b"forever", ttl=0)
    broker.publish_to_queue(b"q", b"m3", b"long", ttl=50)
    clock.advance(10)
    assert broker.expire_due() == 1
    assert [m.id for m in broker.queues[b"q"].ready] == [b"m2", b"m3"]
    clock.advance(100)
    conn, sink = connect(broker)
    broker.consume(conn, b"c", b"q")
    clock.advance(0)
    assert sink.bodies() == [b"forever"]
    assert broker.queues[b"q"].expired == 2


def test_expired_goes_to_dead_letter_target(broker, clock):
    broker.declare_queue(b"q", QueueOptions(dead_letter=b"dlq", default_ttl=1))
    broker.publish_to_queue(b"q", b"m1", b"x")
    clock.advance(2)
    broker.expire_due()
    assert broker.queues[b"dlq"].ready[0].headers["x-dead-letter-reason"] == "expired"


def test_max_length_drops_oldest(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=2))
    for n in range(4):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    assert [m.id for m in broker.queues[b"q"].ready] == [b"m2", b"m3"]


def test_delete_when_unused_immediately_and_after_delay(broker, clock):
    conn, _sink = connect(broker)
    broker.declare_queue(b"now", QueueOptions(delete_when_unused=0))
    broker.cancel(broker.consume(conn, b"c1", b"now"))
    assert b"now" not in broker.queues
    broker.declare_queue(b"later", QueueOptions(delete_when_unused=5))
    broker.cancel(broker.consume(conn, b"c2", b"later"))
    clock.advance(4)
    broker.consume(conn, b"c3", b"later")
    clock.advance(10)
    assert b"later" in broker.queues
    broker.cancel(conn.consumers[b"c3"])
    clock.advance(5)
    assert b"later" not in broker.queues


def test_delete_queue_tells_and_drops_consumers(broker, clock):
    conn, sink = connect(broker)
    broker.reconfigure(b"q", replace=[b"e"])
    consumer = broker.consume(conn, b"c", b"q")
    broker.publish_event(b"e", b"m", b"x")
    clock.advance(0)
    assert broker.delete_queue(b"q")
    assert sink.updates == [consumer] and not consumer.active
    assert conn.consumers == {}
    assert broker.publish_event(b"e", b"m", b"x") == 0
    assert not broker.delete_queue(b"q")


def test_reconfigure_order_and_masks(broker):
    broker.reconfigure(b"q", replace=[b"e3", b"e4", b"e5.id1.a1", b"e5.id2.a2"])
    broker.reconfigure(b"q", remove=[b"e3"], add=[b"e6", b"e7"])
    broker.reconfigure(b"q", remove_masks=[b"e5.*.a1", b"e5.*.a2"], add=[b"e8"])
    assert broker.bindings.events_of(b"q") == {b"e4", b"e6", b"e7", b"e8"}
    # remove runs before add, whatever the caller's order
    broker.reconfigure(b"q", add=[b"x"], remove=[b"x"])
    assert b"x" in broker.bindings.events_of(b"q")


def test_reconfigure_notifies_others_only_on_change(broker):
    conn, sink = connect(broker)
    a = broker.consume(conn, b"a", b"q")
    b = broker.consume(conn, b"b", b"q")
    assert broker.reconfigure(b"q", replace=[b"e"], notify_except=a)
    assert sink.updates == [b]
    assert not broker.reconfigure(b"q", replace=[b"e"])
    assert sink.updates == [b]


def test_duplicate_id_waits_for_the_first_to_settle(broker, clock):
    conn, sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q")
    broker.publish_to_queue(b"q", b"same", b"1")
    broker.publish_to_queue(b"q", b"same", b"2")
    clock.advance(0)
    assert sink.bodies() == [b"1"]
    broker.ack(consumer, b"same")
    clock.advance(0)
    assert sink.bodies() == [b"1", b"2"]


def test_dispatch_is_bounded_per_turn(clock):
    broker = Broker(MemoryStore(), clock, dispatch_batch=10)
    conn, sink = connect(broker)
    broker.consume(conn, b"c", b"q", manual_ack=False)
    for n in range(25):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    one_turn(clock)
    assert len(sink.delivered) == 10
    one_turn(clock)
    one_turn(clock)
    assert len(sink.delivered) == 25


def one_turn(clock: Clock) -> None:
    """Run the calls due now, not the ones they schedule (as one reactor turn would)."""
    for call in [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]:
        clock.calls.remove(call)
        call.called = True
        call.func(*call.args, **call.kw)


def test_paused_connection_gets_nothing_until_resumed(broker, clock):
    conn, sink = connect(broker)
    broker.consume(conn, b"c", b"q")
    broker.pause(conn)
    broker.publish_to_queue(b"q", b"m", b"x")
    clock.advance(0)
    assert sink.delivered == []
    broker.resume(conn)
    clock.advance(0)
    assert sink.bodies() == [b"x"]


def test_a_failing_sink_does_not_stop_other_queues(broker, clock):
    class Broken(RecordingSink):
        def deliver(self, consumer, message):
            raise RuntimeError("boom")

    bad, _ = connect(broker, Broken())
    good, sink = connect(broker)
    broker.consume(bad, b"bad", b"q1")
    broker.consume(good, b"good", b"q2")
    broker.publish_to_queue(b"q1", b"m", b"x")
    broker.publish_to_queue(b"q2", b"m", b"y")
    clock.advance(0)
    assert sink.bodies() == [b"y"]


@pytest.mark.parametrize("requeue", [True, False])
def test_cancel_without_requeue_drops(broker, clock, requeue):
    conn, _sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q")
    broker.publish_to_queue(b"q", b"m", b"x")
    clock.advance(0)
    broker.cancel(consumer, requeue=requeue)
    assert len(broker.queues[b"q"].ready) == (1 if requeue else 0)


def test_recovered_state_loads(clock):
    store = MemoryStore()
    first = Broker(store, clock)
    store.open()
    from mqserver.model import BIND, DECLARE, ENQUEUE, Message

    store.apply([
        (DECLARE, b"q", QueueOptions(dead_letter=b"d")),
        (BIND, b"q", b"e"),
        (ENQUEUE, Message(b"m1", b"q", b"x", seq=7)),
    ])
    recovered = store.open().result
    first.load(recovered)
    assert first.queues[b"q"].options.dead_letter == b"d"
    assert first.publish_event(b"e", b"m2", b"y") == 1
    assert [m.seq for m in first.queues[b"q"].ready] == [7, 8]


def test_ack_any_settles_whoever_holds_it(broker, clock):
    conn_a, _ = connect(broker)
    conn_b, _ = connect(broker)
    broker.consume(conn_a, b"a", b"q")
    holder = broker.consume(conn_b, b"b", b"q")
    broker.publish_to_queue(b"q", b"m1", b"1")
    broker.publish_to_queue(b"q", b"m2", b"2")
    clock.advance(0)
    assert broker.ack_any(b"q", b"m2")
    assert holder.unacked == {}
    assert not broker.ack_any(b"q", b"m2")
    assert not broker.ack_any(b"nope", b"m1")


class RecordingDurableStore(MemoryStore):
    """A durable store whose batches complete when the test says so."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list] = []
        self.pending: list = []

    def apply(self, ops):
        from twisted.internet.defer import Deferred

        self.batches.append(list(ops))
        d = Deferred()
        self.pending.append(d)
        return d


def test_ops_of_one_turn_reach_a_durable_store_as_one_batch(clock):
    from mqserver.model import ENQUEUE, REMOVE

    store = RecordingDurableStore()
    broker = Broker(store, clock)
    conn, _ = connect(broker)
    broker.declare_queue(b"q")
    for n in range(3):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    done = broker.durable()
    clock.advance(0)
    assert len(store.batches) == 1
    assert [op[0] for op in store.batches[0]].count(ENQUEUE) == 3
    assert not done.called
    store.pending[0].callback(None)
    assert done.called
    consumer = broker.consume(conn, b"c", b"q")
    clock.advance(0)
    broker.ack(consumer, b"m0")
    clock.advance(0)
    assert (REMOVE, b"q", 1) in store.batches[-1]


def test_memory_store_gets_no_ops_and_durable_fires_at_once(broker):
    assert broker.writer is None
    broker.publish_to_queue(b"q", b"m", b"x")
    assert broker.durable().called


def test_records_are_kept_and_reach_a_durable_store(clock):
    from mqserver.model import DELETE, PUT

    store = RecordingDurableStore()
    broker = Broker(store, clock)
    broker.put_record(b"ns", b"k", b"v1")
    broker.put_record(b"ns", b"k", b"v2")
    broker.delete_record(b"ns", b"gone")
    assert broker.records == {b"ns": {b"k": b"v2"}}
    broker.delete_record(b"ns", b"k")
    clock.advance(0)
    assert store.batches == [[(PUT, b"ns", b"k", b"v1"), (PUT, b"ns", b"k", b"v2"), (DELETE, b"ns", b"k")]]


def test_writer_sums_batch_latency_for_metrics(clock):
    store = RecordingDurableStore()
    broker = Broker(store, clock)
    for seconds in (0.25, 0.5):
        broker.publish_to_queue(b"q", b"m", b"x")
        clock.advance(0)
        clock.advance(seconds)
        store.pending.pop().callback(None)
    assert (broker.writer.batches, broker.writer.batch_seconds_total) == (2, 0.75)


class _AppliedMemoryStore(MemoryStore):
    """A memory store the broker treats as durable: it applies (and copies) every batch."""

    durable = True


@pytest.mark.parametrize("dead_letter", [None, b"dlq"])
def test_reject_past_max_retries_removes_the_stored_copy(clock, dead_letter):
    """Issue 17: the REMOVE of a discarded reject named a seq the store never had."""
    store = _AppliedMemoryStore()
    store.open()
    broker = Broker(store, clock)
    broker.declare_queue(b"q", QueueOptions(dead_letter=dead_letter))
    broker.publish_to_queue(b"q", b"m1", b"body", headers={"x-max-retries": "0"})
    conn, _sink = connect(broker)
    consumer = broker.consume(conn, b"c", b"q")
    clock.advance(0)
    assert broker.reject(consumer, b"m1")
    clock.advance(0)
    recovered = store.open().result
    survivors = {q: [m.id for m in rq.messages] for q, rq in recovered.queues.items()}
    assert survivors == ({b"q": [], b"dlq": [b"m1"]} if dead_letter else {b"q": []})
    assert not broker.queues[b"q"].ready


class _BatchRecordingStore(MemoryStore):
    """Durable to the broker; keeps a copy of every batch as it was handed over."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple]] = []

    def apply(self, ops):
        self.batches.append([
            (op[0], op[1].copy_to(op[1].queue, op[1].seq), *op[2:])
            if op[0] in ("enqueue", "requeue") else op
            for op in ops
        ])
        return super().apply(ops)


@pytest.mark.parametrize("dead_letter_declared", [True, False])
def test_a_dead_letter_move_is_never_split_across_batches(clock, dead_letter_declared):
    """A crash after any batch leaves each message in its queue or its
    dead-letter copy, never neither (issue 17: the REMOVE and the copy's
    ENQUEUE were added separately, and the writer's max_batch cut could fall
    between them in a big TTL sweep)."""
    store = _BatchRecordingStore()
    store.open()
    broker = Broker(store, clock)
    broker.writer.max_batch = 3
    if dead_letter_declared:
        broker.declare_queue(b"dlq")
    broker.declare_queue(b"q", QueueOptions(dead_letter=b"dlq"))
    for n in range(20):
        broker.publish_to_queue(b"q", b"m%d" % n, b"body", ttl=5)
    while broker.writer.ops:
        clock.advance(0)
    published = len(store.batches)
    clock.advance(6)
    assert broker.expire_due() == 20
    while broker.writer.ops:
        clock.advance(0)
    assert len(store.batches) > published + 1  # the sweep was cut into several batches
    for k in range(published, len(store.batches) + 1):
        replayed = MemoryStore()
        replayed.open()
        for batch in store.batches[:k]:
            replayed.apply(batch)
        queues = replayed.open().result.queues
        ids = sorted(m.id for name in (b"q", b"dlq") if name in queues
                     for m in queues[name].messages)
        assert ids == sorted(b"m%d" % n for n in range(20)), f"after batch {k}"


@pytest.mark.parametrize("pack_after", [0, 5])
def test_a_damaged_snapshot_chunk_is_withheld_and_logged(broker, tmp_path, monkeypatch,
                                                         logged, pack_after):
    """Read as objects at the load (a small queue) or packed and settled later: the
    damaged chunk's messages leave the queue, the rest are delivered in order,
    and the broker counts what it withheld (its stop then writes no snapshot)."""
    from mqserver.model import Message, Recovered, RecoveredQueue
    from mqserver.packed import Backlog
    from mqserver.storage import snapshot

    monkeypatch.setattr(Backlog, "chunk_size", 4)
    messages = [Message(b"m%d" % seq, b"q", b"body %d" % seq, seq) for seq in range(1, 11)]
    path = tmp_path / snapshot.FILENAME
    snapshot.write(path, Recovered({b"q": RecoveredQueue(b"q", messages=Backlog(messages))},
                                   11), 7)
    data = bytearray(path.read_bytes())
    data[data.index(b"body 6")] ^= 1
    path.write_bytes(bytes(data))
    broker.pack_ready_after, broker.pack_chunk = pack_after, 4
    broker.load(snapshot.read(path, 7).recovered)
    if pack_after:
        assert broker.ready_count() == 10 and not broker.withheld  # nothing read yet
        broker.settle_recovered()
    assert broker.ready_count() == 6 and broker.withheld == 4
    assert [line for line in logged if "withheld" in line] == [
        f"clean-shutdown snapshot: 4 messages of queue b'q' (seqs 5 to 8) in {path} cannot "
        "be read (it fails its checksum); withheld until the next start, which replays the "
        "store (no snapshot is written at this stop)"]
    connection, sink = connect(broker)
    broker.consume(connection, b"c", b"q")
    broker.pump_now()
    assert [message.seq for _, message in sink.delivered] == [1, 2, 3, 4, 9, 10]
