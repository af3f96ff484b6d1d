"""beanstalkd: put (``INSERTED`` per job), pipelined reserve, delete as the ack."""

from __future__ import annotations

import socket

from bench.clients import WINDOW, LineProducer, LineReplies, Seen, connect, recv


def command(sock: socket.socket, line: bytes, expect: bytes) -> None:
    sock.sendall(line)
    reply = b""
    while not reply.endswith(b"\r\n"):
        reply += recv(sock)
    assert reply.startswith(expect), reply


class BeanstalkClient(LineProducer):
    """Producer ``use``s the tube, consumer ``watch``es only it."""

    #: beanstalkd answers every put (``INSERTED``) anyway: W1c is W1
    can_confirm_each = True

    producer: socket.socket

    def open(self) -> None:
        self.producer = connect(self.ports["main"])
        command(self.producer, b"use %s\r\n" % self.queue.encode(), b"USING")
        self.replies = LineReplies(self.producer)

    def encode(self, chunk: list[bytes]) -> tuple[bytes, int]:
        return (b"".join(b"put 0 0 120 %d\r\n%s\r\n" % (len(body), body) for body in chunk),
                len(chunk))

    def consume(self, count: int, seen: Seen = None) -> int:
        consumer = self.consumer = connect(self.ports["main"])
        command(consumer, b"watch %s\r\n" % self.queue.encode(), b"WATCHING")
        command(consumer, b"ignore default\r\n", b"WATCHING")
        reserves = min(WINDOW, count)
        consumer.sendall(b"reserve\r\n" * reserves)
        received = 0
        pending = b""
        while received < count:
            data = pending + recv(consumer)
            acks, found, pending = self.parse(data)
            received += len(found)
            more = min(len(found), count - reserves)
            reserves += more
            consumer.sendall(b"".join(acks) + b"reserve\r\n" * more)
            if seen is not None:
                seen(found)
        return received

    @staticmethod
    def parse(data: bytes) -> tuple[list[bytes], list[bytes], bytes]:
        """(delete commands, bodies, rest) for the complete replies in ``data``."""
        acks, found = [], []
        pos, end = 0, len(data)
        while True:
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                break
            if data.startswith(b"RESERVED ", pos):
                _, jid, size = data[pos:eol].split()
                stop = eol + 2 + int(size)
                if stop + 2 > end:
                    break
                acks.append(b"delete %s\r\n" % jid)
                found.append(data[eol + 2:stop])
                pos = stop + 2
            else:  # DELETED
                pos = eol + 2
        return acks, found, data[pos:]
