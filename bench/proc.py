"""Processes under test: start, wait for a port, read CPU and RSS, stop by PID.

Every server the bench runs (mqserver, beanstalkd, redis-server, ...) is one
child process on 127.0.0.1 with its output in a log file (a pipe nobody
reads would block a chatty server), stopped by its own PID, never by name.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
#: seconds between looks at a starting server (its log, its port): the start-up
#: figures (``bench.startup``) are no finer than this
POLL = 0.005


class Companion(Protocol):
    """A process a server needs to work (the ``postgres`` setup's database):
    its CPU is the server's too, and it stops after the server."""

    def cpu_seconds(self) -> float: ...

    def stop(self) -> None: ...


class Server:
    """A started child process with a log file, the ports it listens on, and its companions."""

    def __init__(self, name: str, argv: list[str], workdir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.ports: dict[str, int] = {}
        self.companions: list[Companion] = []
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, cwd=workdir, stdout=log, env=env,
                                            stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: re.Pattern[str], count: int = 1,
                     timeout: float = 30.0) -> list[re.Match[str]]:
        """Wait until the log holds ``count`` matches of ``pattern`` (the
        "listening on" lines), failing early if the process died."""
        deadline = time.monotonic() + timeout
        while True:
            matches = list(pattern.finditer(self.log_text()))
            if len(matches) >= count:
                return matches
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log_text()[-2000:]}")
            time.sleep(POLL)

    def cpu_seconds(self) -> float:
        """User + system CPU of the process (all its threads) and its companions so far."""
        own = cpu_ticks(stat_fields(self.pid)) / TICKS
        return own + sum(companion.cpu_seconds() for companion in self.companions)

    def rss_bytes(self) -> int:
        """Resident set size now."""
        with open(f"/proc/{self.pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE

    def stop(self, crash: bool = False) -> None:
        """SIGTERM this PID, then SIGKILL if it has not exited in 10 s (with ``crash``:
        SIGKILL at once, a crash); then the companions."""
        if self.process.poll() is None:
            if crash:
                self.process.kill()
            else:
                self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        while self.companions:
            self.companions.pop().stop()


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (the state first)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def cpu_ticks(fields: list[str], children: bool = False) -> int:
    """utime + stime from ``stat_fields``, in clock ticks; with ``children``
    also cutime + cstime (the children that exited and were reaped)."""
    return sum(int(f) for f in fields[11:15 if children else 13])


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago (for servers
    that cannot listen on port 0 and report the port chosen)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ready(server: Server, wait: Callable[[Server], None]) -> Server:
    """``server`` once ``wait(server)`` returned; stopped (companions too) if it raised."""
    try:
        wait(server)
    except BaseException:
        server.stop()
        raise
    return server


def wait_port(server: Server, port: int, timeout: float = 30.0) -> None:
    """Wait until ``port`` accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{server.name} did not listen on {port}:\n{server.log_text()[-2000:]}"
                ) from None
            time.sleep(POLL)
