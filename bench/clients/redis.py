"""Redis as a queue with acks: LPUSH; BLMOVE to a processing list; LREM as the ack.

The ack removes from the processing list's tail (``LREM key -1 body``),
where the oldest delivery is, so it finds its message at once, as a client
acking in order would do.  Commands are raw RESP, pre-encoded.
"""

from __future__ import annotations

import socket

from bench.clients import WINDOW, LineProducer, LineReplies, Seen, connect, recv


def resp(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def bulk_replies(data: bytes) -> tuple[list[bytes], bytes]:
    """Bulk-string replies (BLMOVE) in ``data``, skipping integer ones (LREM), and the rest."""
    found = []
    pos, end = 0, len(data)
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            break
        if data[pos] == 36:  # "$": a moved message
            stop = eol + 2 + int(data[pos + 1:eol])
            if stop + 2 > end:
                break
            found.append(data[eol + 2:stop])
            pos = stop + 2
        elif data[pos] == 58:  # ":": LREM's count
            pos = eol + 2
        else:
            raise ValueError(f"unexpected Redis reply {data[pos:eol]!r}")
    return found, data[pos:]


class RedisClient(LineProducer):
    """List ``queue`` and its processing list ``queue:processing``."""

    #: Redis answers every command anyway: W1c is W1
    can_confirm_each = True

    producer: socket.socket

    def open(self) -> None:
        self.producer = connect(self.ports["main"])
        self.key = self.queue.encode()
        self.processing = self.key + b":processing"
        self.replies = LineReplies(self.producer)

    def encode(self, chunk: list[bytes]) -> tuple[bytes, int]:
        key = self.key
        return b"".join(resp(b"LPUSH", key, body) for body in chunk), len(chunk)

    def consume(self, count: int, seen: Seen = None) -> int:
        consumer = self.consumer = connect(self.ports["main"])
        move = resp(b"BLMOVE", self.key, self.processing, b"RIGHT", b"LEFT", b"0")
        lrem = b"*4\r\n$4\r\nLREM\r\n$%d\r\n%s\r\n$2\r\n-1\r\n" % (
            len(self.processing), self.processing)
        moves = min(WINDOW, count)
        consumer.sendall(move * moves)
        received = 0
        pending = b""
        while received < count:
            found, pending = bulk_replies(pending + recv(consumer))
            received += len(found)
            more = min(len(found), count - moves)
            moves += more
            consumer.sendall(b"".join(lrem + b"$%d\r\n%s\r\n" % (len(body), body)
                                      for body in found) + move * more)
            if seen is not None:
                seen(found)
        return received
