"""Names, ids, header counts and frame counts over their limits, protocol by protocol.

Each protocol answers a broken limit its own way: MQKS with an error reply
(and keeps the connection), PHPMQ by closing that connection with a log
line, ZMTP with an ERROR command and a close, eMQP by dropping the message
with a log line (HTTP's 400s are in tests/unit/web/test_web_limits.py).
"""

from __future__ import annotations

import json

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.python import usage

from mqserver import tap
from mqserver.broker.core import Broker
from mqserver.limits import LimitError, Limits, find_control
from mqserver.protocols.emqp import codec as emqp
from mqserver.protocols.emqp.codec import EMQPError
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.protocols.phpmq import codec as phpmq_codec
from mqserver.storage.memory import MemoryStore
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.decoder import MessageDecoder
from mqserver.zmtp.router import ZMTPRouterFactory

SMALL = Limits(max_name=8, max_id=6, max_headers=2, max_names=3)


# -- the rules ------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"q", b"x" * 8, "caf\u00e9".encode(), b"\xff\xfe", b"a b", b"a.*"])
def test_names_within_the_rules_pass_unchanged(value):
    assert SMALL.check_name(value) == value


@pytest.mark.parametrize(("value", "reason"), [
    (b"", "empty"),
    (b"x" * 9, "9 bytes; at most 8"),
    (b"a\x00b", "control character"),
    (b"a\tb", "control character"),
    (b"a\nb", "control character"),
    (b"\x7f", "control character"),
])
def test_names_breaking_the_rules_are_refused_with_the_reason(value, reason):
    with pytest.raises(LimitError, match=reason):
        SMALL.check_name(value, "queue name")


def test_find_control_matches_the_checks_at_the_edges():
    """The inlined fast test (length, then ``find_control``) accepts exactly what the checks do."""
    for value in (b"x" * 6, b"Az09", b" ~\x80\xff", b"\xe9t\xe9", b"a\x1f", b"\x7f", b"\x00",
                  b"x" * 7, b"xy\x00", b""):
        fast = 0 < len(value) <= SMALL.max_id and (
            value.isalnum() or find_control(value) is None
        )
        try:
            SMALL.check_id(value)
        except LimitError:
            assert not fast, value
        else:
            assert fast, value
    assert find_control(b"a\x1fb").group() == b"\x1f"
    assert find_control(b"\x20\x7e\x80") is None


def test_every_byte_value_is_checked_as_find_control_would():
    # the checks test a translation, not find_control's search: each of the
    # 256 byte values, alone and inside a uuid-shaped id, gets the same verdict
    limits = Limits()
    for n in range(256):
        for value in (bytes([n]), b"0c1e5b2a-7d2e-4f0b-9c3a-" + bytes([n]) + b"5e2f1a6b7c8"):
            try:
                limits.check_id(value)
                passed = True
            except LimitError:
                passed = False
            assert passed == (find_control(value) is None), value


def test_ids_have_their_own_length_and_the_callers_error_type():
    assert SMALL.check_id(b"123456") == b"123456"
    with pytest.raises(KeyError, match="request id of 7 bytes"):
        SMALL.check_id(b"1234567", "request id", KeyError)


def test_header_count():
    SMALL.check_headers(2)
    with pytest.raises(LimitError, match="3 headers; at most 2"):
        SMALL.check_headers(3)


def test_name_count():
    SMALL.check_names(3)
    with pytest.raises(LimitError, match="4 events in one request; at most 3"):
        SMALL.check_names(4, "events")


def test_from_config_reads_the_twistd_options_and_defaults_the_rest():
    limits = Limits.from_config({"max-name-bytes": 10, "max-id-bytes": 20, "max-headers": 3,
                                 "max-names-per-request": 4})
    assert limits == Limits(10, 20, 3, 4)
    assert Limits.from_config({}) == Limits(255, 255, 64, 10_000)


# -- MQKS: an error reply; the connection stays ---------------------------------------


@pytest.fixture
def mqks():
    broker = Broker(MemoryStore(), Clock())
    protocol = MQKSFactory(broker, max_line=1024, limits=SMALL).buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
    protocol.makeConnection(transport)

    def send(*lines: bytes) -> list[bytes]:
        protocol.dataReceived(b"".join(line + b"\n" for line in lines))
        broker.clock.advance(0)
        out = transport.value().splitlines()
        transport.clear()
        return out

    send.broker = broker  # type: ignore[attr-defined]
    send.transport = transport  # type: ignore[attr-defined]
    send.factory = protocol.factory  # type: ignore[attr-defined]
    return send


