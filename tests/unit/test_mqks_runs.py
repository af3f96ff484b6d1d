"""MQKS runs (issue 8): a chunk's plain publishes and acks stored as broker runs.

The twin test feeds the same chunks to a server that gathers runs and to
one that publishes and acks each line on its own (``OneByOne``, the way
before runs) and wants the same bytes on every connection, the same log and
the same broker.  The targeted tests pin each place a publish run must be
stored (the ack runs' are in test_mqks_ack_runs.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent

from mqserver.broker.core import Broker
from mqserver.journal.writer import Journal
from mqserver.model import Message, QueueOptions
from mqserver.protocols.mqks.protocol import MQKSFactory, MQKSProtocol
from mqserver.storage.memory import MemoryStore

EID = re.compile(rb"\d{20}[0-9a-zA-Z]{4}")


class OneByOne(MQKSProtocol):
    """The reference: every publish and ack line goes the one-at-a-time way."""

    def _gather(self, words: list[bytes]) -> bool:
        return False

    def _gather_ack(self, words: list[bytes]) -> bool:
        return False


class OneByOneFactory(MQKSFactory):
    def buildProtocol(self, addr: Any) -> MQKSProtocol:
        protocol = OneByOne(self)
        protocol.factory = self
        return protocol


class HeldStore(MemoryStore):
    """Durable, and nothing is durable until the test says so (``settle``)."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Deferred[None]] = []
        # every op, a message as its queue, id, seq, retry and body: their order too
        self.ops: list[tuple[Any, ...]] = []

    def apply(self, ops: list[Any]) -> Deferred[None]:
        self.ops += [tuple((v.queue, v.id, v.seq, v.retry, v.body) if isinstance(v, Message)
                           else v for v in op) for op in ops]
        d: Deferred[None] = Deferred()
        self.pending.append(d)
        return d

    def settle(self) -> None:
        pending, self.pending = self.pending, []
        for d in pending:
            d.callback(None)

    def fail(self) -> None:
        """The batches in flight fail (the writer retries them later)."""
        pending, self.pending = self.pending, []
        for d in pending:
            d.errback(OSError("disk full"))


class World:
    """A broker with a reject-publish queue, a drop-head queue, a plain queue
    and a consumer on another connection; ``pub`` gets the test's chunks."""

    def __init__(self, factory_class: type[MQKSFactory], durable: bool, journal: bool) -> None:
        self.clock = Clock()
        self.store = HeldStore() if durable else MemoryStore()
        self.broker = Broker(self.store, self.clock)
        if journal:  # never started: its records stay in ``pending``, in order
            self.broker.journal = Journal("unused-journal", self.clock, node="n1")
        self.factory = factory_class(self.broker, max_line=96)
        broker = self.broker
        broker.declare_queue(b"qf", QueueOptions(max_length=4, overflow="reject-publish"))
        broker.declare_queue(b"qd", QueueOptions(max_length=2, overflow="drop-head"))
        broker.reconfigure(b"qf", add=[b"ea", b"eb"])
        broker.reconfigure(b"qd", add=[b"eb"])
        broker.reconfigure(b"qa", add=[b"ea", b"ec"])
        self.pub, self.pub_out = self.connect()
        self.sub, self.sub_out = self.connect()
        self.sub.dataReceived(b"s1 consume --manual-ack qs eb ec\n")
        # names checked as if published on another connection: pub's first
        # publishes can gather (and must register pub with the memory alarm)
        # ("--confirm" is a valid name too, yet as a publish's first word a flag)
        for event in (b"ea", b"eb", b"ec", b"--confirm"):
            self.factory.check_event(event)
        # s1 holds deliveries from the start (and qa keeps its copies): acks settle at once
        for message_id in (b"m1", b"m2", b"m3", b"M4"):
            broker.publish_event(b"ec", message_id, b"held", None, None, "mqks")
        self.clock.advance(0)

    def connect(self) -> tuple[MQKSProtocol, StringTransport]:
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        protocol.makeConnection(transport)
        return protocol, transport

    def feed(self, chunks: list[tuple[bytes, bool | str]]) -> list[int]:
        """Each chunk, then a reactor turn, then maybe the store batches in flight made
        durable (True) or failed ("fail": retried half a second later); how much the
        publisher had been answered after each (when, not only what)."""
        answered = []
        for chunk, settle in chunks:
            self.pub.dataReceived(chunk)
            self.clock.advance(0)
            if settle == "fail" and isinstance(self.store, HeldStore):
                self.store.fail()
                self.clock.advance(0.5)
            elif settle and isinstance(self.store, HeldStore):
                self.store.settle()
                self.clock.advance(0)
            answered.append(len(self.pub_out.value()))
        self.clock.advance(0)
        return answered

    def state(self) -> Any:
        broker = self.broker
        queues = {
            name: ([(m.id, m.body, m.event, m.seq) for m in q.ready], q.enqueued, q.refused,
                   q.delivered, q.acked, q.rejected, q.ttl_ready)
            for name, q in broker.queues.items()
        }
        consumers = {cid: [(m.id, m.seq, m.retry) for m in c.unacked.values()]
                     for cid, c in self.factory.consumers.items()}
        # the memory alarm knows the publisher from its first publish
        alarm = [self.pub in broker.flow.publishers, self.sub in broker.flow.publishers]
        ops = self.store.ops if isinstance(self.store, HeldStore) else None
        journal = broker.journal.pending if broker.journal is not None else None
        return (queues, consumers, broker.published, broker.queued, broker.unroutable,
                broker.delivered, alarm, ops, journal)


