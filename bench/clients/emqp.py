"""eMQP with stock pyzmq DEALER sockets: REQUESTs on the frontend, a worker on the backend.

The queue is eMQP's ``default``: a worker is removed after 5 s of silence,
so it can only INFORM when the drain starts, and a queue nobody serves
sends its requests to ``default``.  A REQUEST is answered ``REPLY msgid``
once stored; untracked requests are settled when sent, so the worker's
READY (one more slot) is its ack.
"""

from __future__ import annotations

import zmq

from bench.clients import CHUNK, TIMEOUT, WINDOW, LoadClient, Seen

V = b"eMQP/1.0"
QUEUE = b"default"


class EMQPClient(LoadClient):
    """A frontend DEALER producing and a backend DEALER worker consuming."""

    def open(self) -> None:
        self.context = zmq.Context.instance()
        self.producer = self.socket(self.ports["emqp"])
        self.sequence = 0
        self.sent = self.accepted = 0

    def socket(self, port: int) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
        sock.connect(f"tcp://127.0.0.1:{port}")
        return sock

    def encode(self, chunk: list[bytes]) -> list[list[bytes]]:
        first, self.sequence = self.sequence, self.sequence + len(chunk)
        return [[b"", V, b"REQUEST", b"%d" % (first + n), QUEUE, b"", body]
                for n, body in enumerate(chunk)]

    def send(self, encoded: list[list[bytes]]) -> None:
        send = self.producer.send_multipart
        for frames in encoded:
            send(frames)
        self.sent += len(encoded)
        self.read_accepts(wait=self.sent - self.accepted > 10 * CHUNK)

    def read_accepts(self, wait: bool) -> None:
        """Count the REPLYs that say a request was stored; block for one if ``wait``."""
        recv = self.producer.recv_multipart
        while self.accepted < self.sent:
            try:
                frames = recv(0 if wait else zmq.NOBLOCK)
            except zmq.Again:
                if wait:
                    raise
                return
            wait = False
            if frames[2] == b"REPLY":
                self.accepted += 1

    def flush(self) -> None:
        while self.accepted < self.sent:
            self.read_accepts(wait=True)

    def consume(self, count: int, seen: Seen = None) -> int:
        worker = self.consumer = self.socket(self.ports["emqp-backend"])
        worker.send_multipart([b"", V, b"INFORM", b"inform", b"", b"worker"])
        ready = [b"", V, b"READY", b"r"]
        for _ in range(WINDOW):
            worker.send_multipart(ready)
        received = 0
        recv, send = worker.recv_multipart, worker.send_multipart
        while received < count:
            frames = recv()
            if frames[2] != b"REQUEST":
                continue  # ACK of the INFORM, HEARTBEATs
            received += 1
            if count - received >= WINDOW:
                send(ready)
            if seen is not None:
                seen([frames[6]])
        return received
