"""Failover soak: many takeovers of ``--ha`` nodes on PostgreSQL under load.

    python -m bench.failover_soak [--cycles N] [--how kill|stop] [--seed S]
        [--backlog N] [--ha-args "--ha-lease=5 ..."] [--dsn DSN]

Runs ``mqserver.crashtest.failover``: two nodes on one database (a
throwaway cluster from ``mqserver.pgtesting`` unless ``--dsn`` names one),
real MQKS, PHPMQ, eMQP and HTTP clients with every settle path, the active
killed (``kill``: SIGKILL) or hung (``stop``: SIGSTOP, resumed once the
standby took over) at a random moment, each cycle; every copy checked
against what the clients know, both ``/health``s watched for two actives.
``--backlog N`` first stores N messages nobody consumes, which every
takeover recovers.  Prints the time from the signal to the new active's
first confirmed publish per cycle, then the median and the worst.  Exits 1
on the first failure, with the seed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mqserver.crashtest import CrashCheckError
from mqserver.crashtest.failover import FailoverTest
from mqserver.pgtesting import PostgresCluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--how", choices=("kill", "stop"), default="kill")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--backlog", type=int, default=0,
                        help="messages stored before the first cycle (recovered at each takeover)")
    parser.add_argument("--ha-args", default="", help='node options, e.g. "--ha-lease=2"')
    parser.add_argument("--dsn", default=None, help="an empty database (default: a new cluster)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    cluster = None
    dsn = args.dsn
    if dsn is None:
        cluster = PostgresCluster.create(settings={"fsync": "on", "max_connections": "60"})
        dsn = cluster.create_database("mq")
    print(f"seed {seed}, {args.cycles} cycles, {args.how}, backlog {args.backlog}, "
          f"node options {args.ha_args or '(defaults)'}")
    try:
        with tempfile.TemporaryDirectory(prefix="mqserver-failover-") as workdir:
            test = FailoverTest(dsn, Path(workdir), seed=seed, how=args.how,
                                ha_args=tuple(args.ha_args.split()), backlog=args.backlog,
                                timeout=120.0)
            started = time.monotonic()
            try:
                takeovers = test.run(args.cycles)
            except CrashCheckError as e:
                print(f"FAILED after {len(test.takeovers)} takeovers: {e}")
                return 1
            for t in takeovers:
                resumed = ("" if t.resumed_standby is None
                           else f", resumed node stood by in {t.resumed_standby:.2f} s")
                print(f"cycle {t.cycle}: {t.old} -> {t.new}: serving after {t.to_serving:.2f} s, "
                      f"first confirmed publish after {t.to_confirm:.2f} s{resumed}")
            confirms = [t.to_confirm for t in takeovers]
            reports = test.crash.reports
            print(f"{len(takeovers)} takeovers in {time.monotonic() - started:.1f} s: "
                  f"kill to first confirmed publish median {statistics.median(confirms):.2f} s, "
                  f"max {max(confirms):.2f} s; copies confirmed "
                  f"{sum(r.confirmed for r in reports)}, must come back "
                  f"{sum(r.must for r in reports)}, came back "
                  f"{sum(r.recovered for r in reports)}; two nodes serving at once: "
                  f"{len(test.overlaps)} of {test.watch.samples if test.watch else 0} samples")
            return 1 if test.overlaps else 0
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    sys.exit(main())