def run(factory_class: type[MQKSFactory], chunks: list[tuple[bytes, bool]],
        durable: bool, journal: bool = False) -> tuple[Any, ...]:
    with capturedLogs() as events:
        world = World(factory_class, durable, journal)
        answered = world.feed(chunks)
    logs = [EID.sub(b"EID", formatEvent(e).encode()) for e in events]
    return (EID.sub(b"EID", world.pub_out.value()), EID.sub(b"EID", world.sub_out.value()),
            answered, logs, world.state())


EVENTS = [b"ea", b"ea", b"eb", b"ec", b"ed"]
IDS = [b"m1", b"m2", b"m3", b"M4", b"m1", b"m2", b"m-5", b"x" * 70, b"a\x01b"]
BODIES = [b"x", b"body two", b"  spaced  ", b"--confirm"]
OTHERS = [
    b"p ping hi", b"e _eval state.published", b"e2 _eval state.queues", b"e3 _eval state.queued",
    b"e4 _eval state.messages_by_consumer_ids", b"e4 _eval state.messages_by_consumer_ids",
    b"k1 ack s1 m1",
    b"k2 ack --confirm s1 --all", b"k3 reject s1 m2", b"k4 ack s1 nope", b"k5 ack zz m1",
    b"c2 consume qa ea", b"c3 consume qf", b"d3 delete_consumer c3", b"s1 consume --manual-ack qs eb ec", b"r1 rebind --confirm qd --add ea",
    b"r2 rebind qf --remove ea", b"d1 delete_consumer --confirm c2", b"d2 delete_queue qs",
    b"u1 nope x", b"short", b"", b"m6 publish", b"m7 publish ea", b"m8 publish  x",
    b"m9 publish --confirm ea", b"mA publish e\x01v x", b"mB publish " + b"v" * 80 + b" x",
    b"mC publish --confirm --confirm x", b"w" * 100,
    # a manual-ack consumer on the publisher's connection, one with a flag's id, their ends
    b"s2 consume --manual-ack qa ea", b"--confirm consume --manual-ack qs eb",
    b"d4 delete_consumer s2",
    b"d5 delete_queue qa",
]
# acks: mostly plain ones of a live consumer and held ids, so that runs form; odd ones among them
ACK_IDS = [b"k1", b"k1", b"K2", b"k-3", b"x" * 70, b"k\x01"]
ACK_CONSUMERS = [b"s1"] * 4 + [b"s2", b"c2", b"zz", b"--confirm", b"", b"--confirm s1"]
ACK_MESSAGES = [b"m1", b"m2", b"m3", b"M4"] * 2 + [
    b"m-5", b"x" * 70, b"a\x01b", b"nope", b"--all", b"m1 m2", b""]

