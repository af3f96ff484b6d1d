"""The bench's AMQP 0-9-1 client: its frames, its confirm counting, and a consumer
whose deliveries come in the same read as ``basic.consume-ok``.

The last is a scripted broker on a loopback socket that answers the client's
methods in order and sends every delivery right behind ``consume-ok``, as a
busy RabbitMQ does when the queue is full before the consumer comes.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.clients.amqp import (
    BODY,
    CHANNEL,
    FRAME_MAX,
    HEADER,
    METHOD,
    AMQPClient,
    Confirms,
    frame,
    frames,
    method,
    publish,
    shortstr,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.booleans(), st.data())
def test_any_chunking_reads_the_published_frames_back(bodies, persistent, data):
    wire = b"".join(publish(b"q", body, persistent) for body in bodies)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=10)))
    found: list[tuple[int, bytes]] = []
    pending = b""
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got, pending = frames(pending + wire[a:b])
        found += got
    assert pending == b""
    assert b"".join(frame(kind, CHANNEL, payload) for kind, payload in found) == wire
    assert [payload for kind, payload in found if kind == BODY] == [b for b in bodies if b]


def test_a_body_bigger_than_a_frame_is_split():
    body = bytes(range(256)) * 1000
    found, rest = frames(publish(b"q", body, True))
    assert rest == b""
    assert [kind for kind, _ in found] == [METHOD, HEADER, BODY, BODY]
    assert b"".join(payload for kind, payload in found if kind == BODY) == body
    assert all(len(payload) <= FRAME_MAX - 8 for _, payload in found)


def ack(tag: int, multiple: bool, nack: bool = False) -> tuple[int, bytes]:
    return METHOD, struct.pack(">HHQB", 60, 120 if nack else 80, tag, multiple)


def test_confirms_count_multiple_and_single_acks_in_any_order():
    confirms = Confirms()
    confirms.take([ack(3, False), ack(1, False), ack(2, True)])
    assert confirms.count == 3
    confirms.take([ack(5, False), ack(4, True)])
    assert confirms.count == 5
    confirms.take([ack(6, True)])
    assert (confirms.count, confirms.singles) == (6, set())


def test_a_nack_raises():
    with pytest.raises(RuntimeError, match="nack"):
        Confirms().take([ack(1, False, nack=True)])


def delivery(tag: int, body: bytes) -> bytes:
    return (method(CHANNEL, 60, 60, shortstr(b"ctag") + struct.pack(">QB", tag, 0)
                   + shortstr(b"") + shortstr(b"q"))
            + frame(HEADER, CHANNEL, struct.pack(">HHQH", 60, 0, len(body), 0))
            + frame(BODY, CHANNEL, body))


class ScriptedBroker(threading.Thread):
    """Answers each method in order; behind consume-ok, every delivery at once.
    Records the acks it gets until the client closes."""

    def __init__(self, bodies: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.bodies = bodies
        self.acks: list[tuple[int, int]] = []

    def run(self) -> None:
        producer, _ = self.listener.accept()  # served while the consumer's is
        threading.Thread(target=self.serve, args=(producer,), daemon=True).start()
        consumer, _ = self.listener.accept()
        self.serve(consumer)

    def serve(self, sock: socket.socket) -> None:
        with sock:
            self.answer(sock)

    def answer(self, sock: socket.socket) -> None:
        answers = {(10, 11): method(0, 10, 30, struct.pack(">HIH", 2047, FRAME_MAX, 0)),
                   (10, 40): method(0, 10, 41, shortstr(b"")),
                   (20, 10): method(CHANNEL, 20, 11, struct.pack(">I", 0)),
                   (50, 10): method(CHANNEL, 50, 11, shortstr(b"q") + struct.pack(">II", 0, 0)),
                   (85, 10): method(CHANNEL, 85, 11),
                   (60, 10): method(CHANNEL, 60, 11),
                   (60, 20): method(CHANNEL, 60, 21, shortstr(b"ctag")) + b"".join(
                       delivery(tag, body) for tag, body in enumerate(self.bodies, 1))}
        assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"
        sock.sendall(method(0, 10, 10, b"\x00\x09" + struct.pack(">I", 0)
                            + struct.pack(">I", 5) + b"PLAIN" + struct.pack(">I", 5) + b"en_US"))
        rest = b""
        while data := sock.recv(65536):
            found, rest = frames(rest + data)
            for _, payload in found:
                key = struct.unpack_from(">HH", payload)
                if key == (60, 80):
                    self.acks.append(struct.unpack_from(">QB", payload, 4))
                elif key in answers:
                    sock.sendall(answers[key])


def test_deliveries_that_came_with_consume_ok_are_taken_without_another_read():
    bodies = [b"%019d" % n + b"x" * 81 for n in range(200)]
    broker = ScriptedBroker(bodies)
    broker.start()
    client = AMQPClient({"main": broker.port}, "q")
    try:
        seen: list[bytes] = []
        assert client.consume(len(bodies), seen.extend) == len(bodies)
        assert seen == bodies
    finally:
        client.close()
    broker.join(10)
    assert broker.acks == [(200, 1)]
