"""A packed ready backlog behaves exactly like the deque of messages it replaces."""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.broker.queue import Queue
from mqserver.broker.ready import CHUNK, Chunk, PackedReady
from mqserver.model import Message, QueueOptions
from mqserver.testing import RecordingSink

# shared objects, as a burst of publishes shares them (the chunk stores them once)
QUEUES = (b"q", b"other")
EVENTS = (None, b"ev.a", b"ev.b")
SOURCES = (None, "mqks", "emqp")
SHARED_HEADERS = {"x-max-retries": "3"}


@st.composite
def messages(draw: st.DrawFn, seq: int) -> Message:
    """A message with any mix of shared and distinct fields, ``seq`` given by the caller."""
    body = draw(st.sampled_from([b"", b"x" * 100, b"\x00\xff", bytearray(b"ba")]))
    headers = draw(st.sampled_from([None, SHARED_HEADERS, "fresh"]))
    return Message(
        draw(st.sampled_from([b"", b"m%d" % seq, b"id"])),
        draw(st.sampled_from(QUEUES)),
        body if type(body) is bytes else bytearray(body),
        seq,
        draw(st.sampled_from(EVENTS)),
        {"n": str(seq)} if headers == "fresh" else headers,
        draw(st.sampled_from([0.0, 1.5, 1e9 + seq / 7])),
        draw(st.sampled_from([None, None, 5.0, 10.0, 1e9])),
        draw(st.sampled_from([0, 0, 1, 2**40])),
        draw(st.sampled_from(SOURCES)),
    )


OPS = st.lists(
    st.sampled_from([
        "append", "append", "append", "extend", "appendleft", "popleft", "popleft", "clear",
        "restore", "restore", "expire", "peek", "index", "pack_head", "pack_tail",
    ]),
    max_size=120,
)


class Seqs:
    """Seqs as the broker keeps them: ascending, mostly consecutive, some gaps for restores."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.next = 100

    def tail(self) -> int:
        self.next += self.draw(st.sampled_from([1, 1, 1, 3]))
        return self.next

    def free(self, model: deque[Message]) -> int | None:
        """A seq inside the queue's range that no message holds (a restore's)."""
        if len(model) < 2:
            return None
        used = {m.seq for m in model}
        gaps = [s for s in range(model[0].seq, model[-1].seq) if s not in used]
        return self.draw(st.sampled_from(gaps)) if gaps else None


@settings(max_examples=300, deadline=None)
@given(st.data(), OPS, st.integers(1, 4))
def test_packed_ready_matches_a_deque(data, ops, chunk_size):
    draw = data.draw
    seqs = Seqs(draw)
    model: deque[Message] = deque()
    ready = PackedReady(deque(), chunk_size)
    for op in ops:
        # the queue gets copies: a message held elsewhere (here: by the model) is not packed
        if op == "append":
            message = draw(messages(seqs.tail()))
            model.append(message)
            ready.append(_copy(message))
        elif op == "extend":
            batch = [draw(messages(seqs.tail())) for _ in range(draw(st.integers(0, 6)))]
            model.extend(batch)
            ready.extend(map(_copy, batch))
        elif op == "appendleft":
            message = draw(messages((model[0].seq if model else seqs.next) - 1))
            model.appendleft(message)
            ready.appendleft(_copy(message))
        elif op == "popleft":
            if model:
                assert ready.popleft() == model.popleft()
        elif op == "clear":
            model.clear()
            ready.clear()
        elif op == "restore":
            seq = seqs.free(model)
            if seq is not None:
                message = draw(messages(seq))
                insort(model, message, key=_seq)
                insort(ready, _copy(message), key=_seq)
        elif op == "expire":
            now = draw(st.sampled_from([4.0, 5.0, 7.0]))
            expected = [m for m in model if m.expires_at is not None and m.expires_at <= now]
            model = deque(m for m in model if m not in expected)
            assert ready.take_expired(now) == expected
        elif op == "pack_head":
            hold: list[Message] = []
            while ready.pack_head(draw(st.integers(0, 3)), draw(st.integers(1, 2)), hold):
                pass
        elif op == "pack_tail":
            hold = []
            while ready.pack_tail(draw(st.integers(1, 2)), hold):
                pass
            assert not ready.tail, "nothing else holds the queue's copies"
            assert all(c.count < 2 * chunk_size for c in ready.chunks)
        elif op == "peek":
            limit = draw(st.integers(0, 5))
            assert list(islice(ready, limit)) == list(islice(model, limit))
        elif model:
            i = draw(st.integers(-len(model), len(model) - 1))
            assert ready[i] == model[i]
        assert len(ready) == len(model)
        assert bool(ready) == bool(model)
        assert list(ready) == list(model)
    if model:
        assert ready[0] == model[0] and ready[-1] == model[-1]
    drained = []
    while ready:
        drained.append(ready.popleft())
    assert drained == list(model)


def _seq(message: Message) -> int:
    return message.seq


def _copy(message: Message) -> Message:
    return Message(*message.as_tuple())


def test_messages_held_elsewhere_are_packed_once_let_go():
    """A durable store's write backlog holds new messages: packing them then would keep two copies."""
    ready = PackedReady(deque(), 4)
    backlog = [Message(b"m%d" % seq, b"q", b"b", seq) for seq in range(10)]
    for message in backlog:
        ready.append(message)
    assert not ready.chunks and len(ready.tail) == 10
    backlog.clear()
    ready.append(Message(b"m10", b"q", b"b", 10))
    assert [chunk.count for chunk in ready.chunks] == [4, 4], "two chunks per append at most"
    assert [m.seq for m in ready] == list(range(11))


