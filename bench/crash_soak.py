"""Crash soak: many ``kill -9`` cycles per storage configuration.

    python -m bench.crash_soak [--cycles N] [--seed S] [--config NAME]... [--storage-args "..."]

Runs ``mqserver.crashtest`` (every settle path of MQKS, PHPMQ, eMQP and
HTTP under load, SIGKILL at a random moment, restart, check every copy of
every message against what the clients know) N times for each configuration
and prints what it measured per configuration.  Exits 1 on the first
failure, with the seed to reproduce the clients' and the kill's choices.
``postgres`` starts a PostgreSQL cluster of its own for the run
(``mqserver.pgtesting``: Debian's server binaries, ``make postgres-setup``).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from mqserver.crashtest import CrashCheckError, CrashTest

CONFIGS = {
    "sqlite-full": ["--storage=sqlite", "--sqlite-sync=full"],
    "sqlite-normal": ["--storage=sqlite", "--sqlite-sync=normal"],
    "log-always": ["--storage=log", "--fsync=always"],
    "log-interval": ["--storage=log", "--fsync=interval:50"],
    "log-never": ["--storage=log", "--fsync=never"],
    # 1 MiB segments: rolls and compaction (rewrites, deletes) under the kills
    "log-small-segments": ["--storage=log", "--fsync=interval:50", "--log-segment-mb=1"],
    "postgres": ["--storage=postgres"],  # --postgres-dsn of a cluster started for the run
}


def _storage_args(name: str, args: list[str], stack: contextlib.ExitStack) -> list[str]:
    """``args``, with a database for ``postgres``: a throwaway cluster, stopped at the end."""
    if name != "postgres":
        return args
    from mqserver.pgtesting import PostgresCluster

    cluster = PostgresCluster.create()
    stack.callback(cluster.destroy)
    return [*args, f"--postgres-dsn={cluster.dsn()}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS),
                        help="configuration to run (repeatable; default: all)")
    parser.add_argument("--storage-args", default=None,
                        help='run these twistd storage options instead, e.g. "--storage=mine"')
    parser.add_argument("--max-kill-delay", type=float, default=1.5,
                        help="the kill comes 0.05 s to this many seconds into the load")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    if args.storage_args:
        configs = {"custom": args.storage_args.split()}
    else:
        configs = {name: CONFIGS[name] for name in (args.config or CONFIGS)}
    print(f"seed {seed}, {args.cycles} cycles per configuration")
    for name, storage_args in configs.items():
        with contextlib.ExitStack() as stack:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="mqserver-soak-"))
            crash = CrashTest(_storage_args(name, storage_args, stack), Path(workdir),
                              seed=seed, max_kill_delay=args.max_kill_delay)
            started = time.monotonic()
            try:
                reports = crash.run(args.cycles)
            except CrashCheckError as e:
                print(f"{name}: FAILED after {len(crash.reports)} cycles: {e}")
                return 1
            elapsed = time.monotonic() - started
            repairs = crash.log_lines(r"torn tail|damaged bytes|unfinished batch")
            done = sum((r.done for r in reports), Counter())
            print(
                f"{name}: {len(reports)} cycles in {elapsed:.1f} s; "
                f"copies published {sum(r.published for r in reports)}, "
                f"confirmed {sum(r.confirmed for r in reports)}, "
                f"must come back {sum(r.must for r in reports)}, "
                f"came back {sum(r.recovered for r in reports)}; "
                f"log repairs {len(repairs)}; OK"
            )
            settles = ", ".join(f"{kind} {count}" for kind, count in sorted(done.items())
                                if kind != "publish")
            print(f"{name}: durable settles checked: {settles}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
