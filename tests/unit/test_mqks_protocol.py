"""The MQKS protocol over StringTransport, with the broker on a fake clock."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.broker.core import Broker
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.storage.memory import MemoryStore

EID = re.compile(rb" error \d{20}[0-9a-zA-Z]{4}$")



class Harness:
    def __init__(self, max_line: int = 1024) -> None:
        self.clock = Clock()
        self.broker = Broker(MemoryStore(), self.clock)
        self.factory = MQKSFactory(self.broker, max_line=max_line)

    def connect(self):
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        protocol.makeConnection(transport)
        return Client(self, protocol, transport)


class Client:
    def __init__(self, harness, protocol, transport) -> None:
        self.harness, self.protocol, self.transport = harness, protocol, transport

    def send(self, *lines: str | bytes) -> None:
        for line in lines:
            data = line.encode() if isinstance(line, str) else line
            self.protocol.dataReceived(data + b"\n")
        self.harness.clock.advance(0)

    def lines(self) -> list[bytes]:
        self.harness.clock.advance(0)
        out = self.transport.value().splitlines()
        self.transport.clear()
        return out

    def close(self) -> None:
        self.protocol.connectionLost()


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_hello_world_from_the_spec(h):
    alice, bob, charlie, dave = (h.connect() for _ in range(4))
    alice.send("Alice consume greetings hi hello")
    bob.send("Bob consume greetings hi hello")
    charlie.send("Charlie consume greetings-and-byes hi hello bye good-bye")
    dave.send("Dave publish hello world")
    got = alice.lines() + bob.lines()
    assert got == [b"Alice ok Dave event=hello world"] or got == [b"Bob ok Dave event=hello world"]
    assert charlie.lines() == [b"Charlie ok Dave event=hello world"]
    assert dave.lines() == []


def test_confirms_are_bare_ok_with_trailing_space(h):
    c = h.connect()
    c.send("c1 consume --confirm q1 e1", "m1 publish --confirm e1 data with  spaces")
    assert c.lines() == [b"c1 ok ", b"m1 ok ", b"c1 ok m1 event=e1 data with  spaces"]


def test_short_lines_and_unknown_actions_get_error_ids(h):
    c = h.connect()
    c.send("x ping", "", "x  ping d", "r1 nope data")
    lines = c.lines()
    assert [line.split(b" ")[0] for line in lines] == [b"None", b"None", b"x", b"r1"]
    assert all(EID.search(line) for line in lines)
    c.send("p1 ping still here")
    assert c.lines() == [b"p1 ok still here"]


def test_settling_checks_ids_only_where_they_matched_nothing(h):
    c = h.connect()
    c.send("c consume --manual-ack q e", "m publish e x")
    assert c.lines() == [b"c ok m event=e x"]
    # a bad message id for a known consumer, and a bad consumer id (with or
    # without a bad message id), are errors; a good unknown id is ignored
    c.send("a1 ack c m\x01", "a2 ack c\x01 m", "a3 ack nobody m\x01", "a4 ack c m2")
    lines = c.lines()
    assert [line.split(b" ")[0] for line in lines] == [b"a1", b"a2", b"a3"]
    assert all(EID.search(line) for line in lines)
    c.send("a5 ack --confirm c m")
    assert c.lines() == [b"a5 ok "]
    assert h.broker.queues[b"q"].acked == 1


def test_crlf_and_trailing_spaces_are_stripped(h):
    c = h.connect()
    c.protocol.dataReceived(b"p1 ping hi  \r\n")
    assert c.lines() == [b"p1 ok hi"]


def test_confirm_only_counts_as_first_argument(h):
    c = h.connect()
    c.send("c consume q e", "m publish e --confirm")
    assert c.lines() == [b"c ok m event=e --confirm"]
    # "--confirm" with nothing after it is an event without data, not a confirm
    c.send("m2 publish --confirm", "m3 publish --confirm e")
    lines = c.lines()
    assert [line.split(b" ")[:2] for line in lines] == [[b"m2", b"error"], [b"m3", b"error"]]
    c.send("m4 publish --confirm  e x")  # an empty event after the flag
    assert c.lines()[0].startswith(b"m4 error ")


def test_round_robin_between_connections(h):
    a, b, p = h.connect(), h.connect(), h.connect()
    a.send("a consume q e")
    b.send("b consume q e")
    p.send(*[f"m{n} publish e {n}" for n in range(4)])
    assert a.lines() == [b"a ok m0 event=e 0", b"a ok m2 event=e 2"]
    assert b.lines() == [b"b ok m1 event=e 1", b"b ok m3 event=e 3"]


def test_update_goes_to_other_consumers_and_to_caller_on_add(h):
    a, b = h.connect(), h.connect()
    a.send("a consume --confirm q e1 --manual-ack")
    assert a.lines() == [b"a ok "]
    b.send("b consume --confirm q e1 e2 --delete-queue-when-unused=5")
    assert b.lines() == [b"b ok "]
    assert a.lines() == [b"a ok --update q e1 e2 --delete-queue-when-unused=5.0 --manual-ack"]
    b.send("b2 consume --confirm q --add e3 --delete-queue-when-unused=5")
    assert a.lines() == [b"a ok --update q e1 e2 e3 --delete-queue-when-unused=5.0 --manual-ack"]
    assert b.lines() == [
        b"b ok --update q e1 e2 e3 --delete-queue-when-unused=5.0",
        b"b2 ok --update q e1 e2 e3 --delete-queue-when-unused=5.0",
        b"b2 ok ",
    ]
    b.send("b3 consume --confirm q")  # omitting the flag clears it
    assert a.lines() == [b"a ok --update q e1 e2 e3 --manual-ack"]


def test_rebind_order_masks_and_confirm(h):
    c = h.connect()
    c.send("c consume q x")
    c.lines()
    c.send(
        "rb1 rebind --confirm q e3 e4 e5.id1.a1 e5.id2.a2",
        "rb2 rebind q --add e6 e7 --remove e3",
        "rb3 rebind --confirm q --remove-mask e5.*.a1 e5.*.a2 --add e8",
    )
    assert c.lines() == [
        b"c ok --update q e3 e4 e5.id1.a1 e5.id2.a2",
        b"rb1 ok ",
        b"c ok --update q e4 e5.id1.a1 e5.id2.a2 e6 e7",
        b"c ok --update q e4 e6 e7 e8",
        b"rb3 ok ",
    ]
    c.send("rb4 rebind --confirm q")
    assert c.lines() == [b"c ok --update q", b"rb4 ok "]


def test_rebind_before_first_consume_keeps_messages(h):
    c = h.connect()
    c.send("rb rebind q e", "m1 publish e early", "c consume q")
    assert c.lines() == [b"c ok m1 event=e early"]


def test_manual_ack_reject_and_ack_all(h):
    c = h.connect()
    c.send("c consume q e --manual-ack", "m1 publish e one", "m2 publish e two")
    assert c.lines() == [b"c ok m1 event=e one", b"c ok m2 event=e two"]
    c.send("r1 reject --confirm c m1")
    assert c.lines() == [b"r1 ok ", b"c ok m1 event=e,retry=1 one"]
    c.send("r2 reject c --all")
    assert c.lines() == [b"c ok m2 event=e,retry=1 two", b"c ok m1 event=e,retry=2 one"]
    c.send("a1 ack --confirm c --all", "a2 ack --confirm nobody m1", "a3 ack --confirm c unknown")
    assert c.lines() == [b"a1 ok ", b"a3 ok "]
    c.close()
    assert h.broker.queues[b"q"].ready == type(h.broker.queues[b"q"].ready)()


def test_acks_work_from_another_connection(h):
    a, b = h.connect(), h.connect()
    a.send("c consume q e --manual-ack", "m1 publish e one")
    a.lines()
    b.send("x ack --confirm c m1")
    assert b.lines() == [b"x ok "]
    a.close()
    assert not h.broker.queues[b"q"].ready


def test_disconnect_requeues_unacked_with_retry_in_order(h):
    a, b = h.connect(), h.connect()
    a.send("a consume q e --manual-ack", "m1 publish e 1", "m2 publish e 2")
    assert len(a.lines()) == 2
    a.close()
    b.send("b consume q e")
    assert b.lines() == [b"b ok m1 event=e,retry=1 1", b"b ok m2 event=e,retry=1 2"]
    assert b"a" not in h.factory.consumers


def test_delete_consumer_requeues_silently(h):
    a, b = h.connect(), h.connect()
    a.send("a consume q e --manual-ack", "m1 publish e 1")
    a.lines()
    b.send("d1 delete_consumer --confirm a", "d2 delete_consumer --confirm a")
    assert b.lines() == [b"d1 ok "]
    assert a.lines() == []
    b.send("b consume q")
    assert b.lines() == [b"b ok m1 event=e,retry=1 1"]


def test_delete_queue_updates_consumers_and_always_confirms(h):
    a, b = h.connect(), h.connect()
    a.send("a consume q e --manual-ack")
    b.send("d delete_queue --confirm q", "d2 delete_queue --confirm never-was", "m publish e x")
    assert a.lines() == [b"a ok --update q --manual-ack"]
    assert b.lines() == [b"d ok ", b"d2 ok "]
    assert b"q" not in h.broker.queues
    b.send("r reject --confirm a --all")
    assert b.lines() == []


def test_delete_queue_when_unused_with_and_without_delay(h):
    c = h.connect()
    c.send("c1 consume q1 e --delete-queue-when-unused", "d delete_consumer c1")
    assert b"q1" not in h.broker.queues
    c.send("c2 consume q2 e --delete-queue-when-unused=1", "d delete_consumer c2")
    h.clock.advance(0.5)
    c.send("m publish e kept")
    c.send("c3 consume q2 e --delete-queue-when-unused=1")
    assert c.lines() == [b"c3 ok m event=e kept"]
    c.send("d delete_consumer c3")
    h.clock.advance(1.1)
    assert b"q2" not in h.broker.queues


def test_consumer_id_reuse_replaces_the_old_one(h):
    a, b = h.connect(), h.connect()
    a.send("c consume q e --manual-ack", "m1 publish e 1")
    a.lines()
    b.send("c consume q e --manual-ack")
    assert b.lines() == [b"c ok m1 event=e,retry=1 1"]
    a.close()
    assert h.factory.consumers[b"c"].connection is b.protocol.connection


def test_ping(h):
    c = h.connect()
    c.send("p ping service1 and more")
    assert c.lines() == [b"p ok service1 and more"]


def test_eval_answers_stats_and_never_runs_code(h):
    c = h.connect()
    c.send("c consume q e", "e1 _eval WORKERS", "e2 _eval --worker=0 len(state.queues)")
    assert c.lines() == [b"e1 ok 1", b"e2 ok 1"]
    c.send("e3 _eval 1/0", "e4 _eval __import__('os')", "e5 _eval --worker=1 WORKERS")
    lines = c.lines()
    assert [line.split(b" ")[0] for line in lines] == [b"e3", b"e4", b"e5"]
    assert all(EID.search(line) for line in lines)


def test_eval_result_that_is_not_utf8_is_escaped(h):
    c = h.connect()
    c.send(b"e _eval '\\ud800'", b"n _eval 'a\\nb'")
    assert c.lines() == [b"e ok \\ud800", b"n ok a\\nb"]


def test_tab_is_ordinary_data(h):
    c = h.connect()
    c.send(b"t1 ping a\tb")
    assert c.lines() == [b"t1 ok a\tb"]


def test_line_over_the_limit_errors_and_closes():
    h = Harness(max_line=64)
    c = h.connect()
    c.protocol.dataReceived(b"p ping " + b"x" * 100)
    assert EID.search(c.transport.value().splitlines()[0])
    assert c.transport.disconnecting
    c2 = h.connect()
    c2.protocol.dataReceived(b"p ping " + b"x" * 100 + b"\np2 ping ok\n")
    assert c2.transport.value().startswith(b"None error ")
    assert b"p2 ok" not in c2.transport.value()


def test_transport_backpressure_pauses_delivery(h):
    a, p = h.connect(), h.connect()
    a.send("a consume q e")
    a.protocol.pauseProducing()
    p.send("m publish e x")
    assert a.lines() == []
    a.protocol.resumeProducing()
    assert a.lines() == [b"a ok m event=e x"]


# Requests whose effects do not depend on when deliveries happen, so that
# every chunking must give the same lines; only the interleaving of replies
# with (asynchronous) deliveries may differ.
SCRIPT = (
    b"c consume --confirm q e1 e2 --manual-ack\n"
    b"m1 publish e1 first message\n"
    b"m2 publish --confirm e2 second\r\n"
    b"p ping pong\n"
    b"rb rebind --confirm q --remove e2\n"
    b"m3 publish e2 dropped\n"
    b"m4 publish e1 last  one \n"
    b"bad\n"
)


def run_script(chunks: list[bytes]) -> list[bytes]:
    h = Harness()
    c = h.connect()
    for chunk in chunks:
        c.protocol.dataReceived(chunk)
        h.clock.advance(0)
    h.clock.advance(0)
    return [EID.sub(b" error EID", line) for line in c.transport.value().splitlines()]


def deliveries(lines: list[bytes]) -> list[bytes]:
    return [line for line in lines if line.startswith(b"c ok m")]


EXPECTED = run_script([SCRIPT])


def test_script_output():
    assert EXPECTED == [
        b"c ok ",
        b"m2 ok ",
        b"p ok pong",
        b"c ok --update q e1 --manual-ack",
        b"rb ok ",
        b"None error EID",
        b"c ok m1 event=e1 first message",
        b"c ok m2 event=e2 second",
        b"c ok m4 event=e1 last  one",
    ]


def same_as_whole(lines: list[bytes]) -> bool:
    return sorted(lines) == sorted(EXPECTED) and deliveries(lines) == deliveries(EXPECTED)


def test_every_single_split_point_gives_the_same_output():
    for cut in range(1, len(SCRIPT)):
        assert same_as_whole(run_script([SCRIPT[:cut], SCRIPT[cut:]])), cut


def test_byte_at_a_time_gives_the_same_output():
    assert same_as_whole(run_script([SCRIPT[i : i + 1] for i in range(len(SCRIPT))]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(SCRIPT) - 1), max_size=12))
def test_any_chunking_gives_the_same_output(cuts):
    points = sorted(set(cuts))
    chunks = [SCRIPT[a:b] for a, b in zip([0, *points], [*points, len(SCRIPT)], strict=True)]
    assert same_as_whole(run_script(chunks))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_garbage_never_crashes_and_the_connection_still_answers(data):
    h = Harness(max_line=512)
    c = h.connect()
    c.protocol.dataReceived(data.replace(b"_eval", b"ping"))
    h.clock.advance(0)
    if not c.transport.disconnecting:
        c.transport.clear()
        c.protocol.dataReceived(b"\nzz ping alive\n")
        h.clock.advance(0)
        assert c.transport.value().endswith(b"zz ok alive\n")


def test_confirm_waits_until_the_store_made_it_durable():
    from twisted.internet.defer import Deferred

    class SlowDurable(MemoryStore):
        durable = True
        pending: list = []

        def apply(self, ops):
            d = Deferred()
            self.pending.append(d)
            return d

    h = Harness()
    h.broker = Broker(SlowDurable(), h.clock)
    h.factory = MQKSFactory(h.broker)
    c = h.connect()
    c.send("rb rebind q e")
    SlowDurable.pending.pop().callback(None)
    c.send("m1 publish --confirm e data", "p ping now")
    assert c.lines() == [b"p ok now"]
    SlowDurable.pending.pop().callback(None)
    assert c.lines() == [b"m1 ok "]


class SlowDurable(MemoryStore):
    """A durable store whose batches become durable when the test says so."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list = []

    def apply(self, ops):
        from twisted.internet.defer import Deferred

        d = Deferred()
        self.pending.append(d)
        return d