def test_a_short_tail_is_packed_and_joins_a_short_chunk_before_it():
    """At rest the tail goes too (its messages were made at the end of a burst,
    scattered over arenas); a trickle then grows one short chunk, not one per look."""
    ready = PackedReady(deque(), 4)
    for seq in range(6):
        ready.append(Message(b"m%d" % seq, b"q", b"b", seq))
    hold: list[Message] = []
    assert not ready.pack_tail(8, hold)
    assert [c.count for c in ready.chunks] == [4, 2] and not ready.tail
    assert [m.seq for m in hold] == [4, 5]
    for seq in range(6, 8):
        ready.append(Message(b"m%d" % seq, b"q", b"b", seq))
        ready.pack_tail(8, hold)
    assert [c.count for c in ready.chunks] == [4, 4], "joined the short chunk, one at a time"
    for seq in range(8, 10):
        ready.append(Message(b"m%d" % seq, b"q", b"b", seq))
        ready.pack_tail(8, hold)
    assert [c.count for c in ready.chunks] == [4, 4, 2], "a full one is left as it is"
    ready.append(Message(b"m10", b"q", b"b", 10))
    ready.append(Message(b"m11", b"q", b"b", 11))
    ready.append(Message(b"m12", b"q", b"b", 12))
    ready.pack_tail(8, hold)
    assert [c.count for c in ready.chunks] == [4, 4, 5], "fewer than two chunk sizes"
    assert [m.seq for m in ready] == list(range(13))


def test_a_tail_the_writer_still_holds_is_left():
    ready = PackedReady(deque(), 4)
    for seq in range(3):
        ready.append(Message(b"m%d" % seq, b"q", b"b", seq))
    held = ready.tail[-1]
    hold: list[Message] = []
    assert not ready.pack_tail(8, hold)
    assert len(ready.tail) == 3 and not ready.chunks and not hold
    del held
    assert not ready.pack_tail(8, hold)
    assert [c.count for c in ready.chunks] == [3]


def test_popping_an_empty_packed_ready_raises_like_a_deque():
    ready = PackedReady(deque(), 2)
    try:
        ready.popleft()
    except IndexError:
        pass
    else:
        raise AssertionError("popleft() on an empty PackedReady returned")
    assert not ready and len(ready) == 0


