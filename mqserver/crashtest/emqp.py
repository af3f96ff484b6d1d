"""eMQP clients of the crash test: a pyzmq DEALER client and a DEALER worker.

The client sends REQUESTs to ``e`` (dead-letter target ``e.dead``) and
``e0`` (none) with ``reply-requested``, a ``retry-count`` of 0 to 2 and a
``timeout`` of 1 s; the broker's ``REPLY msgid`` (5 frames) says a request
is stored.  The worker answers each request it gets with a result (an ack),
with eventmq's ``{"value": "TimeoutError"}`` (a failure), or not at all (the
broker fails it when its timeout passes).  A failure within ``retry-count``
redelivers the request, the last one dead-letters it.

eMQP confirms no settle, so the ledger learns they were applied from what
comes next: a result forwarded to the client (6 frames) follows an ack or a
last failure, a redelivery to the worker follows a failure within the
count; a barrier (``mqks.Barrier``) then makes them durable.  Within one
server's life a request's retry count is how often the worker got it before.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from mqserver.crashtest.ledger import DEAD, HOME, NONE, Copy, Ledger, Op
from mqserver.crashtest.mqks import body_of
from mqserver.crashtest.topology import dead_letter

V = b"eMQP/1.0"
QUEUES = ("e", "e0")
TIMEOUT_RESULT = b'{"value": "TimeoutError"}'


def dealer(context: Any, port: int) -> Any:
    import zmq  # pyzmq comes with the test extra, not with the server

    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


class Emqp:
    """The client and the worker, each a thread with its own socket."""

    def __init__(self, ports: dict[str, int], ledger: Ledger, rng: random.Random,
                 prefix: str) -> None:
        import zmq

        self.context = zmq.Context()
        self.ports = ports
        self.ledger = ledger
        self.rng = rng
        self.prefix = prefix
        self.pending: dict[str, Op] = {}  # request id -> settle not yet known applied
        self.unconfirmed: dict[str, list[Copy]] = {}
        self.informed = threading.Event()

    def close(self) -> None:
        self.context.destroy(linger=0)

    def client(self, stop: threading.Event) -> None:
        sock = dealer(self.context, self.ports["emqp"])
        ledger, n = self.ledger, 0
        if not self.informed.wait(10):
            return
        while not stop.is_set():
            with ledger.lock:
                room = len(self.unconfirmed) < 200
                if room:
                    queue = self.rng.choice(QUEUES)
                    limit = self.rng.choice((0, 1, 2))
                    mid = f"{self.prefix}{n}"
                    n += 1
                    copy = ledger.publish(mid, queue, dead_letter(queue), time.time())
                    copy.limit = limit
                    self.unconfirmed[mid] = [copy]
            if room:
                headers = b"reply-requested,retry-count:%d,timeout:1" % limit
                sock.send_multipart([b"", V, b"REQUEST", mid.encode(), queue.encode(),
                                     headers, body_of(mid)])
            while sock.poll(0 if room else 100):
                self._answer(sock.recv_multipart())

    def _answer(self, frames: list[bytes]) -> None:
        if len(frames) < 5 or frames[2] != b"REPLY":
            return
        mid = frames[-1].decode()
        with self.ledger.lock:
            if len(frames) == 5:  # stored
                for copy in self.unconfirmed.pop(mid, ()):
                    copy.confirmed_at = time.time()
                    self.ledger.confirm(copy.ops[0])
            elif mid in self.pending:  # a result: the ack or the last failure was applied
                self.ledger.applied(self.pending.pop(mid))

    def worker(self, stop: threading.Event) -> None:
        sock = dealer(self.context, self.ports["emqp-backend"])
        queues = b"[" + b", ".join(b'[10, "%s"]' % q.encode() for q in QUEUES) + b"]"
        sock.send_multipart([b"", V, b"INFORM", b"inform", queues, b"worker"])
        for _ in range(20):
            sock.send_multipart([b"", V, b"READY", b"ready"])
        beat = time.monotonic()
        while not stop.is_set():
            if time.monotonic() - beat > 1.0:  # silent workers are removed after 5 s
                beat = time.monotonic()
                sock.send_multipart([b"", V, b"HEARTBEAT", b"hb", b"%d" % time.time()])
            if not sock.poll(100):
                continue
            frames = sock.recv_multipart()
            if frames[2] == b"ACK":
                self.informed.set()
            if frames[2] != b"REQUEST":
                continue
            with self.ledger.lock:
                reply = self._work(frames[4].decode(), frames[3].decode())
            if reply is not None:
                sock.send_multipart([b"", V, b"REPLY", b"r", reply, frames[3]])
            sock.send_multipart([b"", V, b"READY", b"ready"])

    def _work(self, queue: str, mid: str) -> bytes | None:
        ledger = self.ledger
        copy = ledger.copies[(queue, mid)]
        retry, copy.deliveries = copy.deliveries, copy.deliveries + 1
        if mid in self.pending:  # redelivered: the failure before was applied
            ledger.applied(self.pending.pop(mid))
        roll = self.rng.random()
        if roll < 0.4:
            self.pending[mid] = ledger.settle(copy, "emqp-ack", NONE)
            return b'{"value": "done"}'
        assert copy.limit is not None
        if retry + 1 > copy.limit:
            op = ledger.settle(copy, "emqp-fail-out", DEAD if copy.dead else NONE)
        else:
            op = ledger.settle(copy, "emqp-fail", HOME)
        self.pending[mid] = op
        if roll < 0.85:
            return TIMEOUT_RESULT
        op.kind = "emqp-timeout" if op.place == HOME else "emqp-timeout-out"
        return None