def slow_harness() -> tuple[Harness, SlowDurable]:
    h = Harness()
    store = SlowDurable()
    h.broker = Broker(store, h.clock)
    h.factory = MQKSFactory(h.broker)
    return h, store


def test_a_consume_confirm_comes_before_its_deliveries_while_the_store_is_busy():
    """The original answered ``ok `` and then delivered.  A queue with messages
    ready and a store batch in flight (a consumer that just left returned its
    messages) must not deliver to the new consumer before its confirm."""
    h, store = slow_harness()
    old, new = h.connect(), h.connect()
    old.send("a consume q e --manual-ack", "m1 publish e one", "m2 publish e two")
    while store.pending:
        store.pending.pop().callback(None)
    assert old.lines() == [b"a ok m1 event=e one", b"a ok m2 event=e two"]
    old.close()  # both back in q with retry=1: a store batch in flight
    new.send("c consume --confirm q e")
    assert new.lines() == []  # nothing before the confirm, which waits for the store
    new.protocol.pauseProducing()  # the transport filled up...
    new.protocol.resumeProducing()  # ...and drained: the connection's pauses end
    h.clock.advance(0)
    assert new.lines() == []
    [consumer] = h.factory.consumers[b"c"].connection.consumers.values()
    assert consumer.paused and [len(x) for x in new.protocol._held.values()] == [1]
    while store.pending:
        store.pending.pop().callback(None)
    assert new.lines() == [b"c ok ", b"c ok m1 event=e,retry=1 one",
                           b"c ok m2 event=e,retry=1 two"]
    new.send("m3 publish e three")
    assert new.lines() == [b"c ok m3 event=e three"]


