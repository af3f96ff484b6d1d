"""Failover cycles: ``--ha`` nodes on one PostgreSQL database, the active killed under load.

The crash test's cycle (``harness.CrashTest``: real MQKS, PHPMQ, eMQP and
HTTP clients, every settle path, a ledger of what was confirmed) with two
differences: the server that comes back is the *standby*, which takes over,
not a restart; and the active is either killed (``SIGKILL``) or stopped
(``SIGSTOP``, a hung process: the standby terminates its session once its
lease runs out, and the stopped node, resumed, must stand by).  Each cycle
then

- measures the time from the signal to the new active's first confirmed
  publish (a probe client that polls every node's ``/health`` and publishes
  ``--confirm`` on whichever answers 200);
- watches every node's ``/health`` and MQKS port (a ``ping``) throughout:
  two nodes serving at once fails the run;
- checks and drains on the new active exactly as after a restart: every
  confirmed, unsettled copy must be there and no confirmed settle may come
  back;
- replaces the killed node with a fresh standby (or resumes the stopped one).

Used by ``tests/integration/test_ha_failover.py`` and
``python -m bench.failover_soak``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqserver.crashtest import http
from mqserver.crashtest.harness import CrashTest, CycleReport
from mqserver.crashtest.server import LISTENERS, LISTENING, Lines, ServerProcess
from mqserver.pgtesting import free_port

PROBE_EVENT = b"failover.probe"
BACKLOG_QUEUE, BACKLOG_EVENT = "backlog", b"backlog.ev"


def load_backlog(ports: dict[str, int], count: int, chunk: int = 5000) -> None:
    """``count`` confirmed 100-byte messages in a queue nobody consumes: what a takeover
    must recover before it serves (pipelined ``publish --confirm``, ``chunk`` in flight)."""
    http.Client(ports["http"]).call("PUT", f"/api/queues/{BACKLOG_QUEUE}",
                                    {"bindings": [BACKLOG_EVENT.decode()]})
    lines = Lines(ports["mqks"])
    body = b"b" * 100
    sent = confirmed = 0
    try:
        while confirmed < count:
            if sent < count and sent - confirmed < 2 * chunk:
                n = min(chunk, count - sent)
                lines.send(b"".join(b"k publish --confirm %s %s\n" % (BACKLOG_EVENT, body)
                                    for _ in range(n)))
                sent += n
                continue
            got = lines.lines(30.0)
            if not got:
                raise ConnectionError(f"backlog: {confirmed} of {count} confirmed, then silence")
            confirmed += sum(line.startswith(b"k ok ") for line in got)
    finally:
        lines.close()


class Node:
    """One ``twistd mqserver --ha`` process: a fixed HTTP port, protocols on ephemeral ones.

    ``fixed``: the protocols too listen on ports chosen here (``fixed_ports``),
    the same at every promotion, for clients that keep a list of addresses.
    """

    def __init__(self, name: str, args: list[str], workdir: Path, fixed: bool = False) -> None:
        self.name = name
        self.http = free_port()
        self.fixed_ports: dict[str, int] = {}
        listeners = LISTENERS
        if fixed:
            self.fixed_ports = {label: free_port() for label in
                                ("mqks", "phpmq", "emqp", "emqp-backend", "emqp-admin")}
            loopback = ":interface=127.0.0.1"
            listeners = [option for option in LISTENERS if not option.startswith(
                ("--protocol", "--emqp-"))] + [
                f"--protocol={label}:tcp:{self.fixed_ports[label]}{loopback}"
                for label in ("mqks", "phpmq", "emqp")] + [
                f"--{label}=tcp:{self.fixed_ports[label]}{loopback}"
                for label in ("emqp-backend", "emqp-admin")]
        self.server = ServerProcess(
            [*args, "--ha", f"--ha-node={name}", f"--http=tcp:{self.http}:interface=127.0.0.1"],
            workdir, expected={"http"}, listeners=listeners,
        )
        self.stopped = False

    def health(self, timeout: float = 0.5) -> tuple[int | None, str]:
        """``/health``'s status code and ``status`` (None: no answer, e.g. stopped or dead)."""
        url = f"http://127.0.0.1:{self.http}/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                return answer.status, json.loads(answer.read())["status"]
        except urllib.error.HTTPError as e:
            with contextlib.suppress(ValueError, KeyError):
                return e.code, json.loads(e.read())["status"]
            return e.code, ""
        except (OSError, ValueError):
            return None, ""

    def ports_since(self, line: int) -> dict[str, int]:
        """The listeners this node opened after output line ``line`` (its latest promotion)."""
        ports = {}
        for text in self.server.output[line:]:
            match = LISTENING.search(text)
            if match:
                ports[match.group(1)] = int(match.group(2))
        return ports

    def signal(self, number: int) -> None:
        if self.server.process.poll() is None:
            self.server.process.send_signal(number)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.server.kill()

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.server.stop()


