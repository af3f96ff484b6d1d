"""The ZMTP ROUTER factory over StringTransport: handshake, identities, routing, limits."""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.zmtp import codec
from mqserver.zmtp.codec import COMMAND, describe
from mqserver.zmtp.connection import FLUSH_AT
from mqserver.zmtp.decoder import MessageDecoder
from mqserver.zmtp.router import UnroutableError, ZMTPRouterFactory


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def router_started(self, router):
        self.events.append(("started",))

    def router_stopped(self, router):
        self.events.append(("stopped",))

    def peer_connected(self, router, identity):
        self.events.append(("connected", identity))

    def messages_received(self, router, identity, messages):
        self.events.append(("run", identity))
        for frames in messages:
            self.message_received(router, identity, frames)

    def message_received(self, router, identity, frames):
        self.events.append(("message", identity, frames))

    def peer_disconnected(self, router, identity):
        self.events.append(("disconnected", identity))

    def messages(self):
        return [e[1:] for e in self.events if e[0] == "message"]


def greeting(minor: int = 1, padding: bytes = b"\x00" * 8) -> bytes:
    return b"\xff" + padding + b"\x7f\x03" + bytes((minor,)) + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


def ready(socket_type: bytes = b"DEALER", identity: bytes | None = b"") -> bytes:
    return codec.ready_command(socket_type, identity)


class Peer:
    def __init__(self, router: ZMTPRouterFactory) -> None:
        self.protocol = router.buildProtocol(None)
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 4000))
        self.protocol.makeConnection(self.transport)
        self.greeting = self.transport.value()[:64]
        self.transport.clear()

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def received(self) -> list[tuple[int, bytes]]:
        data = self.transport.value()
        self.transport.clear()
        decoder = MessageDecoder(2**20, 64)
        frames, frame = [], decoder.frame(data)
        while frame is not None:
            frames.append(frame)
            frame = decoder.frame()
        return frames

    def commands(self) -> list[tuple[bytes, bytes]]:
        return [codec.parse_command(body) for flags, body in self.received() if flags & COMMAND]


@pytest.fixture
def handler() -> Recorder:
    return Recorder()


@pytest.fixture
def router(handler) -> ZMTPRouterFactory:
    return ZMTPRouterFactory(handler, "test", max_message_size=1000)


def handshake(router, identity=b"", minor=1, padding=b"\x00" * 8) -> Peer:
    peer = Peer(router)
    peer.send(greeting(minor, padding) + ready(b"DEALER", identity))
    return peer


def test_greeting_goes_out_before_the_peer_says_anything(router):
    peer = Peer(router)
    assert peer.greeting == codec.greeting()
    assert peer.transport.value() == b""


@pytest.mark.parametrize("minor", [0, 1])
def test_handshake_with_30_and_31_peers(router, handler, minor):
    peer = handshake(router, b"worker-1", minor, b"\x00" * 7 + b"\x09")
    [(name, data)] = peer.commands()
    assert name == b"READY"
    assert codec.parse_properties(data) == {b"socket-type": b"ROUTER"}
    assert handler.events == [("connected", b"worker-1")]
    assert peer.protocol.version == (3, minor)
    assert router.peers[b"worker-1"] is peer.protocol


def test_routing_both_ways(router, handler):
    peer = handshake(router, b"w")
    peer.received()
    peer.send(codec.encode_message([b"", b"eMQP/1.0", b"READY", b"m1"]))
    assert handler.messages() == [(b"w", [b"", b"eMQP/1.0", b"READY", b"m1"])]
    router.send(b"w", [b"", b"x" * 300])
    assert peer.received() == [(codec.MORE, b""), (codec.LONG, b"x" * 300)]


def test_unknown_identity_is_unroutable(router):
    with pytest.raises(UnroutableError):
        router.send(b"nobody", [b"x"])


def test_empty_or_zero_led_identities_are_generated(router, handler):
    a = handshake(router, b"")
    b = handshake(router, None)
    c = handshake(router, b"\x00evil")
    ids = [a.protocol.identity, b.protocol.identity, c.protocol.identity]
    assert all(len(i) == 5 and i[0] == 0 for i in ids)
    assert len(set(ids)) == 3
    assert describe(ids[0]).startswith("0x")


@pytest.mark.parametrize("kind", [b"PUB", b"SUB", b"PUSH", b"PAIR", b""])
def test_other_socket_types_get_an_error_and_are_closed(router, handler, kind):
    peer = Peer(router)
    peer.send(greeting() + ready(kind))
    [(name, data)] = peer.commands()
    assert name == b"ERROR"
    assert data[1:].startswith(b"invalid socket type")
    assert peer.transport.disconnecting
    assert handler.events == []


