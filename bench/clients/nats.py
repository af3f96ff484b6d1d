"""NATS JetStream: PUB to a workqueue stream, a pull consumer, ``+ACK`` per message.

Raw NATS client protocol over a socket.  ``open`` creates the stream (its
subject is the queue's name, plus ``<queue>.sync`` for the barrier) and a
durable pull consumer through the JetStream API (``$JS.API.STREAM.CREATE``,
``$JS.API.CONSUMER.DURABLE.CREATE``; both idempotent for the same config, so
the paced producer's own client may ask again).

Publishing: with ``confirm_each`` every PUB carries a reply subject and every
PubAck is counted (at most ``4 * CHUNK`` unanswered, as for the line
protocols); otherwise the PUBs go without one and ``flush`` sends one PUB with
a reply to ``<queue>.sync``: the stream stores a connection's messages in
order, so its PubAck means everything before it was stored.  The consumer
filters on ``<queue>``, so the barriers are never delivered.

Consuming: fetch requests of ``BATCH`` (the consumer's ``max_ack_pending`` is
the same), at most two outstanding, and one ``+ACK`` per message to its reply
subject, all of a received chunk in one write.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, ClassVar

from bench.clients import CHUNK, TIMEOUT, WINDOW, LoadClient, Seen, connect, recv

BATCH = WINDOW  #: messages per fetch request, and the consumer's max_ack_pending
CONNECT = (b'CONNECT {"verbose":false,"pedantic":false,"headers":true,'
           b'"no_responders":true,"protocol":1}\r\n')


def pub(subject: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """One PUB (with a reply subject when ``reply``)."""
    head = b"PUB %s %s %d\r\n" % (subject, reply, len(payload)) if reply else \
        b"PUB %s %d\r\n" % (subject, len(payload))
    return head + payload + b"\r\n"


def handshake(sock: socket.socket) -> bytes:
    """CONNECT, subscribe to an inbox of this connection's own, and wait for
    the PONG that says both were taken; the inbox's subject."""
    inbox = b"_INBOX." + os.urandom(8).hex().encode()
    sock.sendall(CONNECT + b"SUB %s 1\r\nPING\r\n" % inbox)
    data = b""
    while b"PONG\r\n" not in data:
        data += recv(sock)
        if b"-ERR" in data:
            raise RuntimeError(f"NATS refused the connection: {data!r}")
    return inbox


def request(sock: socket.socket, inbox: bytes, subject: str,
            body: dict[str, Any]) -> dict[str, Any]:
    """A JetStream API request answered on ``inbox``; its JSON reply (an error raises)."""
    sock.sendall(pub(subject.encode(), json.dumps(body).encode(), inbox))
    data = b""
    while True:
        data += recv(sock)
        frames, _, _, _ = parse(data)
        if frames:
            reply = json.loads(frames[0][1])
            if "error" in reply:
                raise RuntimeError(f"{subject}: {reply['error']}")
            return reply


def parse(data: bytes) -> tuple[list[tuple[bytes, bytes]], int, int, bytes]:
    """The complete MSGs in ``data`` as (reply subject or b"", payload), how
    many messages expired fetches will not bring (a ``408`` status says so
    in ``Nats-Pending-Messages``), the PINGs to answer, and the rest.  Any
    other status, or ``-ERR``, raises."""
    found = []
    missed = pings = 0
    pos, end = 0, len(data)
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            break
        if data.startswith(b"MSG ", pos):
            head = data[pos + 4:eol].split()  # subject sid [reply] size
            stop = eol + 2 + int(head[-1])
            if stop + 2 > end:
                break
            found.append((head[2] if len(head) == 4 else b"", data[eol + 2:stop]))
            pos = stop + 2
        elif data.startswith(b"HMSG ", pos):
            stop = eol + 2 + int(data[pos + 5:eol].split()[-1])
            if stop + 2 > end:
                break
            missed += status_pending(data[eol + 2:stop])
            pos = stop + 2
        elif data.startswith(b"PING", pos):
            pings += 1
            pos = eol + 2
        elif data.startswith((b"PONG", b"+OK", b"INFO "), pos):
            pos = eol + 2
        else:
            raise RuntimeError(f"NATS: {data[pos:eol]!r}")
    return found, missed, pings, data[pos:]