def test_a_chunk_stores_shared_values_once_and_gives_them_back():
    headers = {"h": "1"}
    burst = [Message(b"m%d" % n, b"q", b"body", 7 + n, b"ev", headers, 1.5, None, 0, "mqks")
             for n in range(4)]
    chunk = Chunk(burst)
    assert chunk.queues == b"q" and chunk.events == b"ev" and chunk.headers is headers
    assert chunk.seq_column() == range(7, 11) and chunk.seqs is None
    assert chunk.retries == 0 and chunk.expires is None
    assert chunk.first_expiry == math.inf
    out = chunk.unpack()
    assert out == burst
    assert all(m.headers is headers and m.queue is burst[0].queue for m in out)
    assert chunk.message(-1) == burst[-1] and chunk.message(0) == burst[0]


def test_a_chunk_keeps_lists_where_messages_differ():
    burst = [Message(b"a", b"q", b"1", 1, b"e1", None, 1.0, 9.0, 0),
             Message(b"bb", b"q", bytearray(b"2"), 5, b"e2", {"k": "v"}, 2.0, None, 3, "emqp")]
    chunk = Chunk(burst)
    assert isinstance(chunk.events, list) and isinstance(chunk.bodies, list)
    assert list(chunk.seq_column()) == [1, 5] and list(memoryview(chunk.retries).cast("q")) == [0, 3]
    assert chunk.first_expiry == 9.0
    assert chunk.unpack() == burst
    assert type(chunk.message(1).body) is bytearray


def _queue(*seqs: int) -> Queue:
    queue = Queue(b"q", QueueOptions(), 0.0)
    for seq in seqs:
        queue.ready.append(Message(b"m%d" % seq, b"q", b"b", seq))
    return queue


def test_a_queue_packs_past_its_threshold_and_swaps_back_when_small():
    queue = _queue(1, 2, 3)
    queue.pack_ready(5)
    assert type(queue.ready) is deque
    assert queue.pack_check_at == 3, "3 more publishes could take it past 5"
    queue.ready.extend(Message(b"m", b"q", b"b", seq) for seq in range(4, 3000))
    queue.pack_ready(5)
    assert isinstance(queue.ready, PackedReady) and queue.pack_check_at == CHUNK
    for seq in range(3000, 5100):
        queue.ready.append(Message(b"m", b"q", b"b", seq))
    assert queue.ready.chunks
    queue.pack_ready(5)
    assert isinstance(queue.ready, PackedReady), "chunks left: stays packed"
    packed = queue.ready
    while len(packed) > 5:
        packed.popleft()
    queue.pack_ready(5)
    assert type(queue.ready) is deque and queue.pack_check_at == 1
    assert [m.seq for m in queue.ready] == list(range(5095, 5100))
    assert not packed, "the packed form is left empty, so nothing is served twice"


def test_a_threshold_of_zero_never_packs():
    queue = _queue(*range(1, 100))
    queue.pack_ready(0)
    assert type(queue.ready) is deque


def test_restore_into_a_packed_queue_keeps_seq_order():
    queue = _queue(10, 20, 30)
    queue.pack_ready(1)
    for seq in range(40, 4000, 10):
        queue.ready.append(Message(b"m", b"q", b"b", seq))
    queue.restore([Message(b"r", b"q", b"b", seq) for seq in (5, 15, 2005, 3995, 4005)])
    seqs = [m.seq for m in queue.ready]
    assert seqs == sorted(seqs) and len(seqs) == 3 + 396 + 5


def test_restores_into_one_chunk_split_it_before_it_doubles():
    """Found by CI: a restore into a full chunk made it twice the size, and
    nothing bounded how far more restores into the same stretch grow it."""
    ready = PackedReady(deque(), 4)
    for seq in range(0, 80, 10):
        ready.append(Message(b"m", b"q", b"b", seq))
    ready.append(Message(b"m", b"q", b"b", 80))
    assert [c.count for c in ready.chunks] == [4, 4]
    for seq in (11, 12, 13, 14, 15):
        insort(ready, Message(b"r", b"q", b"b", seq), key=_seq)
    assert [c.count for c in ready.chunks] == [4, 5, 4]
    assert all(c.count < 8 for c in ready.chunks)
    seqs = [m.seq for m in ready]
    assert seqs == sorted(seqs) and len(seqs) == 14