@pytest.mark.parametrize("kind", [b"REQ", b"ROUTER", b"DEALER"])
def test_compatible_socket_types(router, kind):
    peer = Peer(router)
    peer.send(greeting() + ready(kind, b"p"))
    assert [name for name, _ in peer.commands()] == [b"READY"]


def test_ping_gets_pong_with_the_context_and_unknown_commands_are_ignored(router, handler):
    peer = handshake(router, b"p")
    peer.received()
    peer.send(codec.ping_command(0, b"ctx") + codec.encode_command(b"WHATEVER", b"x")
              + codec.encode_command(b"SUBSCRIBE", b"") + codec.encode_message([b"m"]))
    assert peer.commands() == [(b"PONG", b"ctx")]
    assert handler.messages() == [(b"p", [b"m"])]
    assert not peer.transport.disconnecting


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        greeting()[:12] + b"PLAIN".ljust(20, b"\x00") + b"\x00" * 32,
        greeting() + codec.encode_message([b"too early"]),
        greeting() + codec.encode_command(b"PING", b"\x00\x00"),
        greeting() + ready() + b"\x08\x00",
        greeting() + ready() + codec.error_command(b"bye"),
        greeting() + ready(b"DEALER", b"i" * 256),
    ],
)
def test_protocol_errors_close_the_connection(router, data):
    peer = Peer(router)
    peer.send(data)
    assert peer.transport.disconnecting
    peer.send(codec.encode_message([b"ignored after close"]))


def test_max_message_size_counts_all_frames_on_the_wire(router, handler):
    peer = handshake(router, b"big")
    peer.send(codec.encode_message([b"a" * 600, b"b" * 382]))  # 609 + 391 bytes
    assert handler.messages() == [(b"big", [b"a" * 600, b"b" * 382])]
    peer.send(codec.encode_message([b"a" * 600, b"b" * 383]))
    assert peer.transport.disconnecting
    assert len(handler.messages()) == 1


def test_a_flood_of_empty_frames_hits_the_limit(router, handler):
    peer = handshake(router, b"flood")
    peer.send(b"\x01\x00" * 600)
    assert peer.transport.disconnecting
    assert handler.messages() == []


def test_whole_conversation_split_at_every_byte(handler):
    data = greeting(0) + ready(b"DEALER", b"w") + codec.encode_message(
        [b"", b"eMQP/1.0", b"y" * 256]
    ) + codec.ping_command(1, b"c") + codec.encode_message([b"z" * 255])
    for split in range(len(data) + 1):
        handler.events.clear()
        router = ZMTPRouterFactory(handler, "split", 10000)
        peer = Peer(router)
        peer.send(data[:split])
        peer.send(data[split:])
        assert handler.messages() == [(b"w", [b"", b"eMQP/1.0", b"y" * 256]), (b"w", [b"z" * 255])]
        assert [name for name, _ in peer.commands()] == [b"READY", b"PONG"]


def test_same_identity_takes_over_and_old_connection_is_closed(router, handler):
    old = handshake(router, b"dup")
    new = handshake(router, b"dup")
    assert old.transport.disconnecting
    assert router.peers[b"dup"] is new.protocol
    old.protocol.connectionLost()
    assert router.peers[b"dup"] is new.protocol
    assert ("disconnected", b"dup") not in handler.events
    new.protocol.connectionLost()
    assert b"dup" not in router.peers
    assert handler.events[-1] == ("disconnected", b"dup")


def test_handler_errors_are_logged_not_fatal(router, handler):
    def boom(router, identity, frames):
        raise RuntimeError("handler bug")

    handler.message_received = boom
    peer = handshake(router, b"p")
    peer.send(codec.encode_message([b"x"]))
    assert not peer.transport.disconnecting


def test_a_chunk_s_messages_come_in_runs_split_by_commands(router, handler):
    peer = handshake(router, b"r")
    handler.events.clear()
    peer.send(codec.encode_message([b"1"]) + codec.encode_message([b"2", b"x"])
              + codec.ping_command(0, b"p") + codec.encode_message([b"3"]))
    assert handler.events == [
        ("run", b"r"), ("message", b"r", [b"1"]), ("message", b"r", [b"2", b"x"]),
        ("run", b"r"), ("message", b"r", [b"3"]),
    ]
    assert [name for name, _ in peer.commands()] == [b"READY", b"PONG"]


def test_a_handler_error_costs_only_the_message_that_raised(router, handler):
    handled = []

    def fragile(router, identity, frames):
        if frames == [b"bad"]:
            raise RuntimeError("handler bug")
        handled.append(frames)

    handler.message_received = fragile
    peer = handshake(router, b"p")
    peer.send(b"".join(codec.encode_message([body]) for body in (b"1", b"bad", b"2", b"bad")))
    assert handled == [[b"1"], [b"2"]]
    assert [e[0] for e in handler.events if e[0] == "run"] == ["run"] * 3
    assert not peer.transport.disconnecting


