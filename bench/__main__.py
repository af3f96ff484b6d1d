"""The benchmark suite: mqserver per protocol and backend, and its peers, in one run.

    python -m bench [--quick] [--messages N] [--size S] [--rounds R] [--only REGEX]
                    [--workload w1|w1c|w2|paced|memory|restart|restart-crash|fanout|...]...
                    [--markdown FILE] [--json FILE]

W1 (W3 on a durable backend), W1c (every publish confirmed), W2 end to end
and paced, memory and restart (after SIGTERM, and after kill -9), over
MQKS, PHPMQ, eMQP and HTTP on every storage setup, and beanstalkd, Redis,
NATS JetStream and RabbitMQ started on loopback ports (``make bench-setup``
installs them); and issue 19's fan-out, many queues, idle connections and
large bodies (``bench.shapes``).
Prints the medians and the issue's target ratios; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys

from bench import report, shapes
from bench.runner import WORKLOADS, Options, run

QUICK = {"messages": 2000, "rounds": 1, "paced_messages": 1000, "memory_messages": 20_000,
         "restart_messages": 20_000, "http_scale": 1.0, **shapes.QUICK}


def parse(argv: list[str]) -> tuple[Options, argparse.Namespace]:
    defaults = Options()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small N and one round (what tests/test_bench.py runs)")
    parser.add_argument("--messages", type=int, help=f"N for W1/W2 (default {defaults.messages:,})")
    parser.add_argument("--size", type=int, help=f"S, body bytes (default {defaults.size})")
    parser.add_argument("--rounds", type=int, help=f"rounds per figure (default {defaults.rounds})")
    parser.add_argument("--paced-messages", type=int,
                        help=f"messages per paced round (default {defaults.paced_messages:,})")
    parser.add_argument("--paced-rate", type=float,
                        help=f"paced msgs/s (default {defaults.paced_rate:,.0f})")
    parser.add_argument("--memory-messages", type=int,
                        help=f"ready messages for the RSS figure (default "
                             f"{defaults.memory_messages:,})")
    parser.add_argument("--restart-messages", type=int,
                        help=f"ready messages for the restart figure (default "
                             f"{defaults.restart_messages:,})")
    parser.add_argument("--http-scale", type=float,
                        help=f"share of N the HTTP client runs (default {defaults.http_scale})")
    shapes.add_arguments(parser)
    parser.add_argument("--workload", action="append", choices=WORKLOADS,
                        help="run only this workload (repeatable; default: all)")
    parser.add_argument("--only", default="", help="regular expression on system names, "
                        "e.g. 'mqks/memory|beanstalkd$'")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--json", help="also write every round and the summary to this file")
    args = parser.parse_args(argv)
    chosen = dict(QUICK) if args.quick else {}
    for name in ("messages", "size", "rounds", "paced_messages", "paced_rate", "memory_messages",
                 "restart_messages", "http_scale", *shapes.OPTIONS):
        if getattr(args, name) is not None:
            chosen[name] = getattr(args, name)
    if chosen.get("size", defaults.size) < 20:
        parser.error("--size must be at least 20 (bodies carry a 19-digit number)")
    return Options(workloads=tuple(args.workload or WORKLOADS), only=args.only, **chosen), args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options, args = parse(argv)
    # a SIGTERM unwinds like Ctrl-C, so the servers started get stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(options)
    result["meta"]["command"] = shlex.join(["python", "-m", "bench", *argv])
    summary = report.summarise(result)
    result["summary"] = summary
    result["targets"] = report.targets(summary)
    print(report.console(result))
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(report.markdown(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