ack_line = st.builds(lambda rid, cid, mid: b"%s ack %s %s" % (rid, cid, mid),
                     st.sampled_from(ACK_IDS), st.sampled_from(ACK_CONSUMERS),
                     st.sampled_from(ACK_MESSAGES))
# what a draining consumer sends, several acks of one consumer in a row, or a mix
acks = st.builds(
    lambda cid, mids: b"\n".join(b"k1 ack %s %s" % (cid, mid) for mid in mids),
    st.sampled_from(ACK_CONSUMERS[:7]), st.lists(st.sampled_from(ACK_MESSAGES), min_size=1,
                                                 max_size=6),
) | st.lists(ack_line, min_size=1, max_size=4).map(b"\n".join)


def publish_line(flags: bytes) -> st.SearchStrategy[bytes]:
    return st.builds(lambda rid, event, body: b"%s publish %s%s %s" % (rid, flags, event, body),
                     st.sampled_from(IDS), st.sampled_from(EVENTS), st.sampled_from(BODIES))


def any_line(kind: bytes | None) -> st.SearchStrategy[bytes]:
    if kind is None:
        return st.sampled_from(OTHERS)
    return acks if kind == b"ack" else publish_line(kind)


# mostly plain publishes and acks, so that runs form, refusals among them
line = st.sampled_from([b""] * 6 + [b"--confirm "] * 3 + [None, None] + [b"ack"] * 5).flatmap(
    any_line)


@st.composite
def chunked(draw: Any) -> list[tuple[bytes, bool]]:
    lines = draw(st.lists(line, max_size=40))
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n", b" \n"]), min_size=len(lines),
                         max_size=len(lines)))
    wire = b"".join(text + end for text, end in zip(lines, ends, strict=True))
    cuts = sorted(set(draw(st.lists(st.integers(0, max(len(wire), 1)), max_size=8))))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    return [(p, draw(st.booleans())) for p in pieces if p]


@settings(max_examples=400, deadline=None)
@given(chunked(), st.booleans(), st.booleans())
def test_runs_answer_store_and_log_as_one_publish_at_a_time(chunks, durable, journal):
    """Also the store's ops and the journal's records, in their order: acks and
    publishes of a chunk are settled and stored in the order they came."""
    assert run(MQKSFactory, chunks, durable, journal) == run(
        OneByOneFactory, chunks, durable, journal)


# what W1 sends: plain publishes and acks of held messages (held from the start)
hot_line = st.sampled_from([b"m1 publish ea x", b"m2 publish ea y", b"m3 publish ec z"]) | (
    st.sampled_from([b"m1", b"m2", b"m3", b"M4"]).map(b"k1 ack s1 %s".__mod__))


@settings(max_examples=200, deadline=None)
@given(st.lists(hot_line, max_size=16), st.integers(0, 16))
def test_runs_of_publishes_and_acks_are_stored_in_the_order_their_lines_came(lines, cut):
    """A durable store's ops and the journal's records show the order."""
    chunks = [(b"".join(line + b"\n" for line in part), True)
              for part in (lines[:cut], lines[cut:]) if part]
    assert run(MQKSFactory, chunks, True, True) == run(OneByOneFactory, chunks, True, True)


# what W1 with every publish confirmed sends, among plain publishes, acks, an
# event bound to no queue and a queue that refuses (qf, bound to ea and eb)
confirmed_line = st.sampled_from(
    [b"m1 publish --confirm ea x", b"m2 publish --confirm ea y", b"m3 publish --confirm ec z",
     b"m4 publish --confirm ed w", b"m5 publish --confirm eb v", b"m6 publish ea u",
     b"m7 publish --confirm ea", b"k1 ack s1 m1"])


@settings(max_examples=200, deadline=None)
@given(st.lists(confirmed_line, max_size=24), st.lists(st.integers(0, 24), max_size=3),
       st.booleans(), st.lists(st.sampled_from([False, True, "fail"]), min_size=4, max_size=4))
