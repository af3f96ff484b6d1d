"""Medians of the rounds, the issue's target ratios, and the tables (console or Markdown)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.shapes import SHAPES

Key = tuple[str, str, str]  # workload, system, figure


@dataclass(frozen=True)
class Target:
    """``value`` (over ``base``, when given) must be at least (or at most) ``threshold``."""

    name: str
    value: Key
    base: Key | None
    threshold: float
    at_most: bool = False


TARGETS = [
    Target("MQKS memory W1 total ≥ 6x beanstalkd", ("w1", "mqks/memory", "total"),
           ("w1", "beanstalkd", "total"), 6.0),
    Target("MQKS memory W1 total ≥ 0.6x Redis with ack", ("w1", "mqks/memory", "total"),
           ("w1", "redis", "total"), 0.6),
    Target("MQKS memory produce ≥ 4x beanstalkd put", ("w1", "mqks/memory", "produce"),
           ("w1", "beanstalkd", "produce"), 4.0),
    Target("PHPMQ memory W1 total ≥ 5x beanstalkd", ("w1", "phpmq/memory", "total"),
           ("w1", "beanstalkd", "total"), 5.0),
    Target("eMQP memory W1 total ≥ 3x beanstalkd", ("w1", "emqp/memory", "total"),
           ("w1", "beanstalkd", "total"), 3.0),
    Target("log interval:50 W3 total ≥ 4x beanstalkd -b", ("w1", "mqks/log-interval", "total"),
           ("w1", "beanstalkd-b", "total"), 4.0),
    Target("log always W3 total ≥ 10x beanstalkd -b -f0", ("w1", "mqks/log-always", "total"),
           ("w1", "beanstalkd-b-f0", "total"), 10.0),
    Target("sqlite W3 total ≥ 2x beanstalkd -b", ("w1", "mqks/sqlite", "total"),
           ("w1", "beanstalkd-b", "total"), 2.0),
    Target("postgres W3 total ≥ 2x beanstalkd -b", ("w1", "mqks/postgres", "total"),
           ("w1", "beanstalkd-b", "total"), 2.0),
    Target("HTTP memory W1 total (batches of 1000) ≥ 1x beanstalkd",
           ("w1", "http/memory", "total"), ("w1", "beanstalkd", "total"), 1.0),
    Target("paced 10k/s MQKS memory p50 ≤ 0.15 ms", ("paced", "mqks/memory", "p50_ms"), None,
           0.15, at_most=True),
    Target("paced 10k/s MQKS memory p99 ≤ 0.4 ms", ("paced", "mqks/memory", "p99_ms"), None,
           0.4, at_most=True),
    # memory: marginal RSS (after minus before) per 1M messages; the totals beside
    Target("RSS ≤ 150 MB per 1M ready 100-byte messages (memory, marginal)",
           ("memory", "mqks/memory", "mb_per_1m"), None, 150.0, at_most=True),
    Target("sqlite RSS ≤ 1.2x memory's (marginal)", ("memory", "mqks/sqlite", "mb_per_1m"),
           ("memory", "mqks/memory", "mb_per_1m"), 1.2, at_most=True),
    Target("log interval:50 RSS ≤ 1.2x memory's (marginal)",
           ("memory", "mqks/log-interval", "mb_per_1m"),
           ("memory", "mqks/memory", "mb_per_1m"), 1.2, at_most=True),
    Target("sqlite RSS ≤ 1.2x memory's (total)", ("memory", "mqks/sqlite", "total_mb_per_1m"),
           ("memory", "mqks/memory", "total_mb_per_1m"), 1.2, at_most=True),
    Target("log interval:50 RSS ≤ 1.2x memory's (total)",
           ("memory", "mqks/log-interval", "total_mb_per_1m"),
           ("memory", "mqks/memory", "total_mb_per_1m"), 1.2, at_most=True),
    Target("sqlite restart ≤ 2x Redis loading its AOF", ("restart", "mqks/sqlite", "seconds"),
           ("restart", "redis-aof-everysec", "seconds"), 2.0, at_most=True),
    Target("log restart ≤ 2x Redis loading its AOF", ("restart", "mqks/log-interval", "seconds"),
           ("restart", "redis-aof-everysec", "seconds"), 2.0, at_most=True),
    # until a consumer gets the first message, and the same restart after a
    # crash (kill -9: every store replays).  The recovery time each server
    # logs is in the tables, not a target: mqserver's counts what it did
    # before it serves, not the chunks it reads once it does
    *[Target(f"{name} {label} ≤ 2x Redis{redis}", (workload, f"mqks/{setup}", figure),
             (workload, "redis-aof-everysec", figure), 2.0, at_most=True)
      for workload, figure, label, redis in (
          ("restart", "first_s", "restart to the first delivery", "'s"),
          ("restart-crash", "seconds", "restart after a crash", " loading its AOF"),
          ("restart-crash", "first_s", "restart after a crash to the first delivery", "'s"))
      for name, setup in (("sqlite", "sqlite"), ("log", "log-interval"))],
    Target("sqlite RSS after a restart ≤ 1.1x before", ("restart", "mqks/sqlite", "rss_ratio"),
           None, 1.1, at_most=True),
    Target("log RSS after a restart ≤ 1.1x before", ("restart", "mqks/log-interval", "rss_ratio"),
           None, 1.1, at_most=True),
    Target("journal on ≥ 80% of off (MQKS memory W1 total)",
           ("w1", "mqks/memory+journal", "total"), ("w1", "mqks/memory", "total"), 0.8),
    # issue 19: every publish confirmed (W1c)
    Target("MQKS memory W1c total ≥ 0.9x MQKS memory W1", ("w1c", "mqks/memory", "total"),
           ("w1", "mqks/memory", "total"), 0.9),
    Target("MQKS memory W1c total ≥ 0.8x Redis W1c", ("w1c", "mqks/memory", "total"),
           ("w1c", "redis", "total"), 0.8),
    Target("MQKS memory W1c total ≥ 2x JetStream memory W1c", ("w1c", "mqks/memory", "total"),
           ("w1c", "jetstream-memory", "total"), 2.0),
    Target("log interval:50 W3c total ≥ 1x JetStream file W3c (no fsync)",
           ("w1c", "mqks/log-interval", "total"), ("w1c", "jetstream-file", "total"), 1.0),
    Target("log interval:50 W3c total ≥ 3x RabbitMQ quorum W3c",
           ("w1c", "mqks/log-interval", "total"), ("w1c", "rabbitmq-quorum", "total"), 3.0),
    Target("fan-out to 100 queues: server us per copy ≤ 1.5x single-queue us per message",
           ("fanout", "mqks/memory x100", "server_us"), ("fanout", "mqks/memory x1", "server_us"),
           1.5, at_most=True),
]


def figures(workload: str, r: dict[str, Any]) -> dict[str, float]:
    """The figures of one round (rates in msgs/s, CPU in % of the round's wall time)."""
    out = {"client_cpu": 100 * r["client_cpu"] / r["wall"],
           "server_cpu": 100 * r["server_cpu"] / r["wall"]}
    if workload in SHAPES:
        return out | SHAPES[workload].figures(r)
    if workload in ("w1", "w1c", "w2"):
        # the server's CPU per message: what it costs, however busy the machine
        out["server_us"] = 1e6 * r["server_cpu"] / r["count"]
    if workload in ("w1", "w1c"):
        out.update(produce=r["count"] / r["produce"], drain=r["count"] / r["drain"],
                   total=r["count"] / r["wall"])
    elif workload == "w2":
        out["total"] = r["count"] / r["wall"]
    elif workload == "paced":
        out.update(p50_ms=r["p50_ms"], p99_ms=r["p99_ms"])
    elif workload in ("restart", "restart-crash"):
        if r.get("reported") is not None:
            out["reported_s"] = r["reported"]
        if r.get("first") is not None:
            out["first_s"] = r["first"]
        out.update(seconds=r["recovery"], rss_before_mb=r["rss_before"] / 1e6,
                   rss_mb=r["rss"] / 1e6, rss_ratio=r["rss"] / r["rss_before"],
                   messages=r["count"])
    else:
        # marginal: what the messages cost, not the fresh process (57 MB of
        # Python and Twisted); the total per 1M beside it
        grown = (r["rss"] - r["rss_before"]) * 1_000_000 / r["count"]
        out.update(rss_before_mb=r["rss_before"] / 1e6, rss_mb=r["rss"] / 1e6,
                   rss_filled_mb=r.get("rss_filled", r["rss"]) / 1e6,
                   mb_per_1m=grown / 1e6, total_mb_per_1m=(r["rss_before"] + grown) / 1e6,
                   messages=r["count"])
    return out


def summarise(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """workload -> system -> figure -> median over the rounds."""
    collected: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for r in result["rounds"]:
        collected[r["workload"], r["system"]].append(figures(r["workload"], r))
    summary: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (workload, system), samples in collected.items():
        summary[workload][system] = {name: statistics.median(s[name] for s in samples)
                                     for name in samples[0]}
    return dict(summary)


def lookup(summary: dict[str, Any], key: Key) -> float | None:
    return summary.get(key[0], {}).get(key[1], {}).get(key[2])


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured value (a ratio when it has a base) and whether it is met."""
    out = []
    for t in TARGETS:
        value = lookup(summary, t.value)
        base = lookup(summary, t.base) if t.base else 1.0
        if value is None or not base:
            out.append({"target": t.name, "value": None, "met": None})
            continue
        ratio = value / base
        met = ratio <= t.threshold if t.at_most else ratio >= t.threshold
        out.append({"target": t.name, "value": ratio, "met": met})
    return out


def tables(summary: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each workload measured, then the targets."""

    def restart_row(workload: str) -> Callable[[dict[str, float]], list[str]]:
        redis = summary.get(workload, {}).get("redis-aof-everysec", {})
        seconds, reported = redis.get("seconds"), redis.get("reported_s")
        first = redis.get("first_s")
        return lambda f: [f"{f['messages']:,.0f}", f"{f['seconds']:.2f}",
                          f"{f['seconds'] / seconds:.2f}" if seconds else "-",
                          f"{f['first_s']:.2f}" if "first_s" in f else "-",
                          f"{f['first_s'] / first:.2f}" if first and "first_s" in f else "-",
                          f"{f['reported_s']:.3f}" if "reported_s" in f else "-",
                          f"{f['reported_s'] / reported:.2f}"
                          if reported and "reported_s" in f else "-",
                          f"{f['rss_before_mb']:.0f}", f"{f['rss_mb']:.0f}",
                          f"{f['rss_ratio']:.2f}", pct(f["server_cpu"])]

    restart_header = ["system", "messages", "seconds", "x Redis AOF", "first delivery s",
                      "first x Redis", "reported s",
                      "reported x Redis", "RSS before MB", "RSS after MB", "after / before",
                      "server CPU"]
    def w1_row(workload: str) -> Callable[[dict[str, float]], list[str]]:
        beanstalkd = lookup(summary, (workload, "beanstalkd", "total"))
        return lambda f: [rate(f["produce"]), rate(f["drain"]), rate(f["total"]),
                          f"{f['total'] / beanstalkd:.2f}" if beanstalkd else "-",
                          pct(f["client_cpu"]), pct(f["server_cpu"]), f"{f['server_us']:.1f}"]

    w1_header = ["system", "produce msgs/s", "drain msgs/s", "total msgs/s", "x beanstalkd",
                 "client CPU", "server CPU", "server us/msg"]
    layouts = {
        "w1": ("W1 / W3 (publish all, then drain; W3 = a durable backend)", w1_header,
               w1_row("w1")),
        "w1c": ("W1c / W3c (W1 / W3 with every publish confirmed)", w1_header, w1_row("w1c")),
        "w2": ("W2 (producer and consumer at once)",
               ["system", "end-to-end msgs/s", "client CPU", "server CPU", "server us/msg"],
               lambda f: [rate(f["total"]), pct(f["client_cpu"]), pct(f["server_cpu"]),
                          f"{f['server_us']:.1f}"]),
        "paced": ("W2 paced (latency from a timestamp in the payload)",
                  ["system", "p50 ms", "p99 ms", "client CPU", "server CPU"],
                  lambda f: [f"{f['p50_ms']:.3f}", f"{f['p99_ms']:.3f}", pct(f["client_cpu"]),
                             pct(f["server_cpu"])]),
        "memory": ("Memory (RSS of a fresh server holding N ready messages)",
                   ["system", "messages", "RSS before MB", "RSS filled MB", "RSS at rest MB",
                    "MB per 1M (marginal)", "MB per 1M (total)"],
                   lambda f: [f"{f['messages']:,.0f}", f"{f['rss_before_mb']:.0f}",
                              f"{f['rss_filled_mb']:.0f}", f"{f['rss_mb']:.0f}",
                              f"{f['mb_per_1m']:.0f}", f"{f['total_mb_per_1m']:.0f}"]),
        "restart": ("Restart (N ready messages: SIGTERM, start again, until all N are counted; "
                    "first delivery: until a consumer got one; reported: the recovery time "
                    "the server logs; RSS after: once it stopped moving)", restart_header,
                    restart_row("restart")),
        "restart-crash": ("Restart after a crash (as Restart, with kill -9 for SIGTERM: "
                          "every store replays)", restart_header, restart_row("restart-crash")),
    }
    layouts |= {name: (s.title, s.header, s.row) for name, s in SHAPES.items()}
    out = []
    for workload, (title, header, row) in layouts.items():
        if workload in summary:
            out.append((title, header, [[system, *row(f)]
                                        for system, f in summary[workload].items()]))
    out.append(("Targets (same-run ratios)", ["target", "measured", "met"],
                [[t["target"], "-" if t["value"] is None else f"{t['value']:.2f}",
                  {True: "met", False: "NOT met", None: "not measured"}[t["met"]]]
                 for t in targets(summary)]))
    return out


def rate(value: float) -> str:
    return f"{value:,.0f}"


def pct(value: float) -> str:
    return f"{value:.0f}%"


def console(result: dict[str, Any]) -> str:
    lines = []
    for title, header, rows in tables(summarise(result)):
        widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
        lines += ["", title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines += notes(result)
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"- date: {meta['date']}; took {meta['elapsed_s']:.0f} s",
             f"- machine: {meta['machine']}; Python {meta['python']}; mqserver "
             f"{meta['mqserver']}; " + "; ".join(meta["peers"].values())]
    for title, header, rows in tables(summarise(result)):
        lines += ["", f"### {title}", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += notes(result)
    return "\n".join(lines) + "\n"


def notes(result: dict[str, Any]) -> list[str]:
    lines = []
    for system, reason in result["skipped"].items():
        lines.append(f"skipped {system}: {reason}")
    for e in result["errors"]:
        lines.append(f"FAILED {e['workload']} {e['system']} round {e['round']}: {e['error']}")
    return ["", *lines] if lines else []
