"""Backlogs at rest are packed whole, a slice per reactor turn; busy queues are left alone."""

from __future__ import annotations

from collections import deque

from mqserver.broker.core import Broker
from mqserver.broker.ready import PackedReady
from mqserver.durability import broker_state
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink


def _broker(clock) -> Broker:
    broker = Broker(MemoryStore(), clock)
    broker.pack_chunk = 4
    broker.resting.least = 12
    broker.resting.keep = 4
    broker.resting.quiet = 4
    broker.resting.slice = 2
    broker.reconfigure(b"q", replace=[b"e"])
    return broker


def _publish(broker: Broker, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        broker.publish_event(b"e", b"m%d" % n, b"body %d" % n, headers={"n": str(n)})


def test_a_backlog_at_rest_is_packed_but_its_first_chunk_without_changing_state(clock):
    broker = _broker(clock)
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    assert type(queue.ready) is deque, "below --pack-ready-after: objects"
    before = broker_state(broker)
    broker.resting.look()  # the first look only marks it
    assert not clock.getDelayedCalls()
    broker.resting.look()  # nothing moved since: at rest, a slice is due
    assert type(queue.ready) is deque, "packed from the next reactor turn, not in the look"
    assert len(clock.getDelayedCalls()) == 1
    assert broker.resting.pack_slice(), "a slice: two chunks, more to do"
    assert isinstance(queue.ready, PackedReady) and len(queue.ready.chunks) == 2
    while broker.resting.pack_slice():
        pass
    ready = queue.ready
    assert [c.count for c in ready.chunks] == [4] * 6 and len(ready.head) == 6
    assert broker_state(broker) == before, "packing changes nothing a store would see"
    assert [m.seq for m in ready] == sorted(m.seq for m in ready)


def test_the_tail_of_a_packed_backlog_is_packed_too(clock):
    """The newest messages, left as objects behind the last full chunk, go at rest."""
    broker = _broker(clock)
    broker.pack_ready_after = 10
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    assert isinstance(queue.ready, PackedReady) and queue.ready.tail
    before = broker_state(broker)
    broker.resting.look()
    broker.resting.look()
    while broker.resting.pack_slice():
        pass
    ready = queue.ready
    assert not ready.tail and len(ready.head) < 8
    assert sum(c.count for c in ready.chunks) + len(ready.head) == 30
    assert broker_state(broker) == before
    assert [m.seq for m in ready] == sorted(m.seq for m in ready)


def test_the_looping_call_finds_it_and_packs_it_on_the_reactor(clock):
    broker = _broker(clock)
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    broker.resting.start(1.0)
    clock.advance(1.0)
    assert type(queue.ready) is deque
    clock.advance(1.0)
    assert [c.count for c in queue.ready.chunks] == [4] * 6
    assert len(clock.getDelayedCalls()) == 1, "done: only the next look is due"


def test_a_busy_queue_is_left_as_objects(clock):
    broker = _broker(clock)
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    broker.resting.start(1.0)
    for round in range(5):
        _publish(broker, 4, 100 + 4 * round)  # at least ``quiet`` through it per interval
        clock.advance(1.0)
        clock.advance(0)
    assert type(queue.ready) is deque
    clock.advance(1.0)  # quiet for an interval now
    clock.advance(0)
    assert isinstance(queue.ready, PackedReady) and queue.ready.chunks


def test_a_packed_backlog_is_served_in_order_and_swaps_back_once_drained(clock):
    broker = _broker(clock)
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    broker.resting.start(1.0)
    clock.advance(1.0)
    clock.advance(1.0)
    for _ in range(4):
        clock.advance(0)
    assert isinstance(queue.ready, PackedReady)
    sink = RecordingSink()
    conn = broker.connection_opened("test", "127.0.0.1:1", sink)
    broker.consume(conn, b"c", b"q", manual_ack=False)
    for _ in range(3):
        clock.advance(0)
    assert sink.bodies() == [b"body %d" % n for n in range(30)]
    for n in range(30, 38):
        _publish(broker, 1, n)
        clock.advance(0)
    assert type(queue.ready) is deque, "a drained queue goes back to a deque"
    assert len(sink.bodies()) == 38


def test_a_message_the_writer_still_holds_waits_for_the_next_look(clock):
    broker = _broker(clock)
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    held = queue.ready[-1]  # as a durable store's writer would hold it
    broker.resting.start(1.0)
    clock.advance(1.0)
    clock.advance(1.0)
    clock.advance(0)
    assert not getattr(queue.ready, "chunks", None), "nothing packed while the newest is held"
    del held
    clock.advance(1.0)
    for _ in range(4):
        clock.advance(0)
    assert [c.count for c in queue.ready.chunks] == [4] * 6


def test_a_queue_deleted_while_packing_is_dropped(clock):
    broker = _broker(clock)
    _publish(broker, 60)
    broker.resting.start(1.0)
    clock.advance(1.0)
    clock.advance(1.0)
    clock.advance(0)
    broker.delete_queue(b"q")
    clock.advance(0)
    assert not clock.getDelayedCalls()[1:], "no slice due for a deleted queue"


def test_a_failing_look_is_logged_and_looks_again(clock, monkeypatch):
    broker = _broker(clock)
    _publish(broker, 30)
    broker.resting.start(1.0)
    failures = []
    monkeypatch.setattr("mqserver.atrest.log.failure",
                        lambda text, *a, **k: failures.append(text))
    queues, broker.queues = broker.queues, None
    clock.advance(1.0)
    assert failures and "next interval" in failures[0]
    broker.queues = queues
    clock.advance(1.0)
    clock.advance(1.0)
    for _ in range(4):
        clock.advance(0)
    assert isinstance(broker.queues[b"q"].ready, PackedReady)


def test_stop_cancels_the_looks_and_a_due_slice(clock):
    broker = _broker(clock)
    _publish(broker, 60)
    broker.resting.start(1.0)
    clock.advance(1.0)
    clock.advance(1.0)
    broker.resting.stop()
    assert not clock.getDelayedCalls()
    broker.resting.start(0)
    assert not clock.getDelayedCalls(), "0: never"


def test_a_look_at_rest_makes_no_new_mark(clock):
    """The marks are kept in place, and a count that did not move keeps its
    object: nothing a look makes at rest outlives it (see ``Resting._look``)."""
    broker = _broker(clock)
    broker.resting.quiet = 0  # never at rest: only the marks are looked at
    _publish(broker, 30)
    queue = broker.queues[b"q"]
    resting = broker.resting
    marks = resting._marks
    resting.look()
    mark = marks[queue]
    resting.look()
    assert resting._marks is marks and marks[queue] is mark
    _publish(broker, 1, start=30)
    resting.look()
    assert marks[queue] == mark + 1


def test_the_mark_of_a_queue_gone_or_grown_small_is_dropped(clock):
    broker = _broker(clock)
    broker.resting.quiet = 0
    broker.reconfigure(b"other", replace=[b"e"])
    _publish(broker, 30)
    resting = broker.resting
    resting.look()
    assert set(resting._marks) == {broker.queues[b"q"], broker.queues[b"other"]}
    other = broker.queues[b"other"]
    broker.delete_queue(other.name)
    resting.look()
    assert set(resting._marks) == {broker.queues[b"q"]}
    broker.queues[b"q"].ready.clear()
    resting.look()
    assert resting._marks == {}