def test_confirmed_publishes_split_anywhere_answer_and_store_as_one_at_a_time(
        lines, cuts, durable, settles):
    """Each chunk's confirms wait together: the same answers, in the same order,
    the same ops and journal, wherever the chunks are cut and the store settles
    or fails."""
    cuts = sorted(set(cuts))
    parts = [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=False)]
    chunks = [(b"".join(line + b"\n" for line in part), settle)
              for part, settle in zip(parts, settles, strict=False) if part]
    assert run(MQKSFactory, chunks, durable, True) == run(OneByOneFactory, chunks, durable, True)


# -- where a run is stored -------------------------------------------------------------


class Writes(StringTransport):
    """A transport that counts its writes."""

    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


class Probe:
    """One connection of a run-gathering server, recording the broker's publish calls
    and its durability waits."""

    def __init__(self, store: MemoryStore | None = None,
                 factory_class: type[MQKSFactory] = MQKSFactory) -> None:
        self.clock = Clock()
        self.store = store if store is not None else MemoryStore()
        self.broker = Broker(self.store, self.clock)
        self.factory = factory_class(self.broker)
        self.protocol = self.factory.buildProtocol(None)
        self.transport = Writes()
        self.protocol.makeConnection(self.transport)
        self.calls: list[tuple[bytes, list[bytes]]] = []
        self.waits = 0
        durable = self.broker.durable

        def counted() -> Deferred[None]:
            self.waits += 1
            return durable()

        self.broker.durable = counted
        run_publish = self.broker.publish_event_run

        def publish_event_run(event, entries, *args):  # publish_event's way in too
            self.calls.append((event, [rid for rid, _ in entries]))
            return run_publish(event, entries, *args)

        self.broker.publish_event_run = publish_event_run

    def send(self, *lines: bytes) -> list[bytes]:
        self.protocol.dataReceived(b"".join(line + b"\n" for line in lines))
        return self.out()

    def out(self) -> list[bytes]:
        """What was written since the last look, after the reactor's next turn."""
        self.clock.advance(0)
        out = self.transport.value().splitlines()
        self.transport.clear()
        return [EID.sub(b"EID", line) for line in out]


@pytest.fixture
def probe() -> Probe:
    p = Probe()
    p.send(b"b rebind q ea eb")  # the events' names are checked: later publishes gather
    p.send(b"w1 publish ea x", b"w2 publish eb x")
    p.calls.clear()
    return p


def test_a_chunks_publishes_to_one_event_are_one_run(probe):
    probe.send(b"m1 publish ea a", b"m2 publish ea b", b"m3 publish ea c")
    assert probe.calls == [(b"ea", [b"m1", b"m2", b"m3"])]


def test_another_event_stores_the_run(probe):
    probe.send(b"m1 publish ea a", b"m2 publish eb b", b"m3 publish eb c", b"m4 publish ea d")
    assert probe.calls == [(b"ea", [b"m1"]), (b"eb", [b"m2", b"m3"]), (b"ea", [b"m4"])]


def test_any_other_line_sees_the_publishes_before_it_stored(probe):
    out = probe.send(b"m1 publish ea a", b"m2 publish ea b", b"e _eval state.published",
                     b"m3 publish ea c")
    assert out == [b"e ok 4"]
    assert probe.calls == [(b"ea", [b"m1", b"m2"]), (b"ea", [b"m3"])]


def test_a_confirm_flag_is_never_taken_for_a_runs_event(probe):
    probe.send(b"c1 publish --confirm --confirm x")  # a valid event name, once checked
    out = probe.send(b"m1 publish ea a", b"m2 publish --confirm ea b",
                     b"m3 publish --confirm --confirm y", b"m4 publish --confirm ex z")
    assert out == [b"m2 ok ", b"m3 ok ", b"m4 ok "]
    # ex was not checked yet: alone, the way that checks it
    assert probe.calls[-3:] == [(b"ea", [b"m1", b"m2"]), (b"--confirm", [b"m3"]),
                                (b"ex", [b"m4"])]


def test_an_error_comes_after_the_publishes_before_it(probe):
    probe.broker.declare_queue(b"full", QueueOptions(max_length=1, overflow="reject-publish"))
    probe.broker.reconfigure(b"full", add=[b"ea"])
    out = probe.send(b"m1 publish ea a", b"m2 publish ea b", b"m3 publish ea", b"m4 publish ea c")
    assert out == [b"m2 error EID", b"m3 error EID", b"m4 error EID"]
    assert [m.id for m in probe.broker.queues[b"full"].ready] == [b"m1"]