def test_a_held_consumer_gone_before_its_confirm_gets_nothing_more():
    h, store = slow_harness()
    c = h.connect()
    c.send("rb rebind q e", "m1 publish e one")
    c.send("c consume --confirm q", "d delete_consumer c")
    assert c.lines() == []
    while store.pending:
        store.pending.pop().callback(None)
    assert c.lines() == [b"c ok "]
    other = h.connect()
    other.send("c2 consume q")
    assert other.lines() == [b"c2 ok m1 event=e one"]


def test_ping_and_eval_strip_confirm_as_the_original(h):
    """``--confirm`` first is stripped from every action; ping also confirms
    (after the pong), so the original client's ``ping(confirm=True)`` returns."""
    c = h.connect()
    c.send("p1 ping --confirm hello", "e1 _eval --confirm 1+1", "p2 ping --confirm",
           "p3 ping x --confirm", "e2 _eval --confirm --worker=0 WORKERS")
    assert c.lines() == [b"p1 ok hello", b"p1 ok ", b"e1 ok 2", b"p2 ok --confirm",
                         b"p3 ok x --confirm", b"e2 ok 1"]


def test_config_workers_lists_the_listeners(h):
    """stats.py splits ``' '.join(config['workers'])`` into host:port:port entries."""
    h.factory.listening(IPv4Address("TCP", "127.0.0.1", 25000))
    h.factory.listening(IPv4Address("TCP", "10.0.0.5", 25001))
    c = h.connect()
    c.send("w _eval ' '.join(config['workers'])", "h _eval config['host']",
           "p _eval config['port_for_clients']", "g _eval get_worker('q1')")
    assert c.lines() == [b"w ok 127.0.0.1:25000:25000 10.0.0.5:25001:25001",
                         b"h ok 127.0.0.1", b"p ok 25000", b"g ok 0"]


