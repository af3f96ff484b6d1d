"""Peers in the same run: Debian's beanstalkd, redis-server, nats-server and rabbitmq-server.

``make bench-setup`` (or ``.ci/run``) installs them with apt; a missing
binary skips that peer with the reason in the report.  Each runs on free
loopback ports in its own temporary directory (binlog, AOF, JetStream's
store, RabbitMQ's Mnesia) and is stopped by PID.  One nats-server serves
both stream storages and one RabbitMQ node the three queue types: the
storage or queue type is the client's choice (``bench.systems``), as it is
of a real deployment's clients.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench import rabbitmq
from bench.proc import Server, free_port, ready, wait_port

#: peer name -> (binary, extra arguments, durability in words)
PEERS: dict[str, tuple[str, list[str], str]] = {
    "beanstalkd": ("beanstalkd", [], "memory"),
    "beanstalkd-b": ("beanstalkd", ["-b", "{dir}"], "binlog, fsync at most every 50 ms"),
    "beanstalkd-b-f0": ("beanstalkd", ["-b", "{dir}", "-f0"], "binlog, fsync always"),
    "redis": ("redis-server", ["--appendonly", "no"], "memory"),
    "redis-aof-everysec": ("redis-server", ["--appendonly", "yes", "--appendfsync", "everysec"],
                           "AOF, fsync every second"),
    "redis-aof-always": ("redis-server", ["--appendonly", "yes", "--appendfsync", "always"],
                         "AOF, fsync always"),
    "jetstream": ("nats-server", ["-js", "-sd", "{dir}"],
                  "JetStream streams, memory or file (2.9 never fsyncs its files)"),
    "rabbitmq": ("rabbitmq-server", [], "classic transient, classic durable or quorum queues"),
}


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here, or None."""
    binary = PEERS[peer][0]
    if binary == "rabbitmq-server":
        return rabbitmq.missing()
    if shutil.which(binary) is None:
        return f"{binary} not installed (make bench-setup)"
    return None


def start_peer(peer: str, workdir: Path) -> Server:
    """Start ``peer`` on a free loopback port; ``server.ports['main']`` is it."""
    binary, extra, _ = PEERS[peer]
    if binary == "rabbitmq-server":
        return rabbitmq.start_rabbitmq(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    extra = [arg.replace("{dir}", str(workdir)) for arg in extra]
    if binary == "beanstalkd":
        argv = [binary, "-l", "127.0.0.1", "-p", str(port), *extra]
    elif binary == "nats-server":
        argv = [binary, "-a", "127.0.0.1", "-p", str(port), *extra]
    else:
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--dir", str(workdir), "--daemonize", "no", "--protected-mode", "no", *extra]
    server = ready(Server(peer, [shutil.which(binary) or binary, *argv[1:]], workdir),
                   lambda started: wait_port(started, port))
    server.ports = {"main": port}
    return server


def version(binary: str) -> str:
    """The peer's version line, for the report."""
    if binary == "rabbitmq-server":
        return rabbitmq.version()
    flag = "-v" if binary == "beanstalkd" else "--version"
    try:
        return subprocess.run([binary, flag], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return "not installed"
