"""The PHPMQ protocol over StringTransport, with the broker on a fake clock.

The ``phpmq`` harness fixture lives in tests/unit/conftest.py.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs

from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.protocols.phpmq import codec

HEX_ID = re.compile(rb"^[0-9a-f]{32}$")


@pytest.fixture
def h(phpmq):
    return phpmq()


def test_spec_walkthrough_with_ttl_300_seconds_later(phpmq):
    h = phpmq(revision=2018)
    publisher, consumer = h.connect(), h.connect()
    publisher.send(codec.publish(b"Foo", b"Hello World", 3600))
    assert publisher.transport.value() == b""  # no receipt
    h.clock.advance(300)
    consumer.send(codec.consume(b"Foo", 5))
    wire = consumer.transport.value()
    [frame] = consumer.frames()
    message_id = frame.packages[codec.MESSAGE_ID]
    assert HEX_ID.match(message_id)
    assert wire == codec.dispatch(b"Foo", b"Hello World", message_id, 3300)
    assert wire.startswith(b"H0100304P0100000000000000000000000000003Foo")
    assert wire.endswith(b"P0500000000000000000000000000004" b"3300")
    consumer.send(codec.ack(b"Foo", message_id))
    assert h.broker.queues[b"Foo"].in_flight() == 0
    assert not h.broker.queues[b"Foo"].ready


def test_ids_are_new_32_hex_characters_per_message(h):
    c = h.connect()
    c.publish(b"q", b"a", b"a")
    c.send(codec.consume(b"q", 10))
    ids = c.ids()
    assert len(set(ids)) == 2 and all(HEX_ID.match(i) for i in ids)


def test_revision_is_2017_until_a_2018_only_frame(h):
    c, p = h.connect(), h.connect()
    c.send(codec.publish(b"q", b"old style"), codec.consume(b"q", 10))
    [first] = c.frames()
    assert len(first.packages) == 3 and first.revision == 2017
    c.send(codec.publish(b"q", b"new style", 0))
    [second] = c.frames()
    assert second.packages == {1: b"q", 2: b"new style", 3: second.packages[3], 5: b"0"}
    p.send(codec.publish(b"q", b"from a 2017 publisher"))
    assert c.frames()[0].revision == 2018  # a connection never goes back to 2017


@pytest.mark.parametrize(
    "frame", [codec.requeue(b"q", b"nope", 5), codec.dead_letter(b"q", b"nope")]
)
def test_requeue_and_dead_letter_also_reveal_2018(h, frame):
    c = h.connect()
    c.send(frame, codec.consume(b"q", 1))
    c.publish(b"q", b"x")
    assert c.frames()[0].revision == 2018


def test_fixed_revision_2017(phpmq):
    h = phpmq(revision=2017)
    c = h.connect()
    c.send(codec.publish(b"q", b"x", 60), codec.consume(b"q", 1))
    assert c.frames()[0].revision == 2017


def test_window_refills_after_each_ack(h):
    c = h.connect()
    c.publish(b"q", b"1", b"2", b"3", b"4")
    c.send(codec.consume(b"q", 2))
    frames = c.frames()
    assert [f.packages[2] for f in frames] == [b"1", b"2"]
    c.send(codec.ack(b"q", b"unknown id"), codec.ack(b"other", frames[0].packages[3]))
    assert c.frames() == []
    c.send(codec.ack(b"q", frames[0].packages[3]))
    assert c.bodies() == [b"3"]
    c.publish(b"q", b"5")
    assert c.bodies() == []
    assert h.ready(b"q") == [b"4", b"5"]


def test_count_zero_delivers_nothing_and_stops_consuming(h):
    c = h.connect()
    c.publish(b"q", b"1", b"2")
    c.send(codec.consume(b"q", 0))
    assert c.frames() == []
    c.send(codec.consume(b"q", 1))
    assert c.bodies() == [b"1"]
    c.send(codec.consume(b"q", 0))
    assert c.frames() == []
    assert h.ready(b"q") == [b"1", b"2"]
    assert h.broker.queues[b"q"].consumers == []


def test_second_consume_replaces_the_first_and_returns_its_messages(h):
    c, other = h.connect(), h.connect()
    c.publish(b"q", b"1", b"2", b"3")
    c.send(codec.consume(b"q", 2))
    assert c.bodies() == [b"1", b"2"]
    c.send(codec.consume(b"elsewhere", 5))
    assert c.frames() == []
    assert h.ready(b"q") == [b"1", b"2", b"3"]
    other.send(codec.consume(b"q", 5))
    assert other.bodies() == [b"1", b"2", b"3"]
    assert len(h.broker.queues[b"q"].consumers) == 1


def test_second_consume_on_the_same_queue_redelivers_with_the_new_window(h):
    c = h.connect()
    c.publish(b"q", b"1", b"2", b"3")
    c.send(codec.consume(b"q", 2))
    first = c.ids()
    c.send(codec.consume(b"q", 1))
    assert c.ids() == first[:1]


def test_requeue_goes_to_the_tail_with_a_new_ttl_and_frees_credit(phpmq):
    h = phpmq(revision=2018)
    c = h.connect()
    c.publish(b"q", b"a", b"b")
    c.send(codec.consume(b"q", 1))
    [a] = c.frames()
    assert a.packages[codec.TTL] == b"0"
    c.send(codec.requeue(b"q", a.packages[3], 60))
    [b] = c.frames()
    assert b.packages[2] == b"b"
    h.clock.advance(10)
    c.send(codec.ack(b"q", b.packages[3]))
    [again] = c.frames()
    assert again.packages == {1: b"q", 2: b"a", 3: a.packages[3], 5: b"50"}
    c.send(codec.requeue(b"q", a.packages[3], 0))  # 0: no expiry any more
    assert c.frames()[0].packages[codec.TTL] == b"0"


def test_requeue_with_a_short_ttl_expires_before_redelivery(h):
    c = h.connect()
    c.publish(b"q", b"a", b"b")
    c.send(codec.consume(b"q", 1))
    [a] = c.frames()
    c.send(codec.requeue(b"q", a.packages[3], 5))
    [b] = c.frames()
    assert b.packages[2] == b"b"
    h.clock.advance(6)
    c.send(codec.ack(b"q", b.packages[3]))
    assert c.frames() == []
    assert h.broker.queues[b"q"].expired == 1


def test_dead_letter_without_target_deletes(h):
    c = h.connect()
    c.publish(b"q", b"a", b"b")
    c.send(codec.consume(b"q", 1))
    [a] = c.frames()
    c.send(codec.dead_letter(b"q", a.packages[3]))
    assert c.bodies() == [b"b"]
    assert set(h.broker.queues) == {b"q"}
    assert h.broker.queues[b"q"].dead_lettered == 1


def test_dead_letter_suffix_moves_dead_and_expired_messages(phpmq):
    h = phpmq(dead_letter_suffix=b".dead")
    c = h.connect()
    c.send(codec.publish(b"q", b"a"), codec.publish(b"q", b"short", 5), codec.publish(b"q", b"b"))
    assert h.broker.queues[b"q"].options.dead_letter == b"q.dead"
    h.clock.advance(6)
    h.broker.expire_due()
    c.send(codec.consume(b"q", 1))
    [a] = c.frames()
    c.send(codec.dead_letter(b"q", a.packages[3]))
    assert c.bodies() == [b"b"]
    d = h.connect()
    d.send(codec.consume(b"q.dead", 10))
    dead = d.frames()
    assert [f.packages[2] for f in dead] == [b"short", b"a"]
    assert dead[1].packages[3] == a.packages[3]
    assert h.broker.queues[b"q.dead"].options.dead_letter is None  # no q.dead.dead


def test_dead_letter_suffix_applies_to_queues_made_elsewhere_but_keeps_a_set_target(phpmq):
    h = phpmq(dead_letter_suffix=b"-dlq")
    h.broker.declare_queue(b"plain")
    h.broker.publish_to_queue(b"plain", b"m", b"x")
    h.broker.declare_queue(b"set")
    h.broker.reconfigure(b"set", options=type(h.broker.queues[b"set"].options)(dead_letter=b"mine"))
    c = h.connect()
    c.send(codec.consume(b"plain", 1), codec.publish(b"set", b"y"))
    assert h.broker.queues[b"plain"].options.dead_letter == b"plain-dlq"
    assert h.broker.queues[b"set"].options.dead_letter == b"mine"
    assert c.bodies() == [b"x"]


def test_expired_messages_are_never_delivered_and_ttl_counts_down(phpmq):
    h = phpmq(revision=2018)
    c = h.connect()
    c.send(codec.publish(b"q", b"gone", 10), codec.publish(b"q", b"kept", 100))
    h.clock.advance(10)
    c.send(codec.consume(b"q", 5))
    [kept] = c.frames()
    assert (kept.packages[2], kept.packages[5]) == (b"kept", b"90")


def test_ack_from_another_connection_frees_the_holders_credit(h):
    a, b = h.connect(), h.connect()
    a.publish(b"q", b"1", b"2")
    a.send(codec.consume(b"q", 1))
    [one] = a.frames()
    b.send(codec.ack(b"q", one.packages[3]))
    assert a.bodies() == [b"2"]


def test_requeue_and_dead_letter_from_another_connection(h):
    a, b = h.connect(), h.connect()
    a.publish(b"q", b"1", b"2", b"3")
    a.send(codec.consume(b"q", 2))
    one, two = a.frames()
    b.send(codec.requeue(b"q", one.packages[3], 0), codec.dead_letter(b"q", two.packages[3]))
    assert a.bodies() == [b"3", b"1"]
    assert h.broker.queues[b"q"].dead_lettered == 1


def test_several_consumers_share_each_message_goes_to_one(h):
    a, b, p = h.connect(), h.connect(), h.connect()
    a.send(codec.consume(b"q", 10))
    b.send(codec.consume(b"q", 10))
    p.publish(b"q", *[b"%d" % n for n in range(6)])
    got_a, got_b = a.bodies(), b.bodies()
    assert got_a == [b"0", b"2", b"4"]
    assert got_b == [b"1", b"3", b"5"]


def test_disconnect_requeues_unacked_in_original_order(h):
    a, b, p = h.connect(), h.connect(), h.connect()
    p.publish(b"q", *[b"%d" % n for n in range(1, 6)])
    a.send(codec.consume(b"q", 3))
    assert a.bodies() == [b"1", b"2", b"3"]
    b.send(codec.consume(b"q", 1))
    [four] = b.frames()
    a.close()
    assert h.ready(b"q") == [b"1", b"2", b"3", b"5"]
    got = []
    frame = four
    for _ in range(4):
        b.send(codec.ack(b"q", frame.packages[3]))
        [frame] = b.frames()
        got.append(frame.packages[2])
    assert got == [b"1", b"2", b"3", b"5"]
    assert h.broker.queues[b"q"].requeued == 3


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\n", "bad message header flag b'G'"),
        (b"H0100202P01000000000000000000000000x03", "non-digit package header"),
        (b"H0100702", "unknown message type 007"),
        (b"H0200202", "unsupported protocol version 02"),
        (b"H0100203", "message type 002 (consume) cannot have 03 packages"),
        (codec.publish(b"q", b"x" * 65), "content length 65 above the limit of 64"),
        (codec.dispatch(b"q", b"x", b"id"), "type 003 (dispatch) is only sent by servers"),
        (codec.consume(b"q", 1)[:-1] + b"x", "count is not a decimal number: b'x'"),
        (codec.publish(b"q", b"x", 0)[:-1] + b"-", "TTL is not a decimal number"),
        (codec.publish(b"", b"x"), "empty queue name"),
    ],
)
def test_malformed_frames_close_only_that_connection_with_a_log_line(phpmq, data, reason):
    h = phpmq(max_content=64)
    bad, good = h.connect(), h.connect()
    good.send(codec.consume(b"q", 5))
    line = bad.close_reason(codec.publish(b"q", b"before") + data + codec.publish(b"q", b"after"))
    assert reason in line
    assert "phpmq connection 1 from 127.0.0.1:5555" in line
    bad.send(codec.publish(b"q", b"ignored once closing"))
    assert good.bodies() == [b"before"]
    good.publish(b"q", b"still served")
    assert good.bodies() == [b"still served"]


def test_a_closing_connection_gets_no_more_deliveries_and_returns_its_messages(h):
    bad, p = h.connect(), h.connect()
    p.publish(b"q", b"1")
    bad.send(codec.consume(b"q", 5))
    assert bad.bodies() == [b"1"]
    bad.close_reason(b"garbage!")
    p.publish(b"q", b"2")
    assert bad.transport.value() == b""
    bad.close()
    assert h.ready(b"q") == [b"1", b"2"]


def test_transport_backpressure_pauses_delivery(h):
    c = h.connect()
    c.send(codec.consume(b"q", 10))
    c.protocol.pauseProducing()
    c.publish(b"q", b"x")
    assert c.frames() == []
    c.protocol.resumeProducing()
    assert c.bodies() == [b"x"]


def test_deliveries_of_one_turn_are_one_write(h):
    c = h.connect()
    writes = []
    c.transport.write = writes.append
    c.send(codec.consume(b"q", 100))
    c.publish(b"q", *[b"%d" % n for n in range(50)])
    assert len(writes) == 1
    assert len(codec.decode(writes[0])) == 50


def test_queue_deleted_elsewhere_ends_consumption(h):
    c = h.connect()
    c.send(codec.consume(b"q", 1))
    assert h.broker.delete_queue(b"q")
    assert c.protocol.consumer is None
    c.publish(b"q", b"new queue")
    assert c.frames() == []
    c.send(codec.consume(b"q", 1))
    assert c.bodies() == [b"new queue"]


def test_cross_protocol_with_mqks_on_one_broker(h):
    mqks = MQKSFactory(h.broker).buildProtocol(None)
    transport = StringTransport()
    mqks.makeConnection(transport)
    mqks.dataReceived(b"c consume Foo --manual-ack\nx rebind Bar ev\nm1 publish ev from mqks\n")
    c = h.connect()
    c.send(codec.publish(b"Foo", b"from\nphpmq"), codec.consume(b"Bar", 1))
    [frame] = c.frames()
    assert (frame.packages[1], frame.packages[2], frame.packages[3]) == (b"Bar", b"from mqks", b"m1")
    assert transport.value().startswith(b"c ok ")
    assert transport.value().endswith(b" event=Foo from\\nphpmq\n")


# A script whose output cannot depend on how it is chunked.
SCRIPT = b"".join([
    codec.publish(b"q", b"one"),
    codec.publish(b"q", b"two", 3600),
    codec.consume(b"q", 2),
    codec.publish(b"q", b"three\n"),
    codec.ack(b"q", b"not an id"),
    codec.publish(b"r", b""),
])


def run_script(phpmq, chunks: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    h = phpmq()
    c = h.connect()
    for chunk in chunks:
        c.protocol.dataReceived(chunk)
        h.clock.advance(0)
    return [(f.packages[1], f.packages[2], f.packages[5]) for f in c.frames()]


def test_script_output(phpmq):
    assert run_script(phpmq, [SCRIPT]) == [(b"q", b"one", b"0"), (b"q", b"two", b"3600")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(SCRIPT) - 1), max_size=12))
def test_any_chunking_gives_the_same_output(phpmq, cuts):
    points = sorted(set(cuts))
    chunks = [SCRIPT[a:b] for a, b in zip([0, *points], [*points, len(SCRIPT)], strict=True)]
    assert run_script(phpmq, chunks) == [(b"q", b"one", b"0"), (b"q", b"two", b"3600")]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 64))
def test_arbitrary_bytes_never_raise_out_of_the_protocol(phpmq, data, chunk):
    h = phpmq(max_content=256)
    c = h.connect()
    with capturedLogs() as events:
        for i in range(0, len(data), chunk):
            c.protocol.dataReceived(data[i : i + chunk])
        h.clock.advance(0)
        c.close()
    assert not [e for e in events if e.get("log_failure") is not None]
    assert h.broker.connections == {}