def test_a_publish_is_delivered_within_the_chunk_that_made_it():
    """The pump runs at the end of the received chunk: no reactor turn between a
    publish and its delivery (a consumer on the same connection gets it in the
    same write as the chunk's replies)."""
    h = Harness()
    c = h.connect()
    c.send("c1 consume q e")
    c.transport.clear()
    c.protocol.dataReceived(b"m1 publish e one\np ping x\n")
    assert c.transport.value() == b"p ok x\nc1 ok m1 event=e one\n"
    assert not h.clock.getDelayedCalls()


def test_the_pump_at_the_end_of_a_chunk_stays_bounded():
    """A backlog larger than the dispatch batch is not dispatched in one go by
    the chunk that woke it: the rest goes to later turns."""
    h = Harness()
    h.broker = Broker(MemoryStore(), h.clock, dispatch_batch=3)
    h.factory = MQKSFactory(h.broker)
    publisher, consumer = h.connect(), h.connect()
    publisher.send("rb rebind q e")
    publisher.protocol.dataReceived(b"".join(b"m%d publish e x\n" % n for n in range(8)))
    consumer.protocol.dataReceived(b"c1 consume q\n")
    assert len(consumer.transport.value().splitlines()) == 3
    assert h.clock.getDelayedCalls()  # the pump comes back next turn
    h.clock.advance(0)
    assert len(consumer.transport.value().splitlines()) == 8


