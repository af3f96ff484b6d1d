"""AMQP 0-9-1 (RabbitMQ): publisher confirms, ``basic.qos`` 1000, multiple acks.

Raw frames over a socket, only the methods the bench needs.  The producer
channel is in confirm mode (``confirm.select``), so RabbitMQ confirms every
publish (``basic.ack``, often with ``multiple``) once the queue took it: once
written to disk for a persistent message on a durable queue, once a majority
of the quorum's log has it for a quorum queue.  With ``confirm_each`` at most
``4 * CHUNK`` publishes go unconfirmed, as for the line protocols; without it
the confirms are read only as they come and ``flush`` waits for the last one
(AMQP has no way to confirm only some publishes of a channel).

The consumer sets ``basic.qos`` prefetch ``WINDOW`` and acks each received
chunk with one ``basic.ack`` (``multiple``) of its last delivery tag.
"""

from __future__ import annotations

import select
import socket
import struct
from typing import ClassVar

from bench.clients import CHUNK, WINDOW, LoadClient, Seen, connect, recv

FRAME_END = b"\xce"
METHOD, HEADER, BODY = 1, 2, 3
FRAME_MAX = 131072
CHANNEL = 1
BASIC_ACK, BASIC_NACK, BASIC_DELIVER = (60, 80), (60, 120), (60, 60)
HEAD = struct.Struct(">BHI")


