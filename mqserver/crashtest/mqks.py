"""MQKS clients of the crash test: producer, settling consumer, barrier, drain.

Every MQKS settle here is ``--confirm``ed, so its own ``ok`` makes it
durable.  The barrier is what makes the settles of PHPMQ and eMQP, which
have no confirm, durable in the ledger: a ``publish --confirm`` to an event
no queue is bound to stores nothing, but its ``ok`` comes only once every op
the server made before it is durable (``OpWriter.wait``), so every op known
to be applied before the publish was sent is durable when it answers.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

from mqserver.crashtest.ledger import DEAD, HOME, NONE, Copy, Ledger, Op
from mqserver.crashtest.server import Lines
from mqserver.crashtest.topology import dead_letter

BARRIER_EVENT = b"crashtest.barrier"


def body_of(mid: str) -> bytes:
    """The body a message id always carries: 10 to 400 bytes, checkable after recovery."""
    size = 10 + sum(mid.encode()) * 7 % 390
    return (mid + ":").encode() + bytes(97 + (i * 31 + size) % 26 for i in range(size))


def parse_delivery(line: bytes) -> tuple[bytes, str, int, bytes] | None:
    """(consumer id, message id, retry, body) of a ``c ok {mid} event=...`` line, else None."""
    parts = line.split(b" ", 4)
    if len(parts) < 5 or parts[1] != b"ok" or not parts[3].startswith(b"event="):
        return None
    _, _, retry = parts[3].partition(b",retry=")
    return parts[0], parts[2].decode(), int(retry or 0), parts[4]


class Producer:
    """Publishes ``--confirm`` in chunks of 50, one every 20 ms, at most 2,000 unconfirmed.

    The pace leaves the other clients' requests room in the server's turns.
    """

    EVENTS = {"q": b"ev", "p": b"pev", "u": b"uev"}

    def __init__(self, port: int, ledger: Ledger, rng: random.Random, prefix: str) -> None:
        self.lines = Lines(port)
        self.ledger = ledger
        self.rng = rng
        self.prefix = prefix
        self.pending: dict[str, Copy] = {}

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self._confirmations, daemon=True).start()
        ledger, n = self.ledger, 0
        while not stop.wait(0.02):
            chunk = []
            with ledger.lock:
                while len(self.pending) > 2000 and not stop.is_set():
                    ledger.lock.wait(0.1)
                now = time.time()
                for _ in range(50):
                    home = self.rng.choices(("q", "p", "u"), (6, 3, 1))[0]
                    mid = f"{self.prefix}{n}"
                    n += 1
                    copy = self.pending[mid] = ledger.publish(mid, home, dead_letter(home), now)
                    if home == "u" and ledger.purging:
                        ledger.settle(copy, "purge?", NONE)  # a purge in flight may take it
                    chunk.append(b"%s publish --confirm %s %s\n"
                                 % (mid.encode(), self.EVENTS[home], body_of(mid)))
            if not self.lines.send(b"".join(chunk)):
                return

    def _confirmations(self) -> None:
        ledger = self.ledger
        while (lines := self.lines.lines(5.0)) is not None:
            now = time.time()
            with ledger.lock:
                for line in lines:
                    if line.endswith(b" ok "):
                        copy = self.pending.pop(line[:-4].decode())
                        copy.confirmed_at = now
                        ledger.confirm(copy.ops[0])
                ledger.lock.notify_all()


class Consumer:
    """Takes ``q``, ``r`` and ``r0`` with manual ack; acks, rejects or holds each delivery.

    ``r`` and ``r0`` hold HTTP publishes with ``x-max-retries`` (``r`` with a
    dead-letter target): a reject past the limit discards the message.
    """

    QUEUES = (b"q", b"r", b"r0")

    def __init__(self, port: int, ledger: Ledger, rng: random.Random) -> None:
        self.lines = Lines(port)
        self.ledger = ledger
        self.rng = rng
        self.waiting: dict[bytes, Op] = {}  # request id -> settle
        self.count = 0

    def run(self, stop: threading.Event) -> None:
        self.lines.send(b"".join(b"c%s consume --confirm %s --manual-ack\n" % (q, q)
                                 for q in self.QUEUES))
        ledger = self.ledger
        while (lines := self.lines.lines(5.0)) is not None and not stop.is_set():
            out = []
            with ledger.lock:
                for line in lines:
                    delivery = parse_delivery(line)
                    if delivery is not None:
                        out.append(self._settle(delivery[0][1:].decode(), delivery[1]))
                    elif line.startswith(b"s") and line.endswith(b" ok "):
                        ledger.confirm(self.waiting.pop(line[:-4]))
            if not self.lines.send(b"".join(out)):
                return

    def _settle(self, queue: str, mid: str) -> bytes:
        copy = self.ledger.copies[(queue, mid)]
        retry, copy.deliveries = copy.deliveries, copy.deliveries + 1
        roll = self.rng.random()
        if queue == "q" and roll < 0.25:
            return b""  # held: in flight at the kill, it must come back
        if roll < (0.5 if queue == "q" else 0.25):
            kind, verb, place = "mqks-ack", b"ack", NONE
        elif copy.limit is not None and retry + 1 > copy.limit:
            kind, verb, place = "mqks-reject-out", b"reject", DEAD if copy.dead else NONE
        else:
            kind, verb, place = "mqks-reject", b"reject", HOME
        rid = b"s%d" % self.count
        self.count += 1
        self.waiting[rid] = self.ledger.settle(copy, kind, place)
        return b"%s %s --confirm c%s %s\n" % (rid, verb, queue.encode(), mid.encode())


class Barrier:
    """Makes the ops known to be applied durable, with a confirmed publish every 20 ms."""

    def __init__(self, port: int, ledger: Ledger) -> None:
        self.lines = Lines(port)
        self.ledger = ledger

    def run(self, stop: threading.Event) -> None:
        ledger, n = self.ledger, 0
        while not stop.wait(0.02):
            with ledger.lock:
                ops = ledger.barrier_snapshot()
            if not ops:
                continue
            n += 1
            if not self.lines.send(b"b%d publish --confirm %s x\n" % (n, BARRIER_EVENT)):
                return
            if not self.lines.expect(b"b%d ok " % n):
                return
            with ledger.lock:
                for op in ops:
                    ledger.confirm(op)


def drain(port: int, queues: list[str], must: set[tuple[str, str]],
          ) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Take every message of ``queues`` with manual-ack consumers, then ack it all.

    Returns how often each (queue, id) came, and the ids whose body differs.
    The server recovers before it listens, so deliveries flow at once; the
    wait ends 0.6 s after the last one once ``must`` is complete (long enough
    for a TTL sweep, every 0.25 s, to move what expired just before the
    consumers came), else after three quiet seconds.
    """
    client = Lines(port)
    client.send(b"".join(b"d%d consume --confirm %s --manual-ack\n" % (n, q.encode())
                         for n, q in enumerate(queues)))
    found: Counter[tuple[str, str]] = Counter()
    garbled = []
    deadline = time.monotonic() + 60
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        lines = client.lines(0.1)
        if lines is None:
            raise ConnectionError("server closed the connection while draining")
        for line in lines:
            delivery = parse_delivery(line)
            if delivery is not None:
                key = (queues[int(delivery[0][1:])], delivery[1])
                found[key] += 1
                if delivery[3] != body_of(key[1]):
                    garbled.append(key[1])
        if lines:
            quiet_since = time.monotonic()
        else:
            quiet = time.monotonic() - quiet_since
            if quiet > 3.0 or (quiet > 0.6 and must <= set(found)):
                break
    client.send(b"".join(b"a%d ack --confirm d%d --all\n" % (n, n) for n in range(len(queues))))
    waiting = {b"a%d ok " % n for n in range(len(queues))}
    while waiting and (lines := client.lines(30.0)):
        waiting.difference_update(lines)
    client.close()
    if waiting:
        raise ConnectionError("the drain's acks were not confirmed")
    return dict(found), garbled
