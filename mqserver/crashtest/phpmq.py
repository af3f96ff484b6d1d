"""PHPMQ consumer of the crash test: 004 ack, 005 requeue with a TTL, 006 dead letter.

PHPMQ answers none of them, so the ledger learns they were applied from the
credit window instead: the server dispatches to a connection at most
``WINDOW`` messages more than the settles of its own it has applied (each
004, 005 or 006 of a message the connection holds frees one credit), and
applies a connection's frames in order.  So once ``D`` dispatches arrived,
the first ``D - WINDOW`` settles sent were applied; a barrier
(``mqks.Barrier``) then makes them durable.
"""

from __future__ import annotations

import random
import socket
import threading

from mqserver.crashtest.ledger import DEAD, HOME, NONE, Ledger, Op

WINDOW = 10
QUEUE = b"p"


def package(kind: int, content: bytes) -> bytes:
    return b"P%02d%029d" % (kind, len(content)) + content


def frame(kind: int, *packages: bytes) -> bytes:
    return b"H01%03d%02d" % (kind, len(packages)) + b"".join(packages)


def frames(data: bytes) -> tuple[list[dict[int, bytes]], bytes]:
    """Complete frames in ``data`` as {package type: content}, and the rest."""
    found = []
    pos = 0
    while len(data) >= pos + 8:
        cursor, packages = pos + 8, {}
        for _ in range(int(data[pos + 6:pos + 8])):
            if len(data) < cursor + 32:
                return found, data[pos:]
            start = cursor + 32
            cursor = start + int(data[cursor + 3:start])
            if len(data) < cursor:
                return found, data[pos:]
            packages[int(data[start - 31:start - 29])] = data[start:cursor]
        found.append(packages)
        pos = cursor
    return found, data[pos:]


class Consumer:
    """Consumes ``p`` (dead-letter target ``p.dead``) with a window of ``WINDOW``."""

    def __init__(self, port: int, ledger: Ledger, rng: random.Random) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.ledger = ledger
        self.rng = rng
        self.name = package(1, QUEUE)
        self.settles: list[Op] = []  # in the order sent
        self.dispatched = 0
        self.applied = 0  # how many of ``settles`` are known to be applied

    def run(self, stop: threading.Event) -> None:
        ledger, rest = self.ledger, b""
        try:
            self.sock.sendall(frame(2, self.name, package(4, b"%d" % WINDOW)))
            while not stop.is_set():
                try:
                    chunk = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                dispatches, rest = frames(rest + chunk)
                out = []
                with ledger.lock:
                    for packages in dispatches:
                        self.dispatched += 1
                        while self.applied < self.dispatched - WINDOW:
                            ledger.applied(self.settles[self.applied])
                            self.applied += 1
                        out.append(self._settle(packages[3].decode()))
                self.sock.sendall(b"".join(out))
        except OSError:
            return

    def _settle(self, mid: str) -> bytes:
        ledger = self.ledger
        copy = ledger.copies[("p", mid)]
        retry, copy.deliveries = copy.deliveries, copy.deliveries + 1
        ident = package(3, mid.encode())
        roll = self.rng.random()
        if roll < 0.35:
            op, data = ledger.settle(copy, "phpmq-004", NONE), frame(4, self.name, ident)
        elif roll < 0.7:
            ttl = package(5, self.rng.choice((b"0", b"600")))
            if copy.limit is not None and retry + 1 > copy.limit:
                op = ledger.settle(copy, "phpmq-005-out", DEAD)
            else:
                op = ledger.settle(copy, "phpmq-005", HOME)
            data = frame(5, self.name, ident, ttl)
        else:
            op, data = ledger.settle(copy, "phpmq-006", DEAD), frame(6, self.name, ident)
        self.settles.append(op)
        return data