def test_deliveries_to_another_connection_are_written_at_the_end_of_the_chunk():
    """A publish's delivery to a consumer on another connection is written when
    the publisher's chunk ends, not by a timer; a delivery made outside any
    chunk (the pump's next turn) still is."""
    h = Harness()
    h.broker = Broker(MemoryStore(), h.clock, dispatch_batch=2)
    h.factory = MQKSFactory(h.broker)
    publisher, consumer = h.connect(), h.connect()
    consumer.send("c1 consume q e")
    consumer.transport.clear()
    publisher.protocol.dataReceived(b"m1 publish e one\n")
    assert consumer.transport.value() == b"c1 ok m1 event=e one\n"
    assert not h.clock.getDelayedCalls()
    publisher.protocol.dataReceived(b"m2 publish e x\nm3 publish e x\nm4 publish e x\n")
    assert len(consumer.transport.value().splitlines()) == 3  # a batch of two so far
    h.clock.advance(0)
    assert len(consumer.transport.value().splitlines()) == 4
    assert h.factory.chunk_outputs is None


def _publish_as_specified(line: bytes) -> tuple[bool, bytes, bytes] | None:
    """(confirm, event, body) of a publish line, or None for an error: the
    original server's reading (``--confirm`` only as the first word)."""
    parts = line.rstrip().split(b" ", 2)
    if len(parts) != 3:
        return None
    event, space, body = parts[2].partition(b" ")
    confirm = event == b"--confirm" and bool(space)
    if confirm:
        event, _, body = body.partition(b" ")
    if not event or not body:
        return None
    return confirm, event, body


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"ev", b"--confirm", b"x", b"", b"  ", b"a-b"]), max_size=5),
       st.sampled_from([b"", b" ", b"\r"]))
