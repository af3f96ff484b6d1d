"""A clean stop's state is the state the durability invariant names, packed as the broker holds it."""

from __future__ import annotations

from mqserver.broker.ready import PackedReady
from mqserver.broker.saving import durable_state
from mqserver.durability import broker_state, recovered_state
from mqserver.model import QueueOptions
from mqserver.packed import Backlog
from mqserver.testing import RecordingSink


def test_a_packed_queue_gives_its_chunks_as_they_are(broker):
    broker.pack_ready_after = 100
    broker.declare_queue(b"q", QueueOptions(max_length=10_000))
    broker.reconfigure(b"q", add=[b"e"])
    for n in range(3000):
        broker.publish_event(b"e", b"m%d" % n, b"body %d" % n)
    broker.put_record(b"ns", b"k", b"v")
    ready = broker.queues[b"q"].ready
    assert isinstance(ready, PackedReady)
    state = durable_state(broker)
    backlog = state.queues[b"q"].messages
    assert isinstance(backlog, Backlog)
    assert all(any(chunk is mine for mine in backlog.chunks) for chunk in ready.chunks)
    assert recovered_state(state) == broker_state(broker)
    assert state.next_seq == broker._seq and state.records == {b"ns": {b"k": b"v"}}


def test_in_flight_messages_stand_at_their_seqs_place(broker, clock):
    for n in range(6):
        broker.publish_to_queue(b"q", b"m%d" % n, b"b")
    connection = broker.connection_opened("test", "peer", RecordingSink())
    broker.consume(connection, b"c", b"q", window=2)
    clock.advance(0)
    assert len(broker.queues[b"q"].ready) == 4
    state = durable_state(broker)
    assert [m.id for m in state.queues[b"q"].messages] == [b"m%d" % n for n in range(6)]
    assert recovered_state(state) == broker_state(broker)


def test_only_chunks_go_to_the_store_thread(broker):
    """Every message is packed on the reactor thread: the store reads no live object."""
    for n in range(5):
        broker.publish_to_queue(b"q", b"m%d" % n, b"b")
    backlog = durable_state(broker).queues[b"q"].messages
    assert not backlog.tail and [chunk.count for chunk in backlog.chunks] == [5]
