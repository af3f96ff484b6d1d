"""Lean load generators, one module per system, all with the same shape.

A client is bound to one queue.  The producer side takes pre-encoded
chunks (``encode`` runs before the clock starts), writes each with one
``sendall`` and reads the server's replies in big chunks; ``flush`` returns
once the server has taken everything sent (confirmed where the protocol
can).  ``consume`` opens the consumer connection, keeps ``WINDOW`` messages
in flight, acks every delivery in one write per received chunk and returns
when ``count`` messages came back.  So the figures are the server's, not
the client's: the bench reports the client's CPU next to each of them.
"""

from __future__ import annotations

import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

WINDOW = 1000  #: unacked deliveries a consumer allows (W1's window)
CHUNK = 1000  #: messages per pre-encoded producer write
TIMEOUT = 60.0  #: seconds without progress before a round fails
RECV = 1 << 20

#: called with the bodies of each received chunk (latency rounds only)
Seen = Callable[[list[bytes]], None] | None


def connect(port: int) -> socket.socket:
    """A blocking loopback TCP connection with Nagle off and a deadline per recv."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv(sock: socket.socket) -> bytes:
    """One chunk; an orderly close mid-round is an error."""
    data = sock.recv(RECV)
    if not data:
        raise ConnectionError("server closed the connection mid-round")
    return data


def stamp(size: int) -> bytes:
    """A body of ``size`` bytes that starts with the send time (for latency)."""
    return b"%019d" % time.perf_counter_ns() + b"t" * (size - 19)


def stamped_at(body: bytes) -> int:
    """The send time ``stamp`` put in ``body``, in ns."""
    return int(body[:19])


def bodies(count: int, size: int) -> list[bytes]:
    """``count`` distinct bodies of ``size`` bytes (distinct so an ack by
    value, as Redis' LREM does, removes the right one)."""
    filler = b"x" * (size - 19)
    return [b"%019d" % n + filler for n in range(count)]


class LoadClient(ABC):
    """One system's producer and consumer for one queue (see the module doc)."""

    producer: Any  #: a socket (pyzmq's for eMQP), connected by ``open``
    consumer: Any = None  #: connected by ``consume``
    #: whether this client can have the broker confirm every publish (W1c)
    can_confirm_each: ClassVar[bool] = False
    #: set before ``encode`` by the W1c workload: every publish of every chunk
    #: asks for the broker's confirmation, and ``flush`` returns once each was
    #: confirmed (False: as today, only what ``flush`` sends is confirmed)
    confirm_each: bool = False

    def __init__(self, ports: dict[str, int], queue: str) -> None:
        self.ports = ports
        self.queue = queue
        self.open()

    @abstractmethod
    def open(self) -> None:
        """Connect the producer and make the queue exist (before anyone consumes)."""

    @abstractmethod
    def encode(self, chunk: list[bytes]) -> Any:
        """Pre-encode publishing ``chunk``; done before the clock starts."""

    @abstractmethod
    def send(self, encoded: Any) -> None:
        """Write one encoded chunk (and read whatever replies keep the pipe moving)."""

    @abstractmethod
    def flush(self) -> None:
        """Return once the server has taken every message sent."""

    @abstractmethod
    def consume(self, count: int, seen: Seen = None) -> int:
        """Receive and ack ``count`` messages; return how many came back."""

    def close(self) -> None:
        """Close every connection."""
        self.producer.close()
        if self.consumer is not None:
            self.consumer.close()


class LineReplies:
    """A producer connection answered with one line per message (beanstalkd
    ``INSERTED``, Redis ``:n``, CRLF; MQKS ``ok `` with ``--confirm``, LF).
    Servers like these stop reading while their replies cannot be written,
    so at most a few chunks stay unanswered."""

    def __init__(self, sock: socket.socket, end: bytes = b"\r\n") -> None:
        self.sock = sock
        self.end = end
        self.sent = self.answered = 0
        self.rest = b""

    def send(self, data: bytes, count: int) -> None:
        self.sock.sendall(data)
        self.sent += count
        while self.sent - self.answered > 4 * CHUNK:
            self.read()

    def read(self) -> None:
        data, end = self.rest + recv(self.sock), self.end
        cut = data.rfind(end) + len(end)
        self.answered += data.count(end, 0, cut)
        self.rest = data[cut:]

    def wait(self) -> None:
        """Until every message sent is answered."""
        while self.answered < self.sent:
            self.read()


class LineProducer(LoadClient):
    """A client whose producer is answered one line per message (``LineReplies``)."""

    replies: LineReplies

    def send(self, encoded: tuple[bytes, int]) -> None:
        self.replies.send(*encoded)

    def flush(self) -> None:
        self.replies.wait()