def test_a_refusal_is_answered_in_place_and_the_rest_try_again(probe):
    probe.broker.declare_queue(b"full", QueueOptions(max_length=2, overflow="reject-publish"))
    probe.broker.reconfigure(b"full", add=[b"ea"])
    out = probe.send(b"m1 publish ea a", b"m2 publish ea b", b"m3 publish ea c",
                     b"m4 publish ea d", b"k ack --confirm nobody --all", b"p ping done")
    assert out == [b"m3 error EID", b"m4 error EID", b"p ok done"]
    assert probe.broker.queues[b"full"].refused == 2
    assert [m.id for m in probe.broker.queues[b"full"].ready] == [b"m1", b"m2"]


def test_a_too_long_line_is_answered_after_the_run():
    probe = Probe()
    probe.factory.max_line = probe.protocol.max_line = 40
    probe.broker.declare_queue(b"full", QueueOptions(max_length=1, overflow="reject-publish"))
    probe.send(b"b rebind full ea", b"w publish ea x")
    out = probe.send(b"m1 publish ea a", b"m2 publish ea " + b"b" * 40, b"m3 publish ea c")
    assert out == [b"m1 error EID", b"None error EID"]  # the refusal first
    assert probe.calls[-1] == (b"ea", [b"m1"])


def test_the_chunks_end_stores_the_run_before_its_pump(probe):
    probe.send(b"c consume q")
    assert probe.send(b"m1 publish ea a", b"m2 publish ea b") == [
        b"c ok m1 event=ea a", b"c ok m2 event=ea b"]


def test_a_first_publish_that_gathers_registers_with_the_memory_alarm(probe):
    other = probe.factory.buildProtocol(None)
    other.makeConnection(StringTransport())
    other.dataReceived(b"m1 publish ea a\nm2 publish ea b\n")
    assert other in probe.broker.flow.publishers
    assert probe.calls == [(b"ea", [b"m1", b"m2"])]


def test_a_line_left_at_the_chunks_end_waits_for_the_next_chunk(probe):
    probe.protocol.dataReceived(b"m1 publish ea a\nm2 publish e")
    probe.protocol.dataReceived(b"a b\n")
    assert probe.calls == [(b"ea", [b"m1"]), (b"ea", [b"m2"])]


def test_a_run_that_fails_unexpectedly_answers_each_of_its_lines_with_an_error(probe):
    def broken(event, entries, *args):
        raise RuntimeError("bug")

    probe.broker.publish_event_run = broken
    with capturedLogs() as events:
        out = probe.send(b"m1 publish ea a", b"m2 publish ea b", b"p ping after")
    assert out == [b"m1 error EID", b"m2 error EID", b"p ok after"]
    assert [e["log_failure"].getErrorMessage() for e in events if "log_failure" in e] == ["bug"]


# -- confirmed publishes (issue 19) ----------------------------------------------------


def durable_probe(store: HeldStore, factory_class: type[MQKSFactory] = MQKSFactory) -> Probe:
    p = Probe(store, factory_class)
    p.send(b"b rebind q ea eb", b"w1 publish ea x", b"w2 publish eb x")
    store.settle()
    p.out()
    p.calls.clear()
    p.waits = 0
    return p


def test_a_chunks_confirmed_publishes_are_one_run_answered_in_one_write(probe):
    writes = probe.transport.writes
    lines = [b"m%d publish --confirm ea body %d" % (n, n) for n in range(50)]
    assert probe.send(*lines) == [b"m%d ok " % n for n in range(50)]
    assert probe.calls == [(b"ea", [b"m%d" % n for n in range(50)])]
    assert probe.waits == 1
    assert probe.transport.writes == writes + 1


