"""Idle connections: the server's RSS per open client connection that does nothing.

Opens ``count`` TCP connections to one protocol's port of a fresh server,
in batches the listen backlog takes without dropping SYNs, and counts them
as accepted once the server process holds that many more file
descriptors (``/proc/PID/fd``): Twisted builds a connection's protocol in the same
``doRead`` that accepts it.  Then it waits for RSS to settle and reads it.
Each file descriptor is one on either side, so both the bench and the
server need ``RLIMIT_NOFILE`` above ``count`` (``raise_nofile``; the server
inherits the bench's limit) and the server a ``--max-connections`` above it
(loopback clients count only toward that, not ``--max-connections-per-ip``).
"""

from __future__ import annotations

import os
import resource
import socket
import time
from typing import Any

from bench.proc import Server

BATCH = 50  #: connections opened before waiting for the server to accept them
SETTLE = 1.0  #: seconds RSS must stay put before it is read


def raise_nofile(needed: int) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; fail below ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise RuntimeError(f"RLIMIT_NOFILE is {soft} (hard limit), {needed} needed")
    return soft


def descriptors(pid: int) -> int:
    """How many file descriptors process ``pid`` holds (an idle server opens no others)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_descriptors(server: Server, target: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (held := descriptors(server.pid)) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.name} holds {held} descriptors, {target} expected")
        time.sleep(0.01)


def settled_rss(server: Server) -> int:
    """RSS once it stopped moving for ``SETTLE`` seconds (or after 10 s)."""
    deadline = time.monotonic() + 10.0
    last = server.rss_bytes()
    while time.monotonic() < deadline:
        time.sleep(SETTLE)
        now = server.rss_bytes()
        if now == last:
            break
        last = now
    return last


def idle(server: Server, port: int, count: int) -> dict[str, Any]:
    """Open ``count`` connections to ``port`` of ``server`` (fresh) that send nothing."""
    raise_nofile(count + 100)
    before = settled_rss(server)
    held = descriptors(server.pid)
    opened: list[socket.socket] = []
    started = time.perf_counter()
    server_cpu = server.cpu_seconds()
    try:
        while len(opened) < count:
            for _ in range(min(BATCH, count - len(opened))):
                opened.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            wait_descriptors(server, held + len(opened))
        wall = time.perf_counter() - started
        cpu = server.cpu_seconds() - server_cpu
        after = settled_rss(server)
        alive = server.process.poll() is None and descriptors(server.pid) >= held + count
    finally:
        for sock in opened:
            sock.close()
    return {"count": count, "received": count if alive else 0, "wall": wall, "client_cpu": 0.0,
            "server_cpu": cpu, "rss_before": before, "rss": after}
