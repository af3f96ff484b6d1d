"""The workloads of issue 19's eighth target: fan-out, many queues, idle connections, large
bodies; and the start-up of an empty server, beside the restart of its fifth.

Each is a ``Shape``: which systems it runs (variants of the suite's systems:
a fan-out width, a body size), one round of it, the figures of a round and
their table row.  ``bench.runner`` and ``bench.report`` look a workload up
in ``SHAPES`` and leave the rest to it; the workloads themselves live in
``bench.fanout``, ``bench.idle``, ``bench.bodies`` and ``bench.startup``.
docs/performance.md says what limits each figure.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import bodies, fanout, idle, startup
from bench.servers import start_mqserver
from bench.systems import System

if TYPE_CHECKING:
    from bench.runner import Fleet, Options

WIDTHS = (1, 10, 100)  #: fan-out widths; 1 is the same run's single-queue W1
#: option -> (default, quick, help)
OPTIONS: dict[str, tuple[int, int, str]] = {
    "fanout_copies": (200_000, 2000, "copies per fan-out round (N/width publishes)"),
    "queues": (10_000, 200, "queues, each with a consumer, of the many-queues round"),
    "per_connection": (100, 20, "consumers per connection in the many-queues round"),
    "queue_messages": (200_000, 2000, "messages spread over the queues per many-queues round"),
    "idle_connections": (10_000, 500, "idle connections opened per idle round"),
    "body_bytes": (128 << 20, 4 << 20, "bytes of bodies per large-body round"),
    "startup_starts": (5, 2, "starts of an empty server per start-up round (their median)"),
}
QUICK = {name: quick for name, (_, quick, _) in OPTIONS.items()}


@dataclass(frozen=True)
class Variant(System):
    """A system run with one parameter of a shape (fan-out width, body size, ...)."""

    param: int = 0


@dataclass(frozen=True)
class Shape:
    """One workload: its systems, a round, a round's figures and their table row."""

    title: str
    header: list[str]
    pick: Callable[[list[System]], list[System]]
    run: Callable[[Variant, int, Options, Fleet, Path], dict[str, Any]]
    figures: Callable[[dict[str, Any]], dict[str, float]]
    row: Callable[[dict[str, float]], list[str]]
    once: bool = False  #: one round only (a fresh server each, RSS figures)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for name, (default, quick, text) in OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int,
                            help=f"{text} (default {default:,}; --quick {quick:,})")


def variants(systems: list[System], names: tuple[str, ...],
             params: dict[str, int]) -> list[System]:
    """Each of ``systems`` named in ``names`` once per ``params`` entry (label -> param)."""
    return [Variant(f"{s.name} {label}".rstrip(), s.server, s.client, s.scale, param)
            for s in systems if s.name in names for label, param in params.items()]


def fresh(system: System, workdir: Path, number: int, *extra: str) -> Any:
    """A server of its own for one round (RSS figures, state a later round must not see)."""
    where = workdir / f"{system.name.replace('/', '-').replace(' ', '-')}-r{number}"
    return start_mqserver(system.server, where, extra=extra)


def tag(system: System, number: int) -> str:
    """A name prefix of letters and digits for one round's queues, events and consumers."""
    return "".join(c for c in system.name if c.isalnum()) + f"r{number}"


# -- fan-out ----------------------------------------------------------------

def fanout_run(system: Variant, number: int, options: Options, fleet: Fleet,
               workdir: Path) -> dict[str, Any]:
    server = fleet.get(system.server)
    if number == 0:  # untimed, as W1's: no figure pays for a fresh server
        fanout.fanout(server, tag(system, number) + "w", options.fanout_copies // 10,
                      system.param, options.size)
    return fanout.fanout(server, tag(system, number), options.fanout_copies, system.param,
                         options.size)


def fanout_figures(r: dict[str, Any]) -> dict[str, float]:
    return {"width": r["width"], "produce": r["messages"] / r["produce"],
            "copies": r["count"] / r["wall"], "server_us": 1e6 * r["server_cpu"] / r["count"]}


# -- many queues --------------------------------------------------------------

def queues_run(system: Variant, number: int, options: Options, fleet: Fleet,
               workdir: Path) -> dict[str, Any]:
    count = options.queues if system.param else 1
    server = fresh(system, workdir, number)
    try:
        return fanout.many_queues(server, tag(system, number), options.queue_messages, count,
                                  min(count, options.per_connection), options.size)
    finally:
        server.stop()


def queues_figures(r: dict[str, Any]) -> dict[str, float]:
    grown = r["rss_consumers"] - r["rss_before"]
    return {"queues": r["queues"], "connections": r["connections"], "total": r["count"] / r["wall"],
            "server_us": 1e6 * r["server_cpu"] / r["count"],
            "kb_per_queue": max(grown, 0) / 1024 / r["queues"], "rss_mb": r["rss_after"] / 1e6}


# -- idle connections -----------------------------------------------------------

def idle_run(system: Variant, number: int, options: Options, fleet: Fleet,
             workdir: Path) -> dict[str, Any]:
    count = options.idle_connections
    idle.raise_nofile(count + 100)  # before the server starts: it inherits the limit
    server = fresh(system, workdir, number, "--max-connections=0")
    try:
        return idle.idle(server, server.ports[system.name.split("/")[0]], count)
    finally:
        server.stop()


