"""MQKS: text lines; a manual-ack consumer, ``--confirm`` on a last publish as the barrier,
or on every publish (``confirm_each``: W1c)."""

from __future__ import annotations

import socket

from bench.clients import LineReplies, LoadClient, Seen, connect, recv


class MQKSClient(LoadClient):
    """Publishes to event ``ev{queue}``, bound to ``queue`` before the first publish."""

    producer: socket.socket
    sequence = 0
    can_confirm_each = True

    def open(self) -> None:
        self.producer = connect(self.ports["mqks"])
        self.event = b"ev" + self.queue.encode()
        self.producer.sendall(b"rb rebind --confirm %s %s\n" % (self.queue.encode(), self.event))
        reply = b""
        while not reply.endswith(b"\n"):
            reply += recv(self.producer)
        assert reply == b"rb ok \n", reply
        self.replies = LineReplies(self.producer, b"\n")

    def encode(self, chunk: list[bytes]) -> tuple[bytes, int]:
        first, self.sequence = self.sequence, self.sequence + len(chunk)
        event = b"--confirm " + self.event if self.confirm_each else self.event
        return b"".join(b"m%d publish %s %s\n" % (first + n, event, body)
                        for n, body in enumerate(chunk)), len(chunk)

    def send(self, encoded: tuple[bytes, int]) -> None:
        if self.confirm_each:  # an ``ok `` line per publish: a few chunks unanswered at most
            self.replies.send(*encoded)
        else:
            self.producer.sendall(encoded[0])

    def flush(self) -> None:
        if self.confirm_each:
            self.replies.wait()
            return
        # Published with --confirm, answered once it and (the connection being
        # FIFO) everything before it is stored: durable on a durable backend.
        self.producer.sendall(b"sync publish --confirm bench.nobody x\n")
        reply = b""
        while not reply.endswith(b"sync ok \n"):
            reply += recv(self.producer)

    def consume(self, count: int, seen: Seen = None) -> int:
        consumer = connect(self.ports["mqks"])
        self.consumer = consumer
        cid = b"c" + self.queue.encode()
        consumer.sendall(b"%s consume %s --manual-ack\n" % (cid, self.queue.encode()))
        prefix = len(cid) + 4  # "{cid} ok "
        ack = b"a ack %s " % cid
        received = 0
        pending = b""
        while received < count:
            data = pending + recv(consumer)
            cut = data.rfind(b"\n") + 1
            lines = data[:cut].split(b"\n")
            lines.pop()
            pending = data[cut:]
            ids = [line[prefix:line.index(b" ", prefix)] for line in lines]
            received += len(ids)
            consumer.sendall(b"".join(ack + mid + b"\n" for mid in ids))
            if seen is not None:
                seen([line.split(b" ", 4)[4] for line in lines])
        return received
