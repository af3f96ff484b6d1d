"""The benchmark suite's quick mode, end to end, so it cannot rot.

Real servers (every protocol on every storage setup, ``postgres`` on a
PostgreSQL cluster the bench starts) and the peers that are installed
(beanstalkd, redis-server, nats-server, rabbitmq-server: ``make
bench-setup``; PostgreSQL: ``make postgres-setup``; a missing one is skipped
by the bench, which says why).  No timing assertions: only that every
workload produced positive figures and every message came back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import database, rabbitmq
from bench.report import TARGETS
from bench.systems import PROTOCOLS as CLIENTS
from bench.workloads import reported_recovery

ROOT = Path(__file__).resolve().parent.parent
STORAGES = ("memory", "memory+journal", "sqlite", "log-interval", "log-always", "postgres")
PROTOCOLS = ("mqks", "phpmq", "emqp", "http")
PEERS = {"beanstalkd": "beanstalkd", "beanstalkd-b": "beanstalkd", "beanstalkd-b-f0": "beanstalkd",
         "redis": "redis-server", "redis-aof-everysec": "redis-server",
         "redis-aof-always": "redis-server", "jetstream-memory": "nats-server",
         "jetstream-file": "nats-server", "rabbitmq": "rabbitmq-server",
         "rabbitmq-durable": "rabbitmq-server", "rabbitmq-quorum": "rabbitmq-server"}
#: workload -> the systems it runs (W1 also runs every protocol on every storage setup)
EXPECTED = {
    "w1": {f"{p}/{s}" for p in PROTOCOLS for s in STORAGES} | set(PEERS),
    # every peer confirms each publish; mqserver's protocols as their clients can
    "w1c": {f"{p}/{s}" for p in PROTOCOLS for s in STORAGES if CLIENTS[p].can_confirm_each}
           | set(PEERS),
    "w2": {"mqks/memory", "phpmq/memory", "emqp/memory", "http/memory", "beanstalkd", "redis",
           "jetstream-memory", "rabbitmq"},
    "paced": {"mqks/memory", "phpmq/memory", "emqp/memory", "beanstalkd", "redis",
              "jetstream-memory", "rabbitmq"},
    "memory": {"mqks/memory", "mqks/sqlite", "mqks/log-interval", "beanstalkd", "redis"},
    # issue 19's shapes (bench.shapes)
    "fanout": {f"mqks/{s} x{w}" for s in ("memory", "log-interval") for w in (1, 10, 100)},
    "queues": {"mqks/memory 1 queue", "mqks/memory many queues"},
    "idle": {"mqks/memory", "phpmq/memory"},
    "bodies": {f"{p}/{s} {size}" for p in ("mqks", "phpmq", "http")
               for s in ("memory", "log-interval") for size in ("64KiB", "1MiB")},
    "restart": {"mqks/sqlite", "mqks/log-interval", "redis-aof-everysec"},
    "restart-crash": {"mqks/sqlite", "mqks/log-interval", "redis-aof-everysec"},
    "startup": {"mqks/memory", "mqks/sqlite", "mqks/log-interval", "redis-aof-everysec"},
}
#: figures from CPU ticks (a tiny quick round may show none), RSS growth (pages) or
#: a server's log (Redis logs the load of a small AOF as 0.000 seconds)
NOT_NEGATIVE = ("client_cpu", "server_cpu", "server_us", "server_ms_per_mb", "kb_per_queue",
                "bytes_per", "server_cpu_ms", "reported_s")


def installed(binary: str) -> bool:
    # Debian puts rabbitmq-server in /usr/sbin, off a plain user's PATH
    return rabbitmq.missing() is None if binary == "rabbitmq-server" else bool(
        shutil.which(binary))


def test_quick_bench_runs_every_workload_and_gets_every_message_back(tmp_path):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(out), "--markdown", str(md)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == []

    missing = {peer for peer, binary in PEERS.items() if not installed(binary)}
    if database.missing():
        missing |= {f"{p}/postgres" for p in PROTOCOLS}
    assert set(result["skipped"]) == missing
    assert all("not installed" in reason for reason in result["skipped"].values())

    summary = result["summary"]
    for workload, expected in EXPECTED.items():
        assert set(summary.get(workload, {})) == expected - missing, workload
        for system, figures in summary[workload].items():
            cpu = {name: figures.pop(name) for name in NOT_NEGATIVE if name in figures}
            assert all(value > 0 for value in figures.values()), (workload, system, figures)
            assert all(value >= 0 for value in cpu.values()), (workload, system, cpu)
    for r in result["rounds"]:
        if "received" in r:
            assert r["received"] == r["count"], r
        elif r["workload"] in ("restart", "restart-crash"):
            # every message came back (or the round failed), and the server
            # logged how long its recovery took
            assert r["recovery"] > 0 and r["rss"] > 0 and r["rss_before"] > 0, r
            assert r["reported"] is not None and r["reported"] >= 0, r
        elif r["workload"] == "startup":
            assert 0 < r["listening"] <= r["answer"], r
        else:
            assert r["workload"] == "memory" and r["rss"] > r["rss_before"] > 0, r

    assert [t["target"] for t in result["targets"]] == [t.name for t in TARGETS]
    measured = {t["target"] for t in result["targets"] if t["met"] is not None}
    assert any("MQKS memory W1 total" in name for name in measured)
    if "beanstalkd" not in missing:
        assert "HTTP memory W1 total (batches of 1000) ≥ 1x beanstalkd" in measured
    if not missing & {"jetstream-memory", "rabbitmq-quorum"} and CLIENTS["mqks"].can_confirm_each:
        assert {"MQKS memory W1c total ≥ 2x JetStream memory W1c",
                "log interval:50 W3c total ≥ 3x RabbitMQ quorum W3c"} <= measured
    versions = result["meta"]["peers"]
    for binary in ("nats-server", "rabbitmq-server"):
        assert ("not installed" in versions[binary]) != installed(binary), versions[binary]
    assert "### Targets (same-run ratios)" in md.read_text()
    if "redis-aof-everysec" not in missing:
        assert {"sqlite restart after a crash ≤ 2x Redis loading its AOF",
                "log restart to the first delivery ≤ 2x Redis's"} <= measured
    if "mqks/postgres" not in missing:
        assert "postgres W3 total ≥ 2x beanstalkd -b" in measured
        assert "PostgreSQL" in result["meta"]["peers"]["postgres"]
    assert "Targets (same-run ratios)" in run.stdout


def test_zmq_floor_measures_a_pyzmq_clients_cost_per_emqp_message():
    run = subprocess.run([sys.executable, "-m", "bench.zmq_floor", "--messages", "2000"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    lines = run.stdout.splitlines()
    assert lines[0].startswith("pyzmq ") and "2000 messages" in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == [
        "send 11 frames", "recv 11 frames", "one client's ceiling with a free broker"]
    assert int(lines[3].split(": ")[1].split()[0].replace(",", "")) > 0


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (Debian package)")
def test_callgrind_counts_the_servers_instructions_per_message():
    run = subprocess.run([sys.executable, "-m", "bench.callgrind", "--messages", "500",
                          "--journal"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         check=True)
    assert run.stdout.startswith("W1 mqks storage=memory journal=on N=500: ")
    assert int(run.stdout.split(": ")[1].split()[0].replace(",", "")) > 0


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (Debian package)")
def test_callgrind_counts_the_servers_instructions_per_fanned_out_copy():
    run = subprocess.run([sys.executable, "-m", "bench.callgrind", "--messages", "500",
                          "--fanout", "10"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=True)
    assert run.stdout.startswith("fan-out x10 mqks storage=memory journal=off N=500: ")
    assert run.stdout.rstrip().endswith(" instructions per copy")
    assert int(run.stdout.split(": ")[1].split()[0].replace(",", "")) > 0


class Logged:
    """What ``reported_recovery`` reads of a server: its log."""

    name = "server"

    def __init__(self, text: str) -> None:
        self.text = text

    def log_text(self) -> str:
        return self.text


@pytest.mark.parametrize(("line", "seconds"), [
    ("[-] SQLite /d/mqserver.sqlite3: 1 queues, 1000000 messages recovered in 2.460 s (replay)",
     2.46),
    ("[-] log /d/log: 2 queues, 10 messages recovered in 0.004 s (replay)", 0.004),
    ("[-] clean-shutdown snapshot /d/mqserver.snapshot used: 1 queues, 1000000 messages read "
     "in 0.300 s (no replay)", 0.3),
    ("1:M 27 Nov 2026 12:00:00.000 * DB loaded from incr file appendonly.aof.1.incr.aof: "
     "0.151 seconds\n1:M 27 Nov 2026 12:00:00.000 * DB loaded from append only file: "
     "0.152 seconds", 0.152),
])
def test_the_recovery_time_a_server_logs_is_read_from_its_log(line: str, seconds: float):
    assert reported_recovery(Logged(f"starting\n{line}\nlistening\n"), wait=0) == seconds
    assert reported_recovery(Logged("starting\nlistening\n"), wait=0) is None