def status_pending(headers: bytes) -> int:
    """How many messages of an expired fetch will not come (a 408's header)."""
    lines = headers.split(b"\r\n")
    if not lines[0].startswith(b"NATS/1.0 408"):
        raise RuntimeError(f"NATS status: {lines[0]!r}")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"nats-pending-messages":
            return int(value)
    return 0


class JetStreamClient(LoadClient):
    """Stream ``queue`` (subjects ``queue`` and ``queue.sync``), durable pull consumer ``c``."""

    producer: socket.socket
    storage: ClassVar[str] = "memory"  #: the stream's storage: "memory" or "file"
    can_confirm_each = True

    def open(self) -> None:
        self.producer = connect(self.ports["main"])
        self.inbox = inbox = handshake(self.producer)
        self.subject = self.queue.encode()
        request(self.producer, inbox, f"$JS.API.STREAM.CREATE.{self.queue}", {
            "name": self.queue, "subjects": [self.queue, f"{self.queue}.sync"],
            "storage": self.storage, "retention": "workqueue", "num_replicas": 1})
        request(self.producer, inbox, f"$JS.API.CONSUMER.DURABLE.CREATE.{self.queue}.c", {
            "stream_name": self.queue, "config": {
                "durable_name": "c", "ack_policy": "explicit", "deliver_policy": "all",
                "filter_subject": self.queue, "max_ack_pending": BATCH}})
        self.sent = self.answered = 0
        self.rest = b""

    def encode(self, chunk: list[bytes]) -> tuple[bytes, int]:
        subject, inbox = self.subject, self.inbox
        if self.confirm_each:
            return b"".join(b"PUB %s %s %d\r\n%s\r\n" % (subject, inbox, len(body), body)
                            for body in chunk), len(chunk)
        return b"".join(b"PUB %s %d\r\n%s\r\n" % (subject, len(body), body)
                        for body in chunk), 0

    def send(self, encoded: tuple[bytes, int]) -> None:
        data, acked = encoded
        self.producer.sendall(data)
        self.sent += acked
        while self.sent - self.answered > 4 * CHUNK:
            self.read()

    def read(self) -> None:
        """Count the PubAcks of one received chunk (each a MSG on the inbox)."""
        data = self.rest + recv(self.producer)
        cut = data.rfind(b"\r\n") + 2
        whole = data[:cut]
        if b"-ERR" in whole or b"HMSG" in whole or b'"error"' in whole:
            raise RuntimeError(f"NATS refused a publish: {whole[-300:]!r}")
        self.answered += whole.count(b"MSG ")
        if pings := whole.count(b"PING\r\n"):
            self.producer.sendall(b"PONG\r\n" * pings)
        self.rest = data[cut:]

    def flush(self) -> None:
        if not self.confirm_each:
            self.producer.sendall(pub(self.subject + b".sync", b"x", self.inbox))
            self.sent += 1
        while self.answered < self.sent:
            self.read()

    def consume(self, count: int, seen: Seen = None) -> int:
        consumer = self.consumer = connect(self.ports["main"])
        inbox = handshake(consumer)
        nxt = f"$JS.API.CONSUMER.MSG.NEXT.{self.queue}.c".encode()
        expires = int(TIMEOUT * 1e9)
        requested = received = 0

        def fetches() -> bytes:
            """Requests to keep two batches asked for (fewer at the end)."""
            nonlocal requested
            out = []
            while requested < count and requested - received <= BATCH:
                batch = min(BATCH, count - requested)
                requested += batch
                out.append(pub(nxt, b'{"batch":%d,"expires":%d}' % (batch, expires), inbox))
            return b"".join(out)

        consumer.sendall(fetches())
        pending = b""
        while received < count:
            found, missed, pings, pending = parse(pending + recv(consumer))
            requested -= missed  # what expired fetches will not bring is asked for again
            acks = [b"PONG\r\n"] * pings
            bodies = []
            for reply, payload in found:
                if not reply:
                    raise RuntimeError(f"NATS: a message without a reply subject: {payload!r}")
                acks.append(b"PUB %s 4\r\n+ACK\r\n" % reply)
                bodies.append(payload)
            received += len(bodies)
            consumer.sendall(b"".join(acks) + fetches())
            if seen is not None:
                seen(bodies)
        return received


class JetStreamFileClient(JetStreamClient):
    """The same on a file-storage stream (which nats-server 2.9 never fsyncs)."""

    storage = "file"
