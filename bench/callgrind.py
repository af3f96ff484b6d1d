"""Instructions the server executes per W1 message, counted by callgrind.

``python -m bench.callgrind [--messages N] [--journal] [--storage memory] [--protocol mqks]
[--confirm-each] [--fanout W]``

Throughput on a shared 2-core machine moves by tens of per cent between
runs; instruction counts move by about 0.1 %.  This starts the suite's
server (``bench.servers.start_mqserver``) under ``valgrind
--tool=callgrind``, warms it up with a quarter-size W1 round, zeroes the
counters, runs one W1 round with the suite's lean client of ``--protocol``
(MQKS by default) and reads the
counters back: every thread of the server process, nothing of the client.
``--confirm-each``: the client has every publish confirmed (W1c; a client
that can, ``LoadClient.can_confirm_each``).  ``--fanout W``: an MQKS
fan-out round instead (``bench.fanout``: one event bound to W queues,
N copies), instructions per copy delivered and acked; ``--fanout 1`` is
the same client's single-queue cost per message.  Compare two trees with
``PYTHONPATH=<tree>`` (the server inherits it).  It says nothing about
cache misses, system calls or other processes (the journal's), so confirm
a change that matters with the suite.  Needs Debian's ``valgrind``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import fanout, workloads
from bench.proc import Server
from bench.servers import STORAGES, start_mqserver
from bench.systems import PROTOCOLS

Round = Callable[[Server, str, int], object]
"""One round on a server: (server, queue name, messages)."""


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def summary(path: Path) -> int:
    """The instruction total of one callgrind dump."""
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary line in {path}")


def w1(protocol: str = "mqks", confirm_each: bool = False) -> Round:
    """W1 rounds with ``protocol``'s client (every publish confirmed: W1c)."""
    client = PROTOCOLS[protocol]
    return lambda server, queue, messages: workloads.w1(client, server, queue, messages, 100,
                                                        confirm_each)


def fanned(width: int) -> Round:
    """Fan-out rounds (``bench.fanout``): ``messages`` copies over ``width`` queues."""
    return lambda server, queue, messages: fanout.fanout(server, queue.replace("-", ""),
                                                         messages, width, 100)


def count(messages: int, storage: str, workdir: Path, run: Round | None = None) -> float:
    """Instructions per message (per copy, for fan-out) of one ``run`` round
    (W1 over MQKS by default) of ``messages`` 100-byte messages, on a server
    set up as ``bench.servers.STORAGES[storage]``."""
    run = run or w1()
    wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir}/callgrind.%p")
    server = start_mqserver(storage, workdir, wrapper, timeout=300)
    try:
        run(server, "warm-up", max(1, messages // 4))
        time.sleep(1.0)  # timers and the journal's flush settle
        control("-z", str(server.pid))
        run(server, "counted", messages)
        time.sleep(1.0)  # the journal's flush of this round is counted too
        control("-d", str(server.pid))
    finally:
        server.stop()
    (dump,) = workdir.glob("callgrind.*.1")
    return summary(dump) / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--journal", action="store_true",
                        help="the memory storage with --journal")
    parser.add_argument("--storage", default="memory",
                        choices=[name for name in STORAGES if "+" not in name])
    parser.add_argument("--protocol", default="mqks", choices=sorted(PROTOCOLS))
    parser.add_argument("--confirm-each", action="store_true",
                        help="every publish confirmed by the broker (W1c)")
    parser.add_argument("--fanout", type=int, metavar="W",
                        help="MQKS fan-out instead of W1: one event bound to W queues, "
                             "--messages copies, instructions per copy")
    args = parser.parse_args()
    if args.journal and args.storage != "memory":
        parser.error("--journal goes with --storage=memory")
    if args.confirm_each and not PROTOCOLS[args.protocol].can_confirm_each:
        parser.error(f"the {args.protocol} client cannot confirm every publish")
    if shutil.which("valgrind") is None:
        sys.exit("bench.callgrind needs valgrind (Debian package valgrind)")
    setup = "memory+journal" if args.journal else args.storage
    if args.fanout is not None and (args.fanout < 1 or args.protocol != "mqks"
                                     or args.confirm_each):
        parser.error("--fanout takes a width of 1 or more, over MQKS without --confirm-each")
    run = fanned(args.fanout) if args.fanout else w1(args.protocol, args.confirm_each)
    with tempfile.TemporaryDirectory(prefix="mqserver-callgrind-") as tmp:
        per_message = count(args.messages, setup, Path(tmp), run)
    journal = "on" if args.journal else "off"
    workload = "W1c" if args.confirm_each else "W1"
    if args.fanout:
        workload, unit = f"fan-out x{args.fanout}", "copy"
    else:
        unit = "message"
    print(f"{workload} {args.protocol} storage={args.storage} journal={journal} "
          f"N={args.messages}: {per_message:,.0f} instructions per {unit}")


if __name__ == "__main__":
    main()
