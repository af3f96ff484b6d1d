"""MQKS over many queues: one event fanned out to F queues, and Q queues with a consumer each.

Both run on one MQKS server with lean raw-socket clients like the suite's
(pre-encoded chunks, one ``sendall`` each; acks of a received chunk in one
write).  A consumer connection may consume several queues: its consumer ids
say which queue a delivery came from, and ``Drain`` reads any number of
such connections with one ``selectors`` loop in the calling thread.

- **fan-out**: event ``E`` bound to F queues (``rebind``); the producer
  publishes N/F messages to ``E`` pipelined and confirms the last; then one
  connection consumes all F queues and acks every copy.  The figure that
  matters is the server's CPU per copy delivered and acked, beside the same
  run's F = 1 (a plain W1 per message).
- **queues**: Q queues, each bound to an event of its own and consumed by
  its own consumer, ``per_connection`` consumers to a connection; a
  producer thread publishes N messages spread over the Q events in turn
  (every line a different event: no publish runs) while the consumers
  drain.  RSS is read before the consumers, after them and after the round.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Any

from bench.clients import CHUNK, TIMEOUT, bodies, connect, recv
from bench.proc import Server
from bench.workloads import Meter


def request(sock: socket.socket, lines: list[bytes], reply: bytes = b" ok \n") -> None:
    """Send ``lines`` in one write; wait until each got ``reply`` (``--confirm`` answers)."""
    sock.sendall(b"".join(lines))
    expected, seen, data = len(lines), 0, b""
    while seen < expected:
        data += recv(sock)
        cut = data.rfind(b"\n") + 1
        for line in data[:cut].split(b"\n")[:-1]:
            if not line.endswith(reply.rstrip(b"\n")):
                raise RuntimeError(f"unexpected MQKS reply {line[:200]!r}")
            seen += 1
        data = data[cut:]


def confirm(sock: socket.socket) -> None:
    """A last ``publish --confirm``: answered once everything sent before it was taken."""
    request(sock, [b"sync publish --confirm bench.nobody x\n"], b"sync ok \n")


def publishes(events: list[bytes], count: int, size: int) -> list[bytes]:
    """``count`` publish lines, message n to ``events[n % len(events)]``, in chunks of ``CHUNK``."""
    payload = bodies(count, size)
    spread = len(events)
    return [b"".join(b"m%d publish %s %s\n" % (n, events[n % spread], payload[n])
                     for n in range(first, min(count, first + CHUNK)))
            for first in range(0, count, CHUNK)]


def consume_lines(tag: bytes, queues: list[bytes], events: list[bytes] | None) -> list[bytes]:
    """Manual-ack consumes of ``queues`` (each bound to its event, if given), confirmed."""
    return [b"%s%d consume --confirm %s%s --manual-ack\n"
            % (tag, n, queue, b" " + events[n] if events else b"")
            for n, queue in enumerate(queues)]


class Drain:
    """Receive and ack deliveries on several MQKS consumer connections at once."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks

    def run(self, count: int) -> int:
        """Until ``count`` deliveries came back over all connections; returns how many."""
        pending: dict[socket.socket, bytes] = {sock: b"" for sock in self.socks}
        received = 0
        with selectors.DefaultSelector() as selector:
            for sock in self.socks:
                selector.register(sock, selectors.EVENT_READ)
            while received < count:
                ready = selector.select(TIMEOUT)
                if not ready:
                    raise TimeoutError(f"no delivery for {TIMEOUT} s ({received} of {count})")
                for key, _ in ready:
                    sock = key.fileobj
                    data = pending[sock] + recv(sock)  # type: ignore[operator]
                    cut = data.rfind(b"\n") + 1
                    pending[sock] = data[cut:]  # type: ignore[index]
                    acks = []
                    for line in data[:cut].split(b"\n")[:-1]:
                        # "{consumer} ok {message id} event=... {body}"; a
                        # consume's confirm is "{consumer} ok " (no id)
                        consumer, _, mid = line.split(b" ", 3)[:3]
                        if mid:
                            acks.append(b"a ack %s %s\n" % (consumer, mid))
                    received += len(acks)
                    if acks:
                        sock.sendall(b"".join(acks))  # type: ignore[union-attr]
        return received


def fanout(server: Server, tag: str, copies: int, width: int, size: int) -> dict[str, Any]:
    """One event bound to ``width`` queues; ``copies`` // ``width`` publishes, every copy acked."""
    name = tag.encode()
    event = name + b"ev"
    queues = [b"%sq%d" % (name, n) for n in range(width)]
    messages = max(1, copies // width)
    producer = connect(server.ports["mqks"])
    consumer = connect(server.ports["mqks"])
    try:
        request(producer, [b"b%d rebind --confirm %s %s\n" % (n, queue, event)
                           for n, queue in enumerate(queues)])
        chunks = publishes([event], messages, size)
        meter = Meter(server)
        for chunk in chunks:
            producer.sendall(chunk)
        confirm(producer)
        produced = time.perf_counter() - meter.started
        consumer.sendall(b"".join(consume_lines(name + b"c", queues, None)))
        received = Drain([consumer]).run(messages * width)
        result = meter.finish(count=messages * width, received=received,
                              messages=messages, produce=produced, width=width)
    finally:
        producer.close()
        consumer.close()
    result["drain"] = result["wall"] - produced
    return result


class Producer(threading.Thread):
    """Sends pre-encoded chunks and a confirm in a thread of its own (while others drain)."""

    def __init__(self, sock: socket.socket, chunks: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.sock, self.chunks = sock, chunks
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in self.chunks:
                self.sock.sendall(chunk)
            confirm(self.sock)
        except BaseException as e:  # reported by the draining side
            self.error = e

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def many_queues(server: Server, tag: str, count: int, queues: int, per_connection: int,
                size: int) -> dict[str, Any]:
    """``queues`` queues with a consumer each, ``per_connection`` consumers to a
    connection; ``count`` messages spread over them while they drain."""
    name = tag.encode()
    names = [b"%sq%d" % (name, n) for n in range(queues)]
    events = [b"%se%d" % (name, n) for n in range(queues)]
    chunks = publishes(events, count, size)
    rss_before = server.rss_bytes()
    socks: list[socket.socket] = []
    producer = connect(server.ports["mqks"])
    try:
        for first in range(0, queues, per_connection):
            sock = connect(server.ports["mqks"])
            socks.append(sock)
            part = slice(first, first + per_connection)
            request(sock, consume_lines(b"%sc%d-" % (name, first), names[part], events[part]))
        rss_consumers = server.rss_bytes()
        sender = Producer(producer, chunks)
        meter = Meter(server)
        sender.start()
        received = Drain(socks).run(count)
        sender.result()
        result = meter.finish(count=count, received=received, queues=queues,
                              connections=len(socks))
        result["rss_after"] = server.rss_bytes()
    finally:
        producer.close()
        for sock in socks:
            sock.close()
    result.update(rss_before=rss_before, rss_consumers=rss_consumers)
    return result
