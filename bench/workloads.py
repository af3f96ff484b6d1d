"""The workloads, one round each: W1 (W3 on a durable backend) and W1c, W2, paced latency, memory,
restart (after a clean stop, and after a crash).

Every round gets a fresh queue and fresh client connections, measures wall
time with ``perf_counter``, the client's CPU (``getrusage``: every thread
of this process, pyzmq's I/O thread included) and the server's (from
``/proc``), and checks that every message came back.
"""

from __future__ import annotations

import multiprocessing
import re
import resource
import socket
import statistics
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from bench.clients import CHUNK, LoadClient, bodies, connect, recv, stamp, stamped_at
from bench.proc import Server

ClientFactory = Callable[[dict[str, int], str], LoadClient]
WARM_UP = 0.02  #: share of the paced messages left out of the latency figures


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Meter:
    """Wall, client CPU and server CPU from construction to ``finish``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.server_cpu = server.cpu_seconds()
        self.client_cpu = cpu()
        self.started = time.perf_counter()

    def finish(self, **figures: Any) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        return {"wall": wall, "client_cpu": cpu() - self.client_cpu,
                "server_cpu": self.server.cpu_seconds() - self.server_cpu, **figures}


def encoded(client: LoadClient, count: int, size: int, per_write: int = CHUNK) -> list[Any]:
    payload = bodies(count, size)
    return [client.encode(payload[n:n + per_write]) for n in range(0, count, per_write)]


def w1(make: ClientFactory, server: Server, queue: str, count: int, size: int,
       confirm_each: bool = False, per_write: int = CHUNK) -> dict[str, Any]:
    """Publish ``count`` messages pipelined on one connection, ``per_write``
    to a write, then drain and ack them on another.  With ``confirm_each``
    (W1c) the broker confirms every publish, not just the last."""
    client = make(server.ports, queue)
    client.confirm_each = confirm_each
    try:
        chunks = encoded(client, count, size, per_write)
        meter = Meter(server)
        for chunk in chunks:
            client.send(chunk)
        client.flush()
        produced = time.perf_counter() - meter.started
        received = client.consume(count)
        result = meter.finish(count=count, received=received, produce=produced)
    finally:
        client.close()
    result["drain"] = result["wall"] - produced
    return result


class Consumer(threading.Thread):
    """``client.consume`` in a thread, so a producer can run at the same time."""

    def __init__(self, client: LoadClient, count: int) -> None:
        super().__init__(daemon=True)
        self.client, self.count = client, count
        self.received = 0
        self.error: BaseException | None = None
        self.done = 0.0

    def run(self) -> None:
        try:
            self.received = self.client.consume(self.count)
        except BaseException as e:  # reported by the producer side
            self.error = e
        self.done = time.perf_counter()

    def result(self) -> int:
        self.join()
        if self.error is not None:
            raise self.error
        return self.received


def w2(make: ClientFactory, server: Server, queue: str, count: int, size: int) -> dict[str, Any]:
    """Producer and consumer at once: end-to-end msgs/s."""
    client = make(server.ports, queue)
    try:
        chunks = encoded(client, count, size)
        consumer = Consumer(client, count)
        meter = Meter(server)
        consumer.start()
        for chunk in chunks:
            client.send(chunk)
        client.flush()
        received = consumer.result()
        result = meter.finish(count=count, received=received)
    finally:
        client.close()
    result["wall"] = consumer.done - meter.started
    return result


def paced(make: ClientFactory, server: Server, queue: str, count: int, size: int,
          rate: float) -> dict[str, Any]:
    """Publish at ``rate`` msgs/s, each body stamped with its send time; the
    consumer's receive time minus the stamp is the latency.  The producer is
    a process of its own: in a thread it would hold the GIL the consumer
    waits for (up to the 5 ms switch interval) and the tail would be the
    client's.  ``perf_counter`` is CLOCK_MONOTONIC, the same in both."""
    client = make(server.ports, queue)  # makes the queue exist; consumes
    latencies: list[int] = []

    def seen(found: list[bytes]) -> None:
        now = time.perf_counter_ns()
        latencies.extend(now - stamped_at(body) for body in found)

    spawn = multiprocessing.get_context("spawn")
    results, child_end = spawn.Pipe(duplex=False)
    producer = spawn.Process(target=paced_producer, daemon=True,
                             args=(make, server.ports, queue, count, size, rate, child_end))
    try:
        meter = Meter(server)
        producer.start()
        received = client.consume(count, seen)
        producer_cpu = results.recv()
        producer.join()
        result = meter.finish(count=count, received=received)
    finally:
        client.close()
        if producer.is_alive():
            producer.kill()
    result["client_cpu"] += producer_cpu
    kept = sorted(latencies[int(len(latencies) * WARM_UP):])
    result["p50_ms"] = kept[len(kept) // 2] / 1e6
    result["p99_ms"] = kept[min(len(kept) - 1, int(len(kept) * 0.99))] / 1e6
    result["mean_ms"] = statistics.fmean(kept) / 1e6
    return result


def paced_producer(make: ClientFactory, ports: dict[str, int], queue: str, count: int,
                   size: int, rate: float, results: Connection) -> None:
    """The paced producer process: sends each message when it is due; reports its CPU."""
    client = make(ports, queue)
    started_cpu = cpu()
    started = time.perf_counter()
    sent = 0
    while sent < count:
        due = min(count, int((time.perf_counter() - started) * rate) + 1)
        if due > sent:
            client.send(client.encode([stamp(size) for _ in range(due - sent)]))
            sent = due
        else:
            time.sleep(max(0.0, started + sent / rate - time.perf_counter()))
    client.flush()
    client.close()
    results.send(cpu() - started_cpu)


def memory(make: ClientFactory, server: Server, queue: str, count: int,
           size: int) -> dict[str, Any]:
    """RSS of ``server`` (fresh) before and after it takes ``count`` ready messages.

    ``rss_filled`` is read a second after the last publish was confirmed (a
    durable backend's last batch settles); ``rss`` once the backlog is at
    rest, when RSS stopped falling (mqserver packs a backlog nobody touches
    within a few seconds: ``mqserver.broker.resting``).
    """
    before = server.rss_bytes()
    meter = Meter(server)
    fill(make, server, queue, count, size)
    time.sleep(1.0)  # let a durable backend's last batch settle
    result = meter.finish(count=count)
    result["rss_before"] = before
    result["rss_filled"] = server.rss_bytes()
    result["rss"] = settled_rss(server)
    return result


def settled_rss(server: Server, step: float = 1.0, still: int = 5, most: float = 40.0,
                either_way: bool = False) -> int:
    r"""RSS once it has not fallen (``either_way``: moved) by more than 1 MB for
    ``still`` ``step``\ s in a row (at most ``most`` seconds): long enough for two
    looks of mqserver's ``--pack-at-rest`` (1 s apart) and the packing after
    them; either way after a restart, as mqserver's background read of what it
    recovered raises it."""
    rss = server.rss_bytes()
    steady = 0
    deadline = time.perf_counter() + most
    while steady < still and time.perf_counter() < deadline:
        time.sleep(step)
        now = server.rss_bytes()
        moved = abs(now - rss) if either_way else rss - now
        steady = steady + 1 if moved < 1_000_000 else 0
        rss = now
    return rss


def fill(make: ClientFactory, server: Server, queue: str, count: int, size: int) -> None:
    """Leave ``count`` ready messages of ``size`` bytes in ``queue`` (confirmed by ``flush``)."""
    client = make(server.ports, queue)
    try:
        for n in range(0, count, 100 * CHUNK):
            for chunk in encoded(client, min(100 * CHUNK, count - n), size):
                client.send(chunk)
        client.flush()
    finally:
        client.close()


def restart(make: ClientFactory, start: Callable[[], Server], queue: str, count: int,
            size: int, crash: bool = False) -> dict[str, Any]:
    """Time a restart with ``count`` ready messages: fill a fresh server, read its
    RSS, stop it (SIGTERM; with ``crash``, SIGKILL: nothing written at the stop,
    every store replays), start it again on the same files and time until it
    answers that all ``count`` are there (``backlog``); then its RSS, and the
    recovery time the server itself logged (``reported_recovery``)."""
    server = start()
    try:
        fill(make, server, queue, count, size)
        # a durable backend's last batch settles, as in ``memory``; before a
        # crash, longer than Redis's everysec AOF fsync, so the kill finds it
        # fsynced as the fill's confirms said
        time.sleep(1.5 if crash else 1.0)
        before = server.rss_bytes()
    finally:
        server.stop(crash=crash)
    client_cpu = cpu()
    started = time.perf_counter()
    server = start()
    try:
        deadline = started + 600
        while (found := backlog(server, queue)) != count:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{server.name}: {found} of {count} messages after a restart")
            time.sleep(0.01)
        wall = time.perf_counter() - started
        # the count can come before the messages are at hand (mqserver reads a
        # snapshot's chunks, and decodes a log replay's, once it serves): the
        # first delivery is what a consumer waits for
        client = make(server.ports, queue)
        try:
            client.consume(1)
        finally:
            client.close()
        first = time.perf_counter() - started
        return {"count": count, "wall": wall, "recovery": wall, "first": first,
                "client_cpu": cpu() - client_cpu, "server_cpu": server.cpu_seconds(),
                "rss_before": before,
                "rss": settled_rss(server, 0.5, 4, 30.0, either_way=True),
                "reported": reported_recovery(server)}
    finally:
        server.stop()


#: a server's own report of how long its recovery took, in its log: mqserver's
#: store ("... N messages recovered in X s (replay)", or a clean-shutdown
#: snapshot's "... N messages read in X s (no replay)"); Redis loading its AOF
REPORTED = re.compile(r"messages (?:recovered|read) in ([\d.]+) s \((?:no )?replay\)"
                      r"|DB loaded from append only file: ([\d.]+) seconds")


def reported_recovery(server: Server, wait: float = 5.0) -> float | None:
    """The recovery time ``server`` logged (the last such line; waited for up to
    ``wait`` seconds, as the log may trail the answer that the backlog is back);
    None if it logs none (an mqserver from before the line, for a comparison)."""
    deadline = time.perf_counter() + wait
    while not (found := REPORTED.findall(server.log_text())):
        if time.perf_counter() > deadline:
            return None
        time.sleep(0.05)
    return float(next(value for value in found[-1] if value))


def backlog(server: Server, queue: str) -> int | None:
    """Ready messages in ``queue`` as the server tells them (None: not serving yet).

    MQKS ``_eval`` of its stats view; Redis ``LLEN``, which answers
    ``-LOADING`` while the AOF is being read."""
    try:
        if "mqks" in server.ports:
            with connect(server.ports["mqks"]) as sock:
                sock.sendall(b"n _eval sum(q.qsize() for q in state.queues.itervalues())\n")
                reply = read_line(sock, b"\n")
            return int(reply.split()[2]) if reply.startswith(b"n ok ") else None
        with connect(server.ports["main"]) as sock:
            key = queue.encode()
            sock.sendall(b"*2\r\n$4\r\nLLEN\r\n$%d\r\n%s\r\n" % (len(key), key))
            reply = read_line(sock, b"\r\n")
        return int(reply[1:]) if reply.startswith(b":") else None
    except OSError:
        return None


def read_line(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        data += recv(sock)
    return data.strip()