def test_the_ttl_sweep_leaves_unexpired_packed_chunks_alone():
    queue = _queue(-1, 0)
    queue.pack_ready(1)
    for seq in range(1, 3001):
        expires = 50.0 if seq in (1000, 3000) else None
        queue.ready.append(Message(b"m", b"q", b"b", seq, expires_at=expires))
        queue.ttl_ready += expires is not None
    chunks = list(queue.ready.chunks)
    assert [m.seq for m in queue.take_expired(60.0)] == [1000, 3000]
    assert queue.ttl_ready == 0 and len(queue.ready) == 3000
    kept = [c for c in queue.ready.chunks if any(c is old for old in chunks)]
    assert len(kept) == 1, "the chunk without an expired message (1025-2048) is kept as is"
    assert [m.seq for m in queue.ready][999:1002] == [998, 999, 1001]


def _connect(broker):
    sink = RecordingSink()
    return broker.connection_opened("test", "127.0.0.1:1", sink), sink


def test_a_packed_backlog_is_delivered_in_order_and_intact(broker, clock):
    broker.pack_ready_after = 100
    broker.reconfigure(b"q", replace=[b"e"])
    for n in range(3000):
        broker.publish_event(b"e", b"m%d" % n, b"body %d" % n, headers={"n": str(n)})
    queue = broker.queues[b"q"]
    assert isinstance(queue.ready, PackedReady) and len(queue.ready) == 3000
    conn, sink = _connect(broker)
    broker.consume(conn, b"c", b"q", manual_ack=False)
    for _ in range(5):
        clock.advance(0)
    assert sink.bodies() == [b"body %d" % n for n in range(3000)]
    assert [m.headers for _, m in sink.delivered][-1] == {"n": "2999"}
    assert [m.seq for _, m in sink.delivered] == sorted(m.seq for _, m in sink.delivered)
    for _ in range(CHUNK):
        broker.publish_event(b"e", b"after", b"x")
        clock.advance(0)
    assert type(queue.ready) is deque, "a drained queue goes back to a deque within CHUNK publishes"
    assert len(sink.delivered) == 3000 + CHUNK


def test_ttl_purge_and_drop_head_on_a_packed_queue(broker, clock):
    broker.pack_ready_after = 10
    broker.declare_queue(b"q", QueueOptions(max_length=2500))
    for n in range(3000):
        broker.publish_to_queue(b"q", b"m%d" % n, b"b", ttl=5.0 if n % 2 else None)
    queue = broker.queues[b"q"]
    assert len(queue.ready) == 2500 and queue.ready[0].id == b"m500"
    clock.advance(6.0)
    assert broker.expire_due() == 1250
    assert queue.ttl_ready == 0
    assert [m.id for m in islice(queue.ready, 3)] == [b"m500", b"m502", b"m504"]
    assert broker.purge(b"q") == 1250
    assert not queue.ready


def test_a_recovered_backlog_is_laid_out_as_publishing_would_have():
    backlog = [Message(b"m%d" % seq, b"q", b"b", seq) for seq in range(1, 12)]
    ready = PackedReady.of(backlog, 2, 4)
    assert len(ready.head) == 2 and [c.count for c in ready.chunks] == [4, 4]
    assert len(ready.tail) == 1 and ready.packed == 8 and len(ready) == 11
    assert list(ready) == backlog
    assert [ready.popleft() for _ in range(11)] == backlog and not ready


def test_a_tail_held_elsewhere_is_packed_by_catch_up_once_let_go():
    lagged: list[bool] = []
    ready = PackedReady(deque(), 2, lambda: lagged.append(True))
    held = [Message(b"m%d" % seq, b"q", b"b", seq) for seq in range(9)]
    ready.extend(held)
    assert not ready.chunks and lagged, "the writer holds them: told, not packed"
    assert not ready.catch_up(8)
    held.clear()
    assert ready.catch_up(2), "stopped at its limit with more to pack"
    assert not ready.catch_up(8)
    assert [c.count for c in ready.chunks] == [2, 2, 2, 2] and len(ready.tail) == 1
    assert [m.seq for m in ready] == list(range(9))
