"""Active/standby (``--ha``) with real processes: PostgreSQL, two ``twistd mqserver``
nodes and real MQKS, PHPMQ, eMQP and HTTP clients (``mqserver.crashtest.failover``).

Short leases so that CI stays quick (``--ha-lease=2 --ha-renew=0.5
--ha-poll=0.2``); ``python -m bench.failover_soak`` runs the same cycles as
long as you like, with the defaults or any setting.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request

import pytest

from mqserver.crashtest.failover import FailoverTest, HealthWatch, Node
from mqserver.crashtest.server import Lines

FAST = ("--ha-lease=2", "--ha-renew=0.5", "--ha-poll=0.2")


def seed() -> int:
    return int(os.environ.get("MQSERVER_CRASH_SEED", random.randrange(1 << 30)))


def args(dsn: str, tmp_path) -> list[str]:
    return ["--storage=postgres", f"--postgres-dsn={dsn}", f"--data-dir={tmp_path / 'data'}",
            *FAST]


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{condition} still false after {timeout} s")
        time.sleep(0.02)


def confirmed_publish(port: int, body: bytes = b"x") -> bool:
    lines = Lines(port)
    try:
        lines.send(b"p publish --confirm failover.probe %s\n" % body)
        return lines.expect(b"p ok ", 10.0)
    finally:
        lines.close()


def test_a_standby_serves_only_its_health_and_metrics(tmp_path, postgres_dsn):
    active = Node("a", args(postgres_dsn, tmp_path), tmp_path)
    standby = None
    try:
        wait_for(lambda: active.health()[0] == 200)
        standby = Node("b", args(postgres_dsn, tmp_path), tmp_path)
        base = f"http://127.0.0.1:{standby.http}"

        def health() -> dict:
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(base + "/health", timeout=5)
            assert answer.value.code == 503
            return json.loads(answer.value.read())

        wait_for(lambda: health()["active"] is not None)
        state = health()
        assert state["status"] == "standby" and state["node"] == "b"
        assert state["active"]["node"] == "a" and state["active"]["lease_valid"]
        with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
            assert b"mqserver_ha_active 0.0" in answer.read()
        active_metrics = f"http://127.0.0.1:{active.http}/metrics"
        with urllib.request.urlopen(active_metrics, timeout=5) as answer:
            text = answer.read()
        assert b"mqserver_ha_active 1.0" in text and b"mqserver_ha_promotions_total 1.0" in text
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/api/queues", timeout=5)
        assert refused.value.code == 503 and b"the active node: a (HTTP tcp:" in refused.value.read()
        assert set(standby.server.ports) == {"http"}  # no protocol listens
        ports = active.ports_since(0)
        assert confirmed_publish(ports["mqks"])
    finally:
        codes = [node.server.stop() for node in (active, standby) if node is not None]
    assert set(codes) <= {0, -15}, codes  # twistd re-raises SIGTERM
    assert "Traceback" not in "".join(active.server.output + standby.server.output)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_failover_under_load_loses_nothing_confirmed(tmp_path, postgres_dsn, how):
    """kill -9 (or SIGSTOP) of the active, cycle after cycle; never two serving."""
    test = FailoverTest(postgres_dsn, tmp_path, seed=seed(), how=how, ha_args=FAST)
    takeovers = test.run(cycles=2 if how == "kill" else 1)
    assert [t.new for t in takeovers] and all(t.new != t.old for t in takeovers)
    assert all(0 < t.to_confirm < 20 for t in takeovers), takeovers
    reports = test.crash.reports
    assert all(r.confirmed > 0 for r in reports) and sum(r.must for r in reports) > 0, reports
    assert test.overlaps == [], test.overlaps
    assert test.watch is not None and test.watch.samples > 20
    if how == "stop":
        assert all(t.resumed_standby is not None for t in takeovers)
        # Which way the stopped active's session ends is not asserted: the
        # standby terminates it once the lease ran out ("let its lease run
        # out", tested in test_ha_claim), or, stopped inside a batch's
        # transaction, PostgreSQL ends it first (idle_in_transaction_session_
        # timeout is one lease) and the lock is simply free.  Both are bounded
        # by the lease, which the takeover time above checks.
        assert test.crash.log_lines(r"no longer active")
    # (a lost session's failed batch is logged with its traceback by the writer, as it should)
    assert not test.crash.log_lines(r"Unhandled|: demotion$|could not start"), \
        test.crash.log_lines(r".")


def test_a_database_restart_ends_the_active_role_and_one_node_takes_it_again(
    tmp_path, postgres_cluster, postgres_dsn,
):
    """Every session is cut: the active must stop serving before anyone serves again."""
    nodes = [Node("a", args(postgres_dsn, tmp_path), tmp_path)]
    try:
        wait_for(lambda: nodes[0].health()[0] == 200)
        nodes.append(Node("b", args(postgres_dsn, tmp_path), tmp_path))
        assert confirmed_publish(nodes[0].ports_since(0)["mqks"], b"before")
        marks = [len(n.server.output) for n in nodes]
        watch = HealthWatch(nodes)
        try:
            postgres_cluster.restart("immediate")
            wait_for(lambda: any(n.health()[0] == 200 and "mqks" in n.ports_since(m)
                                 for n, m in zip(nodes, marks, strict=True)), 30)
        finally:
            watch.close()
        assert watch.overlaps == []
        assert "no longer active" in "".join(nodes[0].server.output)
        [(active, mark)] = [(n, m) for n, m in zip(nodes, marks, strict=True)
                            if n.health()[0] == 200]
        assert confirmed_publish(active.ports_since(mark)["mqks"], b"after")
    finally:
        for node in nodes:
            node.stop()
