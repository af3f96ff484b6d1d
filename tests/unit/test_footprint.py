"""What a ready message shares with its neighbours, so a backlog of millions stays small."""

from __future__ import annotations

import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from mqserver.broker.core import Broker
from mqserver.broker.ready import CHUNK, PackedReady
from mqserver.model import ENQUEUE, Message, Recovered, RecoveredQueue
from mqserver.packed import share_recovered_values
from mqserver.storage.log import LogStore
from mqserver.storage.memory import MemoryStore
from mqserver.storage.sqlite import SQLiteStore
from mqserver.testing import message


def test_messages_share_the_bound_event_name(broker):
    broker.reconfigure(b"q", replace=[b"user.created", b"user.*"])
    broker.publish_event(b".".join([b"user", b"created"]), b"m1", b"a")  # equal, distinct
    broker.publish_event(b".".join([b"user", b"created"]), b"m2", b"b")
    broker.publish_event(b"user.deleted", b"m3", b"c")
    first, second, third = broker.queues[b"q"].ready
    assert first.event == second.event == b"user.created"
    assert first.event is second.event
    assert third.event == b"user.deleted"


def test_the_shared_event_name_survives_a_binding_change(broker):
    broker.reconfigure(b"q", replace=[b"e"])
    broker.publish_event(b"e", b"m1", b"a")
    broker.reconfigure(b"q", add=[b"f"])
    broker.publish_event(b"e", b"m2", b"b")
    assert [m.event for m in broker.queues[b"q"].ready] == [b"e", b"e"]


def test_publishes_within_50_microseconds_share_created_at(broker, clock):
    broker.reconfigure(b"q", replace=[b"e"])
    clock.advance(10.0)
    broker.publish_event(b"e", b"m1", b"a", ttl=5.0)
    clock.advance(0.00004)
    broker.publish_event(b"e", b"m2", b"b", ttl=5.0)
    clock.advance(0.00002)
    broker.publish_event(b"e", b"m3", b"c")
    m1, m2, m3 = broker.queues[b"q"].ready
    assert m1.created_at == m2.created_at == 10.0
    assert m1.created_at is m2.created_at
    assert m2.expires_at == 15.0
    assert m3.created_at == pytest.approx(10.00006)


def test_a_clock_going_back_is_not_hidden_by_the_shared_time(broker, clock):
    broker.reconfigure(b"q", replace=[b"e"])
    clock.advance(10.0)
    broker.publish_event(b"e", b"m1", b"a")
    clock.rightNow = 9.9995
    broker.publish_to_queue(b"q", b"m2", b"b")
    assert [m.created_at for m in broker.queues[b"q"].ready] == [10.0, 9.9995]


@pytest.fixture(params=["sqlite", "log"])
def make_store(request, tmp_path: Path) -> Callable[[], Any]:
    if request.param == "sqlite":
        return lambda: SQLiteStore(tmp_path / "mqserver.sqlite3")
    return lambda: LogStore(tmp_path / "log")