def test_a_durable_store_confirms_the_run_once_and_then_its_oks_go_out_together():
    store = HeldStore()
    probe = durable_probe(store)
    assert probe.send(b"m1 publish --confirm ea a", b"m2 publish --confirm ea b",
                      b"m3 publish --confirm ea c") == []
    assert probe.calls == [(b"ea", [b"m1", b"m2", b"m3"])]
    assert probe.waits == 1 and len(store.pending) == 1  # one batch, one wait
    assert [op[1][1] for op in store.ops[-3:]] == [b"m1", b"m2", b"m3"]
    writes = probe.transport.writes
    store.settle()
    assert probe.out() == [b"m1 ok ", b"m2 ok ", b"m3 ok "]
    assert probe.transport.writes == writes + 1


def test_plain_and_confirmed_publishes_to_several_events_share_one_wait():
    store = HeldStore()
    probe = durable_probe(store)
    probe.send(b"m1 publish ea a", b"m2 publish --confirm ea b", b"m3 publish ea c",
               b"m4 publish --confirm eb d", b"m5 publish eb e")
    assert probe.calls == [(b"ea", [b"m1", b"m2", b"m3"]), (b"eb", [b"m4", b"m5"])]
    assert probe.waits == 1
    store.settle()
    assert probe.out() == [b"m2 ok ", b"m4 ok "]


def test_an_invalid_line_in_a_confirmed_run_answers_that_line_in_its_place(probe):
    out = probe.send(b"m1 publish --confirm ea a", b"m2 publish --confirm ea b",
                     b"m3 publish --confirm ea", b"m4 publish --confirm ea d")
    assert out == [b"m1 ok ", b"m2 ok ", b"m3 error EID", b"m4 ok "]
    assert probe.calls == [(b"ea", [b"m1", b"m2"]), (b"ea", [b"m4"])]
    assert [m.id for m in probe.broker.queues[b"q"].ready][-3:] == [b"m1", b"m2", b"m4"]


def test_on_a_durable_store_an_invalid_line_is_answered_before_the_confirms_before_it():
    """As one at a time: an error is written at once, a confirm once durable."""
    store = HeldStore()
    probe = durable_probe(store)
    out = probe.send(b"m1 publish --confirm ea a", b"m2 publish --confirm ea",
                     b"m3 publish --confirm ea c")
    assert out == [b"m2 error EID"]
    store.settle()
    assert probe.out() == [b"m1 ok ", b"m3 ok "]


def test_a_refused_confirmed_publish_gets_its_error_and_no_confirm(probe):
    probe.broker.declare_queue(b"full", QueueOptions(max_length=2, overflow="reject-publish"))
    probe.broker.reconfigure(b"full", add=[b"eb"])
    out = probe.send(b"m1 publish --confirm eb a", b"m2 publish eb b",
                     b"m3 publish --confirm eb c", b"m4 publish --confirm eb d")
    assert out == [b"m1 ok ", b"m3 error EID", b"m4 error EID"]
    assert [m.id for m in probe.broker.queues[b"full"].ready] == [b"m1", b"m2"]


def test_a_failed_batch_answers_each_confirmed_publish_of_the_run_with_an_error():
    lines = b"m1 publish --confirm ea a", b"m2 publish ea b", b"m3 publish --confirm ea c"
    answers = []
    for factory_class in (MQKSFactory, OneByOneFactory):  # the same as one at a time
        store = HeldStore()
        probe = durable_probe(store, factory_class)
        with capturedLogs() as events:
            probe.send(*lines)
            store.fail()
            answers.append(probe.out())
        errors = [e for e in events if "rid" in e]
        assert [e["rid"] for e in errors] == [b"m1", b"m3"]
        assert all("storage failed: disk full" in formatEvent(e) for e in errors)
    assert answers[0] == answers[1] == [b"m1 error EID", b"m3 error EID"]


def test_a_confirmed_run_that_stores_nothing_is_answered_without_waiting_for_later_lines():
    """Bound to no queue, it changes nothing: its confirm does not wait for the
    store batch the publishes after it start, as one at a time."""
    store = HeldStore()
    probe = durable_probe(store)
    probe.factory.check_event(b"nowhere")
    assert probe.send(b"m1 publish --confirm nowhere a", b"m2 publish --confirm ea b") == [
        b"m1 ok "]
    store.settle()
    assert probe.out() == [b"m2 ok "]
