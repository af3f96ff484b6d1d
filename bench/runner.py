"""Runs the workloads over the systems: rounds interleaved, servers shared and stopped by PID."""

from __future__ import annotations

import os
import platform
import re
import tempfile
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import mqserver
from bench import database, peers, servers, shapes, workloads
from bench.peers import PEERS, start_peer, version
from bench.proc import Server
from bench.servers import settle_journal, start_mqserver
from bench.systems import System, all_systems, workload_systems

ONCE = ("memory", "restart", "restart-crash")  #: workloads of one round (a fresh server each)
WORKLOADS = ("w1", "w1c", "w2", "paced", "memory", "restart", "restart-crash", *shapes.SHAPES)


@dataclass
class Options:
    """What to run; ``python -m bench --help`` explains each."""

    messages: int = 200_000
    size: int = 100
    rounds: int = 3
    paced_messages: int = 30_000
    paced_rate: float = 10_000.0
    memory_messages: int = 1_000_000
    restart_messages: int = 1_000_000
    http_scale: float = 0.5
    # issue 19's shapes (bench.shapes.OPTIONS says what each is)
    fanout_copies: int = shapes.OPTIONS["fanout_copies"][0]
    queues: int = shapes.OPTIONS["queues"][0]
    per_connection: int = shapes.OPTIONS["per_connection"][0]
    queue_messages: int = shapes.OPTIONS["queue_messages"][0]
    idle_connections: int = shapes.OPTIONS["idle_connections"][0]
    body_bytes: int = shapes.OPTIONS["body_bytes"][0]
    startup_starts: int = shapes.OPTIONS["startup_starts"][0]
    workloads: tuple[str, ...] = WORKLOADS
    only: str = ""  #: regular expression on system names
    verbose: bool = True


