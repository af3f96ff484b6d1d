"""PHPMQ (revision 2017 frames): 001 publish, 002 consume with a credit window, 004 ack.

PHPMQ answers nothing to a publish, so ``flush`` publishes a marker to a
side queue and consumes it on the same connection: the server handles a
connection's frames in order, so the marker's dispatch means every publish
before it was taken (not that it is durable: PHPMQ cannot ask for that).
"""

from __future__ import annotations

import socket

from bench.clients import WINDOW, LoadClient, Seen, connect, recv


def package(kind: int, content: bytes) -> bytes:
    return b"P%02d%029d" % (kind, len(content)) + content


def frame(kind: int, *packages: bytes) -> bytes:
    return b"H01%03d%02d" % (kind, len(packages)) + b"".join(packages)


def dispatch_head(queue: bytes) -> bytes:
    """What every 2017 003 of ``queue`` starts with, up to its content's length."""
    return b"H0100303" + package(1, queue) + b"P02"


def acks(name: bytes, ids: list[bytes]) -> bytes:
    """004 frames for ``ids`` (``name``: the queue package); the server's ids are
    32 bytes, so their frames share everything but the id."""
    head = frame(4, name, b"P03%029d" % 32)
    return b"".join([head + mid if len(mid) == 32 else frame(4, name, package(3, mid))
                     for mid in ids])


def dispatches(data: bytes, head: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Complete 003 frames in ``data`` as (content, id) pairs, and the rest.

    A frame that starts with ``head`` (``dispatch_head``: the queue consumed,
    2017) needs only its two lengths read; any other is read package by package.
    """
    found = []
    pos, end = 0, len(data)
    skip = len(head) + 29  # past the content's length digits
    while True:
        if data.startswith(head, pos):
            start = pos + skip
            if start > end:
                break
            stop = start + int(data[start - 29:start])
            id_at = stop + 32
            if id_at > end:
                break
            if data.startswith(b"P03", stop):
                cursor = id_at + int(data[id_at - 29:id_at])
                if cursor > end:
                    break
                found.append((data[start:stop], data[id_at:cursor]))
                pos = cursor
                continue
        if pos + 8 > end:
            break
        packages = int(data[pos + 6:pos + 8])
        cursor = pos + 8
        content = mid = b""
        for _ in range(packages):
            if cursor + 32 > end:
                return found, data[pos:]
            kind = data[cursor + 1:cursor + 3]
            start = cursor + 32
            cursor = start + int(data[cursor + 3:start])
            if cursor > end:
                return found, data[pos:]
            if kind == b"02":
                content = data[start:cursor]
            elif kind == b"03":
                mid = data[start:cursor]
        found.append((content, mid))
        pos = cursor
    return found, data[pos:]


class PHPMQClient(LoadClient):
    """Producer and consumer of ``queue`` over PHPMQ."""

    producer: socket.socket

    def open(self) -> None:
        self.producer = connect(self.ports["phpmq"])
        self.name = package(1, self.queue.encode())

    def encode(self, chunk: list[bytes]) -> bytes:
        name = self.name
        return b"".join(frame(1, name, package(2, body)) for body in chunk)

    def send(self, encoded: bytes) -> None:
        self.producer.sendall(encoded)

    def flush(self) -> None:
        queue = self.queue.encode() + b".sync"
        side = package(1, queue)
        self.producer.sendall(frame(1, side, package(2, b"sync"))
                              + frame(2, side, package(4, b"1")))
        found: list[tuple[bytes, bytes]] = []
        pending = b""
        while not found:
            found, pending = dispatches(pending + recv(self.producer), dispatch_head(queue))
        self.producer.sendall(frame(4, side, package(3, found[0][1]))
                              + frame(2, side, package(4, b"0")))

    def consume(self, count: int, seen: Seen = None) -> int:
        consumer = self.consumer = connect(self.ports["phpmq"])
        name = self.name
        consumer.sendall(frame(2, name, package(4, b"%d" % WINDOW)))
        head = dispatch_head(self.queue.encode())
        received = 0
        pending = b""
        while received < count:
            found, pending = dispatches(pending + recv(consumer), head)
            received += len(found)
            consumer.sendall(acks(name, [mid for _, mid in found]))
            if seen is not None:
                seen([content for content, _ in found])
        return received