@pytest_twisted.inlineCallbacks
def test_recovered_messages_share_equal_names_sources_and_times(make_store):
    published = [
        message(seq, b"q%d" % (seq % 2), event=b".".join([b"user", b"created"]),
                source="".join(["mq", "ks"]), created_at=float(1000 + seq // 10),
                expires_at=float(2000 + seq // 10))
        for seq in range(1, 21)
    ]
    store = make_store()
    yield store.open()
    yield store.apply([(ENQUEUE, m) for m in published])
    yield store.close()
    store = make_store()
    recovered = yield store.open()
    yield store.close()
    messages = [m for rq in recovered.queues.values() for m in rq.messages]
    assert sorted(m.as_tuple() for m in messages) == sorted(m.as_tuple() for m in published)
    for rq in recovered.queues.values():
        assert all(m.queue is rq.name for m in rq.messages)
    assert len({id(m.event) for m in messages}) == 1
    assert len({id(m.source) for m in messages}) == 1
    assert len({id(m.created_at) for m in messages}) == len({m.created_at for m in messages})
    assert len({id(m.expires_at) for m in messages}) == len({m.expires_at for m in messages})


def test_sharing_leaves_absent_values_absent():
    bare = message(1, event=None, source=None, expires_at=None)
    share_recovered_values([RecoveredQueue(b"q", messages=[bare])])
    assert (bare.event, bare.source, bare.expires_at) == (None, None, None)


def test_a_burst_with_one_ttl_shares_its_expiry_and_one_sweep_entry(broker, clock):
    broker.reconfigure(b"q", replace=[b"e"])
    broker.reconfigure(b"r", replace=[b"e"])
    clock.advance(10.0)
    for n in range(5):
        broker.publish_event(b"e", b"m%d" % n, b"x", ttl=5.0)
    broker.publish_to_queue(b"q", b"other", b"x", ttl=7.0)
    ready = broker.queues[b"q"].ready
    assert len({id(m.expires_at) for m in list(ready)[:5]}) == 1
    assert sorted(broker._expiry) == [(15.0, b"q"), (15.0, b"r"), (17.0, b"q")]
    clock.advance(5.0)
    assert broker.expire_due() == 10
    assert [m.id for m in ready] == [b"other"]


def test_an_expiry_equal_to_one_already_swept_still_wakes_the_sweep(broker, clock):
    broker.reconfigure(b"q", replace=[b"e"])
    clock.advance(10.0)
    broker.publish_event(b"e", b"m1", b"x", ttl=0.00002)
    clock.advance(0.00003)
    assert broker.expire_due() == 1
    broker.publish_event(b"e", b"m2", b"x", ttl=0.00002)  # the same shared publish time
    assert broker.queues[b"q"].ready[0].expires_at == 10.00002
    assert broker.expire_due() == 1
    assert not broker.queues[b"q"].ready


def test_a_packed_backlog_costs_well_under_200_bytes_per_100_byte_message():
    """The representation that brings 1M ready messages under 300 MB (about 125 B each).

    Counted with tracemalloc (allocation sizes, not timing): the messages are
    made one by one, as a parser makes them, and dropped once packed.
    """
    count = 10 * CHUNK + 1  # the last one stays in the tail
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ready = PackedReady(deque())
        for n in range(count):
            ready.append(Message(b"m%d" % n, b"q", b"%100d" % n, 1000 + n, b"ev", None,
                                 1e9 + n // 100 / 1000, None, 0, "mqks"))
        per_message = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert len(ready) == count and len(ready.tail) == 1
    assert per_message < 140, per_message


def test_a_durable_brokers_backlog_is_packed_once_its_writer_lets_go(clock):
    """The writer holds a burst's messages until its batch is applied; the
    broker packs them once the writer is idle, not only as more arrive."""
    from tests.unit.test_broker import RecordingDurableStore

    store = RecordingDurableStore()
    broker = Broker(store, clock)
    broker.pack_ready_after, broker.pack_chunk = 2, 4
    broker.declare_queue(b"q")
    clock.advance(0)
    store.pending.pop().callback(None)
    broker.publish_to_queue_run(b"q", [(b"m%d" % n, b"x") for n in range(20)])
    ready = broker.queues[b"q"].ready
    assert isinstance(ready, PackedReady) and not ready.chunks
    clock.advance(0)  # the batch goes to the store
    store.batches.clear()  # which keeps no message objects
    store.pending.pop().callback(None)
    assert not ready.chunks, "packed on a later turn, a few chunks at a time"
    clock.advance(0)
    assert len(ready.head) == 3 and [c.count for c in ready.chunks] == [4] * 4
    assert len(ready.tail) == 1
    assert [m.id for m in ready] == [b"m%d" % n for n in range(20)]


def test_a_recovered_backlog_is_packed_at_load(clock):
    backlog = [Message(b"m%d" % seq, b"q", b"x", seq) for seq in range(1, 3001)]
    recovered = Recovered(queues={b"q": RecoveredQueue(b"q", messages=list(reversed(backlog)))})
    broker = Broker(MemoryStore(), clock)
    broker.pack_ready_after = 1000
    broker.load(recovered)
    ready = broker.queues[b"q"].ready
    assert isinstance(ready, PackedReady)
    assert len(ready.head) == 1000 and ready.packed == CHUNK and len(ready.tail) == 2000 - CHUNK
    assert list(ready) == backlog