def idle_figures(r: dict[str, Any]) -> dict[str, float]:
    return {"connections": r["count"], "rss_before_mb": r["rss_before"] / 1e6,
            "rss_mb": r["rss"] / 1e6, "bytes_per": (r["rss"] - r["rss_before"]) / r["count"],
            "opened": r["count"] / r["wall"]}


# -- start-up ----------------------------------------------------------------

def startup_run(system: Variant, number: int, options: Options, fleet: Fleet,
                workdir: Path) -> dict[str, Any]:
    return startup.startup(system, workdir / f"startup-r{number}", options.startup_starts)


# -- large bodies ---------------------------------------------------------------

BODY_SYSTEMS = tuple(f"{protocol}/{storage}" for storage in ("memory", "log-interval")
                     for protocol in ("mqks", "phpmq", "http"))


def bodies_pick(systems: list[System]) -> list[System]:
    """MQKS, PHPMQ and HTTP (its own client, a share of the bytes) in memory and on ``log``."""
    picked = variants(systems, BODY_SYSTEMS, bodies.SIZES)
    return [dataclasses.replace(s, client=bodies.http_client(s.param), scale=bodies.HTTP_SHARE)
            if s.name.startswith("http/") else dataclasses.replace(s, scale=1.0)
            for s in picked]


def bodies_run(system: Variant, number: int, options: Options, fleet: Fleet,
               workdir: Path) -> dict[str, Any]:
    total = max(system.param, int(options.body_bytes * system.scale))
    return bodies.large(system.client, fleet.get(system.server), tag(system, number), total,
                        system.param)


def bodies_figures(r: dict[str, Any]) -> dict[str, float]:
    moved = r["count"] * r["size"]
    return {"messages": r["count"], "total": r["count"] / r["wall"],
            "mb_s": moved / r["wall"] / 1e6,
            "produce_mb_s": moved / r["produce"] / 1e6, "drain_mb_s": moved / r["drain"] / 1e6,
            "server_ms_per_mb": 1e3 * r["server_cpu"] / (moved / 1e6)}


def rate(value: float) -> str:
    return f"{value:,.0f}"


def pct(f: dict[str, float], name: str) -> str:
    return f"{f[name]:.0f}%"


SHAPES: dict[str, Shape] = {
    "fanout": Shape(
        "Fan-out (one MQKS event bound to W queues; every copy delivered and acked)",
        ["system", "width", "produce msgs/s", "copies/s", "server CPU", "server us/copy"],
        lambda systems: variants(systems, ("mqks/memory", "mqks/log-interval"),
                                 {f"x{w}": w for w in WIDTHS}),
        fanout_run, fanout_figures,
        lambda f: [f"{f['width']:.0f}", rate(f["produce"]), rate(f["copies"]),
                   pct(f, "server_cpu"), f"{f['server_us']:.2f}"]),
    "queues": Shape(
        "Many queues (a consumer each; messages spread over the queues while they drain)",
        ["system", "queues", "connections", "msgs/s", "server CPU", "server us/msg",
         "KiB per queue", "RSS after MB"],
        lambda systems: variants(systems, ("mqks/memory",), {"1 queue": 0, "many queues": 1}),
        queues_run, queues_figures,
        lambda f: [f"{f['queues']:,.0f}", f"{f['connections']:,.0f}", rate(f["total"]),
                   pct(f, "server_cpu"), f"{f['server_us']:.2f}", f"{f['kb_per_queue']:.2f}",
                   f"{f['rss_mb']:.0f}"],
        once=True),
    "idle": Shape(
        "Idle connections (RSS of a fresh server before and after they connect)",
        ["system", "connections", "RSS before MB", "RSS after MB", "bytes per connection",
         "opened per s"],
        lambda systems: variants(systems, ("mqks/memory", "phpmq/memory"), {"": 0}),
        idle_run, idle_figures,
        lambda f: [f"{f['connections']:,.0f}", f"{f['rss_before_mb']:.0f}", f"{f['rss_mb']:.0f}",
                   f"{f['bytes_per']:,.0f}", rate(f["opened"])],
        once=True),
    "bodies": Shape(
        "Large bodies (W1 / W3 with 64 KiB and 1 MiB bodies)",
        ["system", "messages", "msgs/s", "MB/s", "produce MB/s", "drain MB/s", "server CPU",
         "server ms/MB"],
        bodies_pick, bodies_run, bodies_figures,
        lambda f: [f"{f['messages']:,.0f}", rate(f["total"]), f"{f['mb_s']:.0f}",
                   f"{f['produce_mb_s']:.0f}", f"{f['drain_mb_s']:.0f}", pct(f, "server_cpu"),
                   f"{f['server_ms_per_mb']:.2f}"]),
    "startup": Shape(
        "Start-up (an empty server restarted on its files: exec to every listener up, and "
        "to its first answer; a restart with a backlog is this plus recovery)",
        ["system", "starts", "listening ms", "first answer ms", "server CPU ms"],
        lambda systems: variants(systems, startup.SYSTEMS, {"": 0}),
        startup_run, startup.figures, startup.row),
}
