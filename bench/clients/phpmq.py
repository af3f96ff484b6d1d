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


def dispatches(data: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Complete 003 frames in ``data`` as (content, id) pairs, and the rest."""
    found = []
    pos, end = 0, len(data)
    while pos + 8 <= end:
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
        side = package(1, self.queue.encode() + b".sync")
        self.producer.sendall(frame(1, side, package(2, b"sync"))
                              + frame(2, side, package(4, b"1")))
        found: list[tuple[bytes, bytes]] = []
        pending = b""
        while not found:
            found, pending = dispatches(pending + recv(self.producer))
        self.producer.sendall(frame(4, side, package(3, found[0][1]))
                              + frame(2, side, package(4, b"0")))

    def consume(self, count: int, seen: Seen = None) -> int:
        consumer = self.consumer = connect(self.ports["phpmq"])
        name = self.name
        consumer.sendall(frame(2, name, package(4, b"%d" % WINDOW)))
        received = 0
        pending = b""
        while received < count:
            found, pending = dispatches(pending + recv(consumer))
            received += len(found)
            consumer.sendall(b"".join(frame(4, name, package(3, mid)) for _, mid in found))
            if seen is not None:
                seen([content for content, _ in found])
        return received