def answers_mqks(port: int, timeout: float = 0.3) -> bool:
    """Whether a node serves MQKS on ``port``: a ``ping`` answered, not just a TCP accept
    (the kernel completes handshakes for a stopped process too)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout) as sock:
            sock.sendall(b"w ping x\n")
            data = b""
            while b"\n" not in data:
                chunk = sock.recv(256)
                if not chunk:
                    return False
                data += chunk
            return data.startswith(b"w ok x")
    except OSError:
        return False


class HealthWatch:
    """Polls every node's ``/health`` and, with fixed ports, its MQKS port; any moment with
    two nodes serving (200, or a ping answered) is recorded."""

    def __init__(self, nodes: list[Node], interval: float = 0.02) -> None:
        self.nodes = nodes
        self.interval = interval
        self.overlaps: list[tuple[float, list[str]]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            serving = [n.name for n in list(self.nodes) if n.health(0.2)[0] == 200 or (
                n.fixed_ports and answers_mqks(n.fixed_ports["mqks"]))]
            self.samples += 1
            if len(serving) > 1:
                self.overlaps.append((time.time(), serving))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Takeover:
    """One failover: how, and how long until the new active confirmed a publish."""

    cycle: int
    how: str
    old: str
    new: str = ""
    to_serving: float = 0.0  # signal to the new active's /health 200
    to_confirm: float = 0.0  # signal to the first publish --confirm answered by it
    resumed_standby: float | None = None  # SIGSTOP: SIGCONT to the old node's /health standby
    extra: dict[str, Any] = field(default_factory=dict)


class Victim:
    """What ``CrashTest._load_and_kill`` kills: the active node, by ``how``; starts the probe."""

    def __init__(self, test: FailoverTest, node: Node, ports: dict[str, int], how: str) -> None:
        self.test = test
        self.node = node
        self.ports = ports
        self.how = how
        self.killed_at = 0.0
        self.probe: threading.Thread | None = None

    def kill(self) -> None:
        if self.killed_at:
            return
        self.killed_at = time.monotonic()
        self.node.signal(signal.SIGSTOP if self.how == "stop" else signal.SIGKILL)
        if self.how == "stop":
            self.node.stopped = True
        self.probe = threading.Thread(target=self.test.probe, args=(self,), daemon=True)
        self.probe.start()


class FailoverTest:
    """Runs failover cycles against one database (see the module docstring)."""

    def __init__(self, dsn: str, workdir: Path, seed: int = 0, how: str = "kill",
                 ha_args: tuple[str, ...] = (), timeout: float = 60.0, backlog: int = 0
                 ) -> None:
        self.crash = CrashTest(["--storage=postgres", f"--postgres-dsn={dsn}", *ha_args],
                               workdir, seed=seed)
        self.workdir = workdir
        self.how = how
        self.timeout = timeout
        self.backlog = backlog
        self.nodes: list[Node] = []
        self.takeovers: list[Takeover] = []
        self.watch: HealthWatch | None = None
        self._names = 0
        self._current: Takeover | None = None
        self._mark: dict[str, int] = {}

    def _node(self) -> Node:
        node = Node(f"n{self._names}", self.crash.args, self.workdir, fixed=True)
        self._names += 1
        self.crash.servers.append(node.server)
        self._mark[node.name] = 0
        self.nodes.append(node)
        return node

    def wait_active(self, deadline: float) -> tuple[Node, dict[str, int]]:
        """The node answering 200, and the protocol ports of its latest promotion."""
        while time.monotonic() < deadline:
            for node in list(self.nodes):
                if node.stopped or node.health(0.3)[0] != 200:
                    continue
                ports = node.ports_since(self._mark[node.name])
                if {"mqks", "phpmq", "emqp", "emqp-backend"} <= set(ports):
                    ports["http"] = node.http
                    return node, ports
            time.sleep(0.02)
        raise TimeoutError("no node became active: " + "".join(
            line for node in self.nodes for line in node.server.output[-20:]))

    def probe(self, victim: Victim) -> None:
        """Time the takeover: the new active's /health, then its first confirmed publish."""
        takeover = self._current
        assert takeover is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                node, ports = self.wait_active(deadline)
            except TimeoutError:
                return
            if node is victim.node:
                time.sleep(0.02)
                continue
            takeover.new = node.name
            takeover.to_serving = time.monotonic() - victim.killed_at
            with contextlib.suppress(OSError):
                lines = Lines(ports["mqks"])
                lines.send(b"probe publish --confirm %s x\n" % PROBE_EVENT)
                if lines.expect(b"probe ok ", 10.0):
                    takeover.to_confirm = time.monotonic() - victim.killed_at
                    lines.close()
                    if victim.how == "stop":
                        self._resume(victim.node, takeover)
                    return
                lines.close()

    def _resume(self, node: Node, takeover: Takeover) -> None:
        """SIGCONT a stopped active; it must find its session gone and stand by."""
        resumed = time.monotonic()
        self._mark[node.name] = len(node.server.output)
        node.signal(signal.SIGCONT)
        node.stopped = False
        deadline = resumed + self.timeout
        while time.monotonic() < deadline:
            if node.health(0.5)[1] == "standby":
                takeover.resumed_standby = time.monotonic() - resumed
                return
            time.sleep(0.02)

    def run(self, cycles: int) -> list[Takeover]:
        crash = self.crash
        try:
            self._node()
            first = time.monotonic() + self.timeout
            _, ports = self.wait_active(first)
            if self.backlog:
                load_backlog(ports, self.backlog)
            self._node()
            self.watch = HealthWatch(self.nodes)
            for cycle in range(cycles + 1):
                active, ports = self.wait_active(time.monotonic() + self.timeout)
                if crash.reports:
                    crash._verify_and_drain(ports["mqks"], crash.reports[-1])
                if cycle == cycles:
                    break
                report = CycleReport(cycle)
                self._current = Takeover(cycle, self.how, active.name)
                victim = Victim(self, active, ports, self.how)
                crash._load_and_kill(victim, cycle, report)  # type: ignore[arg-type]
                crash.reports.append(report)
                assert victim.probe is not None
                victim.probe.join(self.timeout + 15)
                if not self._current.to_confirm:
                    raise crash._fail(f"cycle {cycle}: no node took over from {active.name}")
                self.takeovers.append(self._current)
                if self.how == "kill":
                    self.nodes.remove(active)
                    self._node()
                elif self._current.resumed_standby is None:
                    raise crash._fail(f"cycle {cycle}: {active.name}, resumed, did not stand by")
        finally:
            if self.watch is not None:
                self.watch.close()
            for node in self.nodes:
                node.stop()
        return self.takeovers

    @property
    def overlaps(self) -> list[tuple[float, list[str]]]:
        return self.watch.overlaps if self.watch is not None else []