def shortstr(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def table(fields: dict[bytes, bytes]) -> bytes:
    """A field table of long strings (all the bench declares)."""
    body = b"".join(shortstr(k) + b"S" + struct.pack(">I", len(v)) + v for k, v in fields.items())
    return struct.pack(">I", len(body)) + body


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return HEAD.pack(kind, channel, len(payload)) + payload + FRAME_END


def method(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return frame(METHOD, channel, struct.pack(">HH", class_id, method_id) + args)


def publish(routing_key: bytes, body: bytes, persistent: bool) -> bytes:
    """basic.publish to the default exchange, its content header and body frames."""
    props = struct.pack(">HB", 0x1000, 2) if persistent else struct.pack(">H", 0)
    out = [method(CHANNEL, 60, 40, b"\x00\x00" + shortstr(b"") + shortstr(routing_key) + b"\x00"),
           frame(HEADER, CHANNEL, struct.pack(">HHQ", 60, 0, len(body)) + props)]
    step = FRAME_MAX - 8
    out += [frame(BODY, CHANNEL, body[n:n + step]) for n in range(0, len(body), step)]
    return b"".join(out)


def frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The complete frames in ``data`` as (type, payload), and the rest."""
    found = []
    pos, end = 0, len(data)
    while pos + 7 <= end:
        kind, _, size = HEAD.unpack_from(data, pos)
        stop = pos + 7 + size
        if stop + 1 > end:
            break
        if data[stop] != 0xCE:
            raise RuntimeError("AMQP: bad frame end")
        found.append((kind, data[pos + 7:stop]))
        pos = stop + 1
    return found, data[pos:]


class Connection:
    """A socket through the connection handshake, with one channel open."""

    def __init__(self, port: int) -> None:
        self.sock = connect(port)
        self.rest = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(10, 10)  # connection.start
        login = b"\x00guest\x00guest"
        self.sock.sendall(method(0, 10, 11, table({b"product": b"mqserver-bench"})
                                 + shortstr(b"PLAIN") + struct.pack(">I", len(login)) + login
                                 + shortstr(b"en_US")))
        tune = self.expect(10, 30)
        channel_max = struct.unpack_from(">H", tune)[0]
        self.sock.sendall(method(0, 10, 31, struct.pack(">HIH", channel_max, FRAME_MAX, 0))
                          + method(0, 10, 40, shortstr(b"/") + shortstr(b"") + b"\x00"))
        self.expect(10, 41)  # connection.open-ok
        self.call(20, 10, shortstr(b""))  # channel.open

    def call(self, class_id: int, method_id: int, args: bytes) -> bytes:
        """A synchronous method on the channel; the arguments of its -ok."""
        self.sock.sendall(method(CHANNEL, class_id, method_id, args))
        return self.expect(class_id, method_id + 1)

    def expect(self, class_id: int, method_id: int) -> bytes:
        """Read up to the next method frame, which must be (class_id, method_id)."""
        while True:
            found, _ = frames(self.rest)
            if found:
                kind, payload = found[0]
                self.rest = self.rest[7 + len(payload) + 1:]
                got = struct.unpack_from(">HH", payload)
                if kind == METHOD and got == (class_id, method_id):
                    return payload[4:]
                raise RuntimeError(f"AMQP: expected {class_id}.{method_id}, got {got} "
                                   f"{payload[4:200]!r}")
            self.rest += recv(self.sock)


class Confirms:
    """The publisher confirms seen: every tag up to ``upto``, and single ones above it."""

    def __init__(self) -> None:
        self.upto = 0
        self.singles: set[int] = set()

    @property
    def count(self) -> int:
        return self.upto + len(self.singles)

    def take(self, payloads: list[tuple[int, bytes]]) -> None:
        for kind, payload in payloads:
            head = payload[:4]
            if kind != METHOD or head not in (b"\x00\x3c\x00\x50", b"\x00\x3c\x00\x78"):
                raise RuntimeError(f"AMQP: unexpected {kind} {payload[:200]!r}")
            if head == b"\x00\x3c\x00\x78":
                raise RuntimeError("AMQP: RabbitMQ refused a publish (basic.nack)")
            tag, multiple = struct.unpack_from(">QB", payload, 4)
            if multiple:
                self.upto = max(self.upto, tag)
                self.singles = {t for t in self.singles if t > self.upto}
            elif tag > self.upto:
                self.singles.add(tag)


class AMQPClient(LoadClient):
    """A classic queue, not durable, transient messages."""

    producer: socket.socket
    can_confirm_each = True
    durable: ClassVar[bool] = False  #: a durable queue and persistent messages
    arguments: ClassVar[dict[bytes, bytes]] = {}  #: queue.declare's arguments

    def open(self) -> None:
        self.link = Connection(self.ports["main"])
        self.producer = self.link.sock
        self.declare(self.link)
        self.link.call(85, 10, b"\x00")  # confirm.select
        self.sent = 0
        self.confirms = Confirms()

    def declare(self, link: Connection) -> None:
        """queue.declare (the same for every connection, so redeclaring is fine)."""
        durable = b"\x02" if self.durable or self.arguments else b"\x00"
        link.call(50, 10, b"\x00\x00" + shortstr(self.queue.encode()) + durable
                  + table(self.arguments))

    def encode(self, chunk: list[bytes]) -> tuple[bytes, int]:
        key = self.queue.encode()
        return b"".join(publish(key, body, self.durable) for body in chunk), len(chunk)

    def send(self, encoded: tuple[bytes, int]) -> None:
        data, count = encoded
        self.producer.sendall(data)
        self.sent += count
        if self.confirm_each:
            while self.sent - self.confirms.count > 4 * CHUNK:
                self.read()
        else:  # whatever confirms came, so they never fill the socket's buffers
            while select.select([self.producer], [], [], 0)[0]:
                self.read()

    def read(self) -> None:
        found, self.link.rest = frames(self.link.rest + recv(self.producer))
        self.confirms.take(found)

    def flush(self) -> None:
        while self.confirms.count < self.sent:
            self.read()

    def consume(self, count: int, seen: Seen = None) -> int:
        link = Connection(self.ports["main"])
        consumer = self.consumer = link.sock
        self.declare(link)
        link.call(60, 10, struct.pack(">IHB", 0, WINDOW, 0))  # basic.qos
        link.call(60, 20, b"\x00\x00" + shortstr(self.queue.encode()) + shortstr(b"")
                  + b"\x00" + table({}))  # basic.consume, manual acks
        received = size = tag = 0
        data = link.rest  # deliveries may have come with consume-ok
        body = bytearray()
        while True:
            found, pending = frames(data)
            bodies = []
            done = 0  # the tag of the last delivery whose body is complete
            for kind, payload in found:
                if kind == BODY:
                    body += payload
                    if len(body) >= size:
                        bodies.append(bytes(body))
                        body.clear()
                        done = tag
                elif kind == HEADER:
                    size = struct.unpack_from(">Q", payload, 4)[0]
                elif payload[:4] == b"\x00\x3c\x00\x3c":  # basic.deliver
                    tag = struct.unpack_from(">Q", payload, 5 + payload[4])[0]  # past its tag
                else:
                    raise RuntimeError(f"AMQP: unexpected {kind} {payload[:200]!r}")
            received += len(bodies)
            if done:
                consumer.sendall(method(CHANNEL, 60, 80, struct.pack(">QB", done, 1)))
            if seen is not None:
                seen(bodies)
            if received >= count:
                return received
            data = pending + recv(consumer)


class DurableAMQPClient(AMQPClient):
    """A durable classic queue, persistent messages (delivery mode 2)."""

    durable = True


class QuorumAMQPClient(AMQPClient):
    """A quorum queue (``x-queue-type=quorum``: durable, a Raft log of one node here)."""

    arguments = {b"x-queue-type": b"quorum"}