def test_publish_reads_its_words_as_the_original_did(words, tail):
    h = Harness()
    c = h.connect()
    line = b" ".join([b"m1", b"publish", *words]) + tail
    published = []
    publish = h.broker.publish_event
    h.broker.publish_event = lambda *args: published.append(args[:3]) or publish(*args)
    c.send(line)
    got = c.lines()
    expected = _publish_as_specified(line)
    if expected is None:
        assert published == [] and len(got) == 1 and EID.search(got[0])
        return
    confirm, event, body = expected
    assert published == [(event, b"m1", body)]
    assert got == ([b"m1 ok "] if confirm else [])


def test_a_chunk_dispatches_at_its_end_without_a_timer(h):
    consumer, producer = h.connect(), h.connect()
    consumer.send("c1 consume q ev")
    assert h.clock.getDelayedCalls() == []
    producer.protocol.dataReceived(b"m1 publish ev one\nm2 publish ev two\n")
    # delivered by the chunk's pump_now: no callLater was made for it
    assert h.clock.getDelayedCalls() == []
    assert consumer.transport.value() == b"c1 ok m1 event=ev one\nc1 ok m2 event=ev two\n"


def test_a_publish_outside_any_chunk_still_dispatches_at_the_next_turn(h):
    consumer = h.connect()
    consumer.send("c1 consume q ev")
    h.broker.publish_event(b"ev", b"m1", b"one")
    assert consumer.transport.value() == b""
    assert consumer.lines() == [b"c1 ok m1 event=ev one"]
