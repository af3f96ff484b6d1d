"""Throwaway PostgreSQL clusters: started, stopped and killed by PID, replicated."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from mqserver.pgtesting import PostgresCluster, find_bindir, free_port, process_running


def test_find_bindir_takes_the_environment_first(monkeypatch, tmp_path: Path) -> None:
    for name in ("initdb", "postgres"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("MQSERVER_PG_BINDIR", str(tmp_path))
    assert find_bindir() == tmp_path
    monkeypatch.setenv("MQSERVER_PG_BINDIR", str(tmp_path / "missing"))
    assert find_bindir() != tmp_path / "missing"


def backends(cluster: PostgresCluster) -> list[int]:
    return [int(pid) for pid in cluster.psql(
        "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()").split()]


@pytest.fixture
def cluster() -> PostgresCluster:
    if find_bindir() is None:
        pytest.skip("no PostgreSQL server binaries")
    cluster = PostgresCluster.create()
    yield cluster
    cluster.destroy()


def test_runs_unprivileged_on_loopback_and_stops_by_pid(cluster: PostgresCluster) -> None:
    assert cluster.psql("SHOW listen_addresses").strip() == "127.0.0.1"
    owner = cluster.data.stat().st_uid
    assert owner != 0 if os.geteuid() == 0 else owner == os.geteuid()
    pid = cluster.pid
    cluster.psql("CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
    cluster.restart("immediate")  # a crash: the WAL brings the row back
    assert cluster.pid != pid and not process_running(pid)
    assert cluster.psql("SELECT n FROM t").strip() == "1"
    pid = cluster.pid
    cluster.stop()
    assert cluster.pid is None and not process_running(pid)
    assert cluster.directory.exists()


def test_kill_takes_every_backend_with_it(cluster: PostgresCluster) -> None:
    helpers = backends(cluster)
    assert helpers  # the checkpointer, the WAL writer, ...
    cluster.kill()
    assert not any(process_running(pid) for pid in helpers)
    cluster.start()
    assert cluster.psql("SELECT 1").strip() == "1"


def test_a_synchronous_replica_takes_over_after_a_kill(cluster: PostgresCluster) -> None:
    replica = cluster.replica("r1", synchronous=True)
    try:
        assert cluster.psql(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'r1'"
        ).strip() == "sync"
        cluster.psql("CREATE TABLE t (n int); INSERT INTO t VALUES (7)")
        cluster.kill()
        replica.promote()
        assert replica.psql("SELECT pg_is_in_recovery()").strip() == "f"
        replica.psql("INSERT INTO t VALUES (8)")
        assert replica.psql("SELECT n FROM t ORDER BY n").split() == ["7", "8"]
    finally:
        replica.destroy()


def test_free_port_is_free() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


def test_stop_falls_back_to_sigkill(cluster: PostgresCluster) -> None:
    """A postmaster that ignores the shutdown request is killed when the wait runs out."""
    pid = cluster.pid
    os.kill(pid, signal.SIGSTOP)
    cluster.stop(timeout=0.5)
    assert not process_running(pid)
