"""Peers in the same run: Debian's beanstalkd and redis-server on loopback ports.

``make bench-setup`` (or ``.ci/run``) installs them with apt; a missing
binary skips that peer with the reason in the report.  Each runs in its own
temporary directory (binlog, AOF) and is stopped by PID.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.proc import Server, free_port, wait_port

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
}


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here, or None."""
    binary = PEERS[peer][0]
    if shutil.which(binary) is None:
        return f"{binary} not installed (make bench-setup)"
    return None


def start_peer(peer: str, workdir: Path) -> Server:
    """Start ``peer`` on a free loopback port; ``server.ports['main']`` is it."""
    binary, extra, _ = PEERS[peer]
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    extra = [arg.replace("{dir}", str(workdir)) for arg in extra]
    if binary == "beanstalkd":
        argv = [binary, "-l", "127.0.0.1", "-p", str(port), *extra]
    else:
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--dir", str(workdir), "--daemonize", "no", "--protected-mode", "no", *extra]
    server = Server(peer, [shutil.which(binary) or binary, *argv[1:]], workdir)
    try:
        wait_port(server, port)
    except RuntimeError:
        server.stop()
        raise
    server.ports = {"main": port}
    return server


def version(binary: str) -> str:
    """The peer's version line, for the report."""
    flag = "-v" if binary == "beanstalkd" else "--version"
    try:
        return subprocess.run([binary, flag], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return "not installed"