@pytest.mark.parametrize("line", [
    b"c1 consume q123456789",
    b"c1 consume q e123456789",
    b"c1 consume q --add e123456789",
    b"r1 rebind q --remove-mask e.*.123456789",
    b"m1 publish e123456789 body",
    b"m1 publish e\x01 body",
    b"a1 ack c1234567 m",
    b"a1 reject c m1234567",
    b"d1 delete_consumer c1234567",
    b"d1 delete_queue q123456789",
])
def test_mqks_names_and_ids_over_the_limit_get_an_error_reply(mqks, line):
    with capturedLogs() as events:
        [reply] = mqks(line, b"p ping alive")[:1]
    assert reply.startswith(line.split(b" ")[0] + b" error ")
    assert any("at most" in formatEvent(e) or "control" in formatEvent(e) for e in events)
    assert not mqks.transport.disconnecting
    assert mqks(b"p ping alive") == [b"p ok alive"]
    assert not mqks.broker.queues


@pytest.mark.parametrize("request_id", [b"r1234567", b"r\x01"])
def test_mqks_a_bad_request_id_is_not_echoed(mqks, request_id):
    [reply] = mqks(request_id + b" ping x")
    assert reply.startswith(b"None error ")


def test_mqks_names_at_the_limit_work(mqks):
    assert mqks(b"c12345 consume --confirm q1234567 e1234567") == [b"c12345 ok "]
    assert mqks(b"m12345 publish e1234567 hi") == [b"c12345 ok m12345 event=e1234567 hi"]


@pytest.mark.parametrize("line", [
    b"c1 consume q a b c d",
    b"c1 consume --confirm q a b --add c d --manual-ack",
    b"r1 rebind q a --remove b --remove-mask c.* --add d",
    b"r1 rebind --confirm q a b c d",
    b"c1 consume q " + b"e " * 400,  # refused before it is split into words
    b"c1 consume q " + b"e  " * 300,
])
def test_mqks_more_events_than_max_names_get_an_error_reply(mqks, line):
    with capturedLogs() as events:
        [reply] = mqks(line)
    assert reply.startswith(line.split(b" ")[0] + b" error ")
    assert any("--max-names-per-request" in formatEvent(e) for e in events)
    assert not mqks.broker.queues and not mqks.broker.bindings.by_queue
    assert mqks(b"p ping alive") == [b"p ok alive"]


def test_mqks_events_at_the_name_count_limit_work(mqks):
    assert mqks(b"c1 consume --confirm q a b --add c --manual-ack --delete-queue-when-unused=5"
                b" --max-length=9 --overflow=drop-head")[-1] == b"c1 ok "
    assert mqks(b"r1 rebind --confirm q a --remove-mask c.* --add d")[-1] == b"r1 ok "
    assert mqks.broker.bindings.events_of(b"q") == {b"a", b"d"}


# -- PHPMQ: a logged close of that connection only --------------------------------------


@pytest.mark.parametrize("frame", [
    phpmq_codec.publish(b"q123456789", b"body"),
    phpmq_codec.publish(b"q\nx", b"body"),
    phpmq_codec.consume(b"q123456789", 1),
    phpmq_codec.ack(b"q", b"m1234567"),
    phpmq_codec.dead_letter(b"q", b"\x00"),
])
def test_phpmq_names_and_ids_over_the_limit_close_that_connection(phpmq, frame):
    h = phpmq(limits=SMALL)
    bad, good = h.connect(), h.connect()
    with capturedLogs() as events:
        bad.send(frame)
    assert bad.transport.disconnecting
    assert any("closed by the server" in formatEvent(e) for e in events)
    good.publish(b"q", b"still served")
    assert h.ready(b"q") == [b"still served"]
    assert not good.transport.disconnecting


# -- ZMTP: frames per message ------------------------------------------------------------


class _Handler:
    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []

    def router_started(self, router): ...
    def router_stopped(self, router): ...
    def peer_connected(self, router, identity): ...
    def peer_disconnected(self, router, identity): ...

    def messages_received(self, router, identity, messages):
        self.messages.extend(messages)


def _zmtp_peer(router: ZMTPRouterFactory, minor: int) -> tuple[object, StringTransport]:
    protocol = router.buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 4000))
    protocol.makeConnection(transport)
    protocol.dataReceived(zmtp.greeting(minor) + zmtp.ready_command(b"DEALER", b"me"))
    transport.clear()
    return protocol, transport


