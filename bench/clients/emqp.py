"""eMQP with stock pyzmq DEALER sockets: REQUESTs on the frontend, a worker on the backend.

The frames are the ones eventmq 0.3.13's own peers send (docs/protocols/emqp.md,
"What real peers send"): every message has a fresh 36-byte ``str(uuid4())``
msgid, the worker INFORMs ``[[10, "default"]]`` and sends a READY with a new
msgid for every job it finished, and a REQUEST to ``default`` without
headers is what ``defer_job`` sends.  The ids are uuid4-shaped (``UuidIds``:
a random uuid's first 24 digits and a counter), as unique and as long as
eventmq's, at a tenth of ``uuid4()``'s cost in the worker's timed loop.

The queue is eMQP's ``default``: a worker is removed after 5 s of silence,
so it can only INFORM when the drain starts, and a queue nobody serves
sends its requests to ``default``.  A REQUEST is answered ``REPLY msgid``
once stored (durable with a durable store), always: ``flush`` waits for
every one, so the client confirms each publish whatever ``confirm_each``
says.  Untracked requests are settled when sent, so the worker's READY (one
more slot) is its ack.

Frames go through pyzmq's compiled ``send``/``recv`` (``zmq.backend.Socket``):
the Python layer of ``send_multipart`` costs about 2 µs per frame, a REQUEST
has 7 frames, and the client must not be the bottleneck.
"""

from __future__ import annotations

import uuid

import zmq
import zmq.backend

from bench.clients import CHUNK, TIMEOUT, WINDOW, LoadClient, Seen

V = b"eMQP/1.0"
QUEUE = b"default"
WORKER_QUEUES = b'[[10, "default"]]'  #: what a job manager with EVENTMQ_QUEUES set INFORMs
SEND = zmq.backend.Socket.send
RECV = zmq.backend.Socket.recv
GET = zmq.backend.Socket.get
MORE = zmq.SNDMORE


class UuidIds:
    """Distinct msgids shaped like eventmq's ``str(uuid4())`` (36 bytes)."""

    def __init__(self) -> None:
        self.prefix = str(uuid.uuid4())[:24].encode("ascii")
        self.next = 0

    def __call__(self) -> bytes:
        n = self.next
        self.next = n + 1
        return b"%b%012x" % (self.prefix, n)


def skip_rest(sock: zmq.Socket) -> None:
    """The rest of a message the bench has no use for (the INFORM's ACK, HEARTBEATs).

    The hot loops read the frames of a REPLY or a REQUEST one by one instead,
    without asking RCVMORE (a call as costly as a ``recv``) and without a
    list: a REPLY or REQUEST with another frame count would fail the round's
    checks."""
    while GET(sock, zmq.RCVMORE):
        RECV(sock)


def send_ready(sock: zmq.Socket, msgid: bytes) -> None:
    """A worker's READY: ``'' | eMQP/1.0 | READY | msgid``, a fresh msgid each."""
    SEND(sock, b"", MORE)
    SEND(sock, V, MORE)
    SEND(sock, b"READY", MORE)
    SEND(sock, msgid)


class EMQPClient(LoadClient):
    """A frontend DEALER producing and a backend DEALER worker consuming."""

    can_confirm_each = True  # every REQUEST is answered once stored, and flush waits for all

    def open(self) -> None:
        self.context = zmq.Context.instance()
        self.producer = self.socket(self.ports["emqp"])
        self.ids = UuidIds()
        self.sent = self.accepted = 0

    def socket(self, port: int) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
        sock.connect(f"tcp://127.0.0.1:{port}")
        return sock

    def encode(self, chunk: list[bytes]) -> list[tuple[bytes, bytes]]:
        """(msgid, body) pairs, a fresh msgid each; the other frames of a REQUEST
        are constants."""
        ids = self.ids
        return [(ids(), body) for body in chunk]

    def send(self, encoded: list[tuple[bytes, bytes]]) -> None:
        """REQUESTs: ``'' | eMQP/1.0 | REQUEST | msgid | queue | headers | body``."""
        sock = self.producer
        for msgid, body in encoded:
            SEND(sock, b"", MORE)
            SEND(sock, V, MORE)
            SEND(sock, b"REQUEST", MORE)
            SEND(sock, msgid, MORE)
            SEND(sock, QUEUE, MORE)
            SEND(sock, b"", MORE)
            SEND(sock, body)
        self.sent += len(encoded)
        self.read_accepts(wait=self.sent - self.accepted > 10 * CHUNK)

    def read_accepts(self, wait: bool) -> None:
        """Count the REPLYs that say a request was stored; block for one if ``wait``."""
        sock = self.producer
        while self.accepted < self.sent:
            try:
                RECV(sock, 0 if wait else zmq.NOBLOCK)  # ''
            except zmq.Again:
                if wait:
                    raise
                return
            wait = False
            RECV(sock)  # eMQP/1.0
            if RECV(sock) == b"REPLY":
                RECV(sock)  # its msgid
                RECV(sock)  # the request's msgid
                self.accepted += 1
            else:
                skip_rest(sock)

    def flush(self) -> None:
        while self.accepted < self.sent:
            self.read_accepts(wait=True)

    def consume(self, count: int, seen: Seen = None) -> int:
        worker = self.consumer = self.socket(self.ports["emqp-backend"])
        ids = UuidIds()
        worker.send_multipart([b"", V, b"INFORM", ids(), WORKER_QUEUES, b"worker"])
        # never more slots than messages: a slot left over when this worker
        # closes may take the next round's first requests (untracked: settled
        # when sent) if the broker sees them before it sees the close
        window = min(WINDOW, count)
        for _ in range(window):
            send_ready(worker, ids())
        prefix, n = ids.prefix, ids.next  # ids() inlined below: one call less per READY
        received = 0
        while received < count:
            RECV(worker)  # ''
            RECV(worker)  # eMQP/1.0
            if RECV(worker) != b"REQUEST":
                skip_rest(worker)  # the INFORM's ACK, HEARTBEATs
                continue
            RECV(worker)  # msgid
            RECV(worker)  # queue
            RECV(worker)  # headers
            body = RECV(worker)
            received += 1
            if count - received >= window:
                SEND(worker, b"", MORE)
                SEND(worker, V, MORE)
                SEND(worker, b"READY", MORE)
                SEND(worker, b"%b%012x" % (prefix, n))
                n += 1
            if seen is not None:
                seen([body])
        return received
