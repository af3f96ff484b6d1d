"""Crash safety: ``kill -9`` the real server under load, restart it, check the ledger.

The harness is ``mqserver.crashtest`` (see its docstring and ``ledger.py``
for the rules); this runs four cycles per durable backend, about four
seconds each, with every settle path of MQKS, PHPMQ, eMQP and HTTP.  More
cycles: ``python -m bench.crash_soak --cycles N`` (docs/storage.md).
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from mqserver.crashtest import CrashCheckError, CrashTest

CONFIGS = {
    "sqlite": ["--storage=sqlite"],
    "log-always": ["--storage=log", "--fsync=always"],
    "log-interval": ["--storage=log", "--fsync=interval:50"],
    # a checkpoint every 0.2 s or MiB: most restarts walk from one (log_checkpoint)
    "log-checkpoint": ["--storage=log", "--log-checkpoint=1:0.2"],
}

EXERCISED = {
    "mqks-ack", "mqks-reject", "mqks-reject-out", "phpmq-004", "phpmq-005", "phpmq-006",
    "emqp-ack", "emqp-fail", "emqp-fail-out", "purge", "expired",
}
"""Settles every CI run must have made durable at least once (timeouts need > 1 s of load)."""


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kill_9_under_load_loses_nothing_confirmed(tmp_path, name):
    seed = int(os.environ.get("MQSERVER_CRASH_SEED", random.randrange(1 << 30)))
    crash = CrashTest(CONFIGS[name], tmp_path, seed=seed)
    reports = crash.run(cycles=4)
    assert len(reports) == 4
    # the load was real: every cycle had confirmed publishes and done acks when killed
    assert all(r.confirmed > 0 and r.done["mqks-ack"] > 0 for r in reports), reports
    done = sum((r.done for r in reports), Counter())
    assert {kind for kind, count in done.items() if count} >= EXERCISED, done
    # and recovery had something to prove: confirmed, unsettled messages came back
    assert sum(r.must for r in reports) > 0, reports
    assert not crash.log_lines(r"Traceback|Unhandled"), crash.log_lines(r".")
    if name == "log-checkpoint":
        assert crash.log_lines(r"log checkpoint \S+ used: from segment"), crash.log_lines(r".")


def test_the_harness_catches_a_store_that_loses_messages(tmp_path):
    """Memory confirms at once and forgets everything at a kill: the check must bite."""
    crash = CrashTest(["--storage=memory"], tmp_path, seed=1, max_kill_delay=0.2)
    with pytest.raises(CrashCheckError, match="copies lost"):
        crash.run(cycles=1)