def _commands(transport: StringTransport) -> list[tuple[bytes, bytes]]:
    decoded = MessageDecoder(2**20, 64).feed(transport.value())
    return [zmtp.parse_command(body) for body in decoded if isinstance(body, bytes)]


def test_zmtp_frames_per_message_at_and_over_the_limit():
    handler = _Handler()
    router = ZMTPRouterFactory(handler, "test", max_frames=4)
    protocol, transport = _zmtp_peer(router, minor=1)
    protocol.dataReceived(zmtp.encode_message([b"a", b"b", b"c", b"d"]))
    assert handler.messages == [[b"a", b"b", b"c", b"d"]]
    protocol.dataReceived(zmtp.encode_message([b""] * 5))
    assert transport.disconnecting
    [(name, data)] = _commands(transport)
    assert name == b"ERROR" and b"more than 4 frames" in data
    assert len(handler.messages) == 1


def test_zmtp_a_too_large_frame_gets_error_then_close_from_a_3_1_peer_only():
    for minor, expected in ((1, [b"ERROR"]), (0, [])):
        router = ZMTPRouterFactory(_Handler(), "test", max_message_size=100)
        protocol, transport = _zmtp_peer(router, minor)
        protocol.dataReceived(zmtp.encode_message([b"x" * 101]))
        assert transport.disconnecting
        assert [name for name, _ in _commands(transport)] == expected


# -- eMQP: a dropped message -------------------------------------------------------------


def test_emqp_msgid_queue_topic_headers_and_worker_queues_obey_the_limits():
    with pytest.raises(EMQPError, match="msgid of 7 bytes"):
        emqp.parse(emqp.message(b"REQUEST", msgid=b"1234567"), SMALL)
    assert emqp.parse(emqp.message(b"REQUEST", msgid=b"123456"), SMALL).msgid == b"123456"
    with pytest.raises(EMQPError, match="queue name of 9 bytes"):
        emqp.parse_request([b"q12345678", b"", b"job"], SMALL)
    with pytest.raises(EMQPError, match="3 header items"):
        emqp.parse_request([b"q", b"a,b:1,c", b"job"], SMALL)
    assert emqp.parse_request([b"", b"a, ,b:1", b"job"], SMALL).queue == b""
    with pytest.raises(EMQPError, match="control character"):
        emqp.parse_schedule([b"q\x00", b"", b"10", b"job"], SMALL)
    with pytest.raises(EMQPError, match="worker queue name"):
        emqp.parse_worker_queues(json.dumps([[10, "q12345678"]]).encode(), SMALL)
    three = [[10, "q1"], [5, "q2"], [1, "q3"]]
    assert len(emqp.parse_worker_queues(json.dumps(three).encode(), SMALL)) == 3
    with pytest.raises(EMQPError, match="more than 3 worker queues in one INFORM"):
        emqp.parse_worker_queues(json.dumps([*three, [1, "q4"]]).encode(), SMALL)


def test_limit_options_must_be_positive():
    options = tap.Options()
    options.parseOptions(["--max-name-bytes=10", "--max-id-bytes=20", "--max-headers=3",
                          "--max-names-per-request=7"])
    assert Limits.from_config(options) == Limits(10, 20, 3, 7)
    for bad in ("--max-name-bytes=0", "--max-id-bytes=-1", "--max-headers=x",
                "--max-names-per-request=0"):
        with pytest.raises(usage.UsageError):
            tap.Options().parseOptions([bad])


def test_mqks_a_bad_event_name_is_refused_every_time_and_good_ones_are_remembered(mqks):
    """Valid event names skip the check next time; an invalid one is never remembered."""
    for _ in range(2):
        [reply] = mqks(b"m1 publish e123456789 hi")
        assert reply.startswith(b"m1 error ")
    assert mqks(b"m2 publish e1 hi") == []
    assert mqks.factory.checked_events == {b"e1"}


def test_mqks_remembers_the_event_names_of_ten_thousand_queues(mqks):
    """Publishes spread over 10,000 events (issue 19's many queues) all skip the
    name check next time: with fewer remembered, every publish took the slow path."""
    assert mqks(*(b"m publish e%d hi" % n for n in range(10_000))) == []
    assert len(mqks.factory.checked_events) == 10_000


def test_mqks_remembered_event_names_are_bounded(mqks, monkeypatch):
    monkeypatch.setattr("mqserver.protocols.mqks.protocol.CHECKED_EVENTS", 3)
    for n in range(7):
        mqks(b"m publish e%d hi" % n)
        assert len(mqks.factory.checked_events) <= 3
    assert b"e6" in mqks.factory.checked_events