def test_a_handler_that_fails_before_taking_a_message_loses_only_that_run(router, handler):
    calls = []

    def broken(router, identity, messages):
        calls.append(identity)
        raise RuntimeError("handler bug")

    handler.messages_received = broken
    peer = handshake(router, b"b")
    peer.send(codec.encode_message([b"1"]) + codec.ping_command(0, b"p")
              + codec.encode_message([b"2"]))
    assert calls == [b"b", b"b"]  # once per run, no endless retry
    assert [name for name, _ in peer.commands()] == [b"READY", b"PONG"]


@pytest.mark.parametrize("how", ["close", "connectionLost"])
def test_messages_after_the_handler_closes_the_connection_are_dropped(router, handler, how):
    def closing(router, identity, frames):
        handler.events.append(("message", identity, frames))
        getattr(router.peers[identity], how)()

    handler.message_received = closing
    peer = handshake(router, b"c")
    peer.send(codec.encode_message([b"1"]) + codec.encode_message([b"2"]))
    assert handler.messages() == [(b"c", [b"1"])]


def test_close_all_fires_when_every_connection_is_gone(router):
    assert router.close_all().called
    a, b = handshake(router, b"a"), handshake(router, b"b")
    d = router.close_all()
    assert a.transport.disconnecting and b.transport.disconnecting
    assert not d.called
    a.protocol.connectionLost()
    b.protocol.connectionLost()
    assert d.called


def test_start_and_stop_reach_the_handler(router, handler):
    router.doStart()
    router.doStop()
    assert handler.events == [("started",), ("stopped",)]


def test_a_peer_that_never_finishes_the_handshake_is_closed(handler):
    clock = Clock()
    router = ZMTPRouterFactory(handler, "slow", clock=clock, handshake_timeout=5)
    silent, prompt = Peer(router), Peer(router)
    prompt.send(greeting() + ready(b"DEALER", b"p"))
    clock.advance(5)
    assert silent.transport.disconnecting
    assert not prompt.transport.disconnecting
    silent.protocol.connectionLost()
    assert clock.getDelayedCalls() == []


class Echo(Recorder):
    """Answers each message on its own connection and copies it to ``other``."""

    other = b""

    def message_received(self, router, identity, frames):
        super().message_received(router, identity, frames)
        router.send(identity, [b"echo", *frames])
        if self.other:
            router.send(self.other, [b"copy", *frames])


def test_answers_to_a_chunk_go_out_in_one_write_in_order():
    router = ZMTPRouterFactory(Echo(), "echo", 1000)
    peer = handshake(router, b"e")
    peer.received()
    writes, write = [], peer.transport.write

    def counted(data: bytes) -> None:
        writes.append(data)
        write(data)

    peer.transport.write = counted
    peer.send(codec.encode_message([b"1"]) + codec.ping_command(0, b"p")
              + codec.encode_message([b"2"]))
    assert len(writes) == 1
    assert [body for _, body in peer.received()] == [
        b"echo", b"1", codec.pong_command(b"p")[2:], b"echo", b"2",
    ]


def test_with_a_clock_writes_to_other_connections_wait_for_the_end_of_the_turn():
    clock, handler = Clock(), Echo()
    router = ZMTPRouterFactory(handler, "turn", 1000, clock=clock)
    handler.other = b"b"
    a, b = handshake(router, b"a"), handshake(router, b"b")
    b.received()
    a.send(codec.encode_message([b"1"]) + codec.encode_message([b"2"]))
    assert b.transport.value() == b""  # held until the turn ends
    clock.advance(0)
    assert [body for _, body in b.received()] == [b"copy", b"1", b"copy", b"2"]
    router.send(b"b", [b"late"])
    b.protocol.close()  # closing writes what was held first
    assert [body for _, body in b.received()] == [b"late"]
    b.protocol.connectionLost()
    router.send(b"a", [b"gone"])
    a.protocol.connectionLost()
    clock.advance(0)  # a lost connection's held writes are dropped
    assert clock.getDelayedCalls() == []


def test_held_writes_go_out_at_once_past_the_high_water_mark():
    """So the transport can pause us (backpressure) within one turn of deliveries."""
    clock = Clock()
    router = ZMTPRouterFactory(Recorder(), "big", 2**20, clock=clock)
    peer = handshake(router, b"w")
    peer.received()
    router.send(b"w", [b"x" * 1000])
    assert peer.transport.value() == b""
    router.send(b"w", [b"y" * FLUSH_AT])
    assert [body for _, body in peer.received()] == [b"x" * 1000, b"y" * FLUSH_AT]
    router.send(b"w", [b"z"])
    assert peer.transport.value() == b""
    clock.advance(0)
    assert [body for _, body in peer.received()] == [b"z"]
