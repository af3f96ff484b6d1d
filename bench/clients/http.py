"""HTTP API: a batch publish per chunk (a JSON array of ``CHUNK`` messages);
long-poll consume and batch acks.

One keep-alive connection each, HTTP/1.1 requests pre-encoded and
pipelined; a consumer's ack of a whole poll and its next poll go out in one
write.  With ``confirm_each`` every batch asks ``?durable=true``: its 201
lists every message's id once the store has all of them, so each publish is
confirmed (by the store, on a durable backend).
"""

from __future__ import annotations

import json
import socket
from typing import ClassVar

from bench.clients import WINDOW, LoadClient, Seen, connect, recv
from bench.servers import TOKEN

HEADERS = b"Host: bench\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"


def request(method: bytes, path: bytes, body: bytes,
            kind: bytes = b"application/json") -> bytes:
    return (b"%s %s HTTP/1.1\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (method, path, HEADERS, kind, len(body), body))


def responses(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Complete responses in ``data`` as (status, body), and the rest."""
    found = []
    pos = 0
    while (head_end := data.find(b"\r\n\r\n", pos)) >= 0:
        head = data[pos:head_end].lower()
        status = int(head[9:12])
        body_start = head_end + 4
        if b"transfer-encoding: chunked" in head:
            body, stop = b"", body_start
            while (eol := data.find(b"\r\n", stop)) >= 0:
                size = int(data[stop:eol].split(b";")[0], 16)
                if eol + 4 + size > len(data):
                    return found, data[pos:]
                body += data[eol + 2:eol + 2 + size]
                stop = eol + 4 + size
                if size == 0:
                    break
            else:
                return found, data[pos:]
        else:
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            stop = body_start + length
            if stop > len(data):
                return found, data[pos:]
            body = data[body_start:stop]
        found.append((status, body))
        pos = stop
    return found, data[pos:]


class HTTPClient(LoadClient):
    """Publishes batches to ``queue`` (created with PUT) and consumes it as a named consumer."""

    producer: socket.socket
    can_confirm_each = True
    #: messages a long poll asks for (``max``; the response holds their bodies)
    window: ClassVar[int] = WINDOW

    def open(self) -> None:
        self.producer = connect(self.ports["http"])
        self.path = b"/api/queues/" + self.queue.encode()
        self.sent = self.answered = 0
        self.rest = b""
        self.producer.sendall(request(b"PUT", self.path, b"{}"))
        self.sent = 1
        self.wait_answers(0)

    def encode(self, chunk: list[bytes]) -> bytes:
        publish = self.path + b"/messages/batch" + (b"?durable=true" if self.confirm_each else b"")
        batch = json.dumps([{"body": body.decode("latin-1")} for body in chunk]).encode()
        return request(b"POST", publish, batch)

    def send(self, encoded: bytes) -> None:
        self.producer.sendall(encoded)
        self.sent += 1
        self.wait_answers(4)

    def wait_answers(self, unanswered: int) -> None:
        while self.sent - self.answered > unanswered:
            found, self.rest = responses(self.rest + recv(self.producer))
            for status, body in found:
                assert status in (200, 201), (status, body)
            self.answered += len(found)

    def flush(self) -> None:
        self.wait_answers(0)

    def consume(self, count: int, seen: Seen = None) -> int:
        """Polls of up to ``WINDOW``; each poll's ack (its ids in one request, one
        broker run) and the next poll go out in one write."""
        consumer = self.consumer = connect(self.ports["http"])
        name = "c-" + self.queue
        poll = request(b"POST", self.path + b"/consume", json.dumps(
            {"consumer": name, "max": self.window, "timeout": 10, "lease": 60}).encode())
        consumer.sendall(poll)
        received = 0
        pending = b""
        while received < count:
            found, pending = responses(pending + recv(consumer))
            for status, body in found:
                assert status == 200, (status, body)
                answer = json.loads(body)
                if "messages" not in answer:  # an ack's answer
                    continue
                messages = answer["messages"]
                if not messages:  # a poll that timed out
                    consumer.sendall(poll)
                    continue
                received += len(messages)
                ack = json.dumps({"consumer": name, "ids": [m["id"] for m in messages]})
                more = poll if received < count else b""
                consumer.sendall(request(b"POST", self.path + b"/ack", ack.encode()) + more)
                if seen is not None:
                    seen([m["body"].encode() for m in messages])
        return received
