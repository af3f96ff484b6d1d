"""The real server on PostgreSQL: ``twistd -n mqserver --storage=postgres``.

Real MQKS, PHPMQ, eMQP and HTTP clients publish and settle (every settle
path) while the server is killed with ``kill -9`` at a random moment, cycle
after cycle (the crash harness, ``mqserver.crashtest``); after each restart
every confirmed, unsettled copy must come back and no confirmed settle may.  The
module's PostgreSQL cluster (tests/conftest.py) keeps running throughout,
as a database server on another machine would.
"""

from __future__ import annotations

import os
import random

from mqserver.crashtest import CrashTest


def test_kill_9_under_load_loses_nothing_confirmed(tmp_path, postgres_dsn):
    seed = int(os.environ.get("MQSERVER_CRASH_SEED", random.randrange(1 << 30)))
    crash = CrashTest(["--storage=postgres", f"--postgres-dsn={postgres_dsn}"], tmp_path,
                      seed=seed)
    reports = crash.run(cycles=3)
    assert len(reports) == 3
    assert all(r.confirmed > 0 and r.done["mqks-ack"] > 0 for r in reports), reports
    assert sum(r.must for r in reports) > 0, reports
    assert not crash.log_lines(r"Traceback|Unhandled"), crash.log_lines(r".")
    assert crash.log_lines(r"PostgreSQL store: 127\.0\.0\.1:\d+/test_\d+")