class Fleet:
    """The long-running servers, started on first use and stopped together."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers: dict[str, Server] = {}

    def get(self, name: str) -> Server:
        if name not in self.servers:
            self.servers[name] = start(name, self.workdir / name)
        return self.servers[name]

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def keep_only(self, names: set[str]) -> None:
        """Stop the servers no later workload uses: an idle server still takes
        CPU (timers, a VM's schedulers) from the rounds of the others."""
        for name in [name for name in self.servers if name not in names]:
            self.servers.pop(name).stop()


def start(name: str, workdir: Path) -> Server:
    return start_peer(name, workdir) if name in PEERS else start_mqserver(name, workdir)


def run(options: Options) -> dict[str, Any]:
    """Every selected workload over every selected system; the raw rounds and what was skipped."""
    systems = [s for s in all_systems(options.http_scale) if re.search(options.only, s.name)]
    skipped = {s.name: reason for s in systems
               if (reason := (peers.missing if s.peer else servers.missing)(s.server))}
    systems = [s for s in systems if s.name not in skipped]
    rounds: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mqserver-bench-") as tmp:
        workdir = Path(tmp)
        fleet = Fleet(workdir / "fleet")
        try:
            groups = passes(options.workloads)
            for index, group in enumerate(groups):
                fleet.keep_only({system.server for later in groups[index:] for workload in later
                                 for system in pick(workload, systems)})
                chosen = {workload: pick(workload, systems) for workload in group}
                once = all(w in ONCE or getattr(shapes.SHAPES.get(w), "once", False)
                           for w in group)
                for number in range(1 if once else options.rounds):
                    for system, workload in interleaved(chosen):
                        try:
                            figures = one(workload, system, number, options, fleet, workdir)
                        except Exception as e:
                            errors.append({"workload": workload, "system": system.name,
                                           "round": str(number), "error": last_line(e),
                                           "traceback": traceback.format_exc()})
                            say(options, f"{workload} {system.name} round {number}: "
                                         f"FAILED {errors[-1]['error']}")
                            continue
                        rounds.append({"workload": workload, "system": system.name,
                                       "round": number, **figures})
                        say(options, f"{workload} {system.name} round {number}: "
                                     + brief(figures))
        finally:
            fleet.stop()
    return {"meta": meta(options, time.time() - started), "skipped": skipped,
            "rounds": rounds, "errors": errors}


def passes(chosen: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The workloads in the order they run, W1 and W1c as one pass.

    A system's W1c round runs right after its W1 round, so the ratio of the
    two compares minutes with the same load on the machine: run as two
    blocks, load that drifted between them showed up as the ratio.
    """
    groups: list[tuple[str, ...]] = []
    for workload in chosen:
        if workload == "w1c" and "w1" in chosen:
            continue
        groups.append(("w1", "w1c") if workload == "w1" and "w1c" in chosen else (workload,))
    return groups


def pick(workload: str, systems: list[System]) -> list[System]:
    shape = shapes.SHAPES.get(workload)
    return shape.pick(systems) if shape else workload_systems(workload, systems)


def interleaved(chosen: dict[str, list[System]]) -> list[tuple[System, str]]:
    """Each system's rounds of a pass one after the other, systems in order."""
    order: list[System] = []
    for systems in chosen.values():
        order += [system for system in systems if system not in order]
    return [(system, workload) for system in order
            for workload, systems in chosen.items() if system in systems]


def one(workload: str, system: System, number: int, options: Options, fleet: Fleet,
        workdir: Path) -> dict[str, Any]:
    if workload in shapes.SHAPES:
        return shapes.SHAPES[workload].run(system, number, options, fleet, workdir)
    queue = f"{workload}-r{number}-{system.name.split('/')[0]}"
    if workload == "memory":
        server = start(system.server, workdir / f"memory-{system.name.replace('/', '-')}")
        try:
            return workloads.memory(system.client, server, queue, options.memory_messages,
                                    options.size)
        finally:
            server.stop()
    if workload in ("restart", "restart-crash"):
        files = workdir / f"{workload}-{system.name.replace('/', '-')}"
        return workloads.restart(system.client, lambda: start(system.server, files), queue,
                                 options.restart_messages, options.size,
                                 crash=workload == "restart-crash")
    server = fleet.get(system.server)
    if workload == "paced":
        return workloads.paced(system.client, server, queue, options.paced_messages,
                               options.size, options.paced_rate)
    count = max(1, int(options.messages * system.scale))
    run_round = workloads.w2 if workload == "w2" else partial(
        workloads.w1, confirm_each=workload == "w1c")
    journaled = system.server.endswith("+journal")
    if number == 0:
        # untimed, a tenth of a round: a system's first round would otherwise
        # also pay for a fresh server's start-up (allocator arenas growing,
        # the journal process still importing), which no later round does
        run_round(system.client, server, f"{queue}-warm-up", max(1, count // 10), options.size)
        if journaled:
            settle_journal(server.workdir / "journal")
    # what earlier rounds left for the kernel to write back (W3's logs and
    # databases, journals) is written now, not during this round
    os.sync()
    figures = run_round(system.client, server, queue, count, options.size)
    if journaled:
        settle_journal(server.workdir / "journal")
    return figures


def brief(figures: dict[str, Any]) -> str:
    if "listening" in figures:
        return (f"listening in {figures['listening'] * 1e3:.0f} ms, first answer in "
                f"{figures['answer'] * 1e3:.0f} ms (median of {figures['count']})")
    if "recovery" in figures:
        reported = figures["reported"]
        return (f"back in {figures['recovery']:.2f} s (it reports "
                f"{'nothing' if reported is None else f'{reported:.3f} s'}), "
                f"RSS {figures['rss_before'] / 1e6:.0f} MB before, "
                f"{figures['rss'] / 1e6:.0f} MB after")
    if "rss" in figures:
        return f"RSS {figures['rss'] / 1e6:.0f} MB"
    if "p50_ms" in figures:
        return f"p50 {figures['p50_ms']:.3f} ms p99 {figures['p99_ms']:.3f} ms"
    return f"{figures['count'] / figures['wall']:,.0f} msgs/s"


def last_line(error: Exception) -> str:
    """The gist of an error whose text may end with a server's traceback."""
    lines = str(error).strip().splitlines() or [repr(error)]
    return lines[-1]


def say(options: Options, line: str) -> None:
    if options.verbose:
        print(line, flush=True)


def meta(options: Options, elapsed: float) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {cpu_model()}, {cpu_count()} CPUs, {platform.system()} "
                   f"{platform.release()}",
        "python": platform.python_version(),
        "mqserver": mqserver.__version__,
        "peers": {binary: version(binary)
                  for binary in ("beanstalkd", "redis-server", "nats-server", "rabbitmq-server")}
                 | {"postgres": database.version()},
        "options": {k: v for k, v in vars(options).items() if k != "verbose"},
        "elapsed_s": round(elapsed, 1),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
