"""Start-up: an empty server from exec to every listener up, and to its first answer.

The ``restart`` workload times a start with a backlog; this one times the
same start with nothing to recover, so a restart reads as start-up plus
recovery.  Each round starts a server on a new directory once, untimed
(the first start creates the files: a schema, fsyncs), then restarts it
``starts`` times on those empty files, stopping it with SIGTERM each time
as the restart does, and keeps the median of each figure: exec to the last
"listening on" line (every protocol and HTTP), exec to the first answer to
``backlog`` (MQKS ``_eval``; Redis ``LLEN``), and the CPU the server used
until then (steadier than the wall time on a shared machine).  Redis runs
beside as the floor of a server that answers at once.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.peers import PEERS, start_peer
from bench.proc import POLL, Server
from bench.servers import start_mqserver
from bench.systems import System
from bench.workloads import backlog, cpu

SYSTEMS = ("mqks/memory", "mqks/sqlite", "mqks/log-interval", "redis-aof-everysec")


def startup(system: System, workdir: Path, starts: int) -> dict[str, Any]:
    """``starts`` restarts of ``system``'s server on its empty files; the medians."""
    listening, answered, server_cpu = [], [], []
    client_cpu = cpu()
    where = workdir / system.server
    for number in range(starts + 1):  # the first creates the files
        started = time.perf_counter()
        server = start(system.server, where)
        try:
            up = time.perf_counter() - started
            while backlog(server, "startup") is None:
                if server.process.poll() is not None:
                    raise RuntimeError(f"{server.name} exited:\n{server.log_text()[-2000:]}")
                time.sleep(POLL)
            if number:
                listening.append(up)
                answered.append(time.perf_counter() - started)
                server_cpu.append(server.cpu_seconds())
        finally:
            server.stop()
    answer = statistics.median(answered)
    return {"count": starts, "wall": answer, "listening": statistics.median(listening),
            "answer": answer, "server_cpu": statistics.median(server_cpu),
            "client_cpu": (cpu() - client_cpu) / starts,
            "each": {"listening": listening, "answer": answered, "server_cpu": server_cpu}}


def start(name: str, workdir: Path) -> Server:
    return start_peer(name, workdir) if name in PEERS else start_mqserver(name, workdir)


def figures(r: dict[str, Any]) -> dict[str, float]:
    return {"starts": r["count"], "listening_ms": 1e3 * r["listening"],
            "answer_ms": 1e3 * r["answer"], "server_cpu_ms": 1e3 * r["server_cpu"]}


def row(f: dict[str, float]) -> list[str]:
    return [f"{f['starts']:.0f}", f"{f['listening_ms']:.0f}", f"{f['answer_ms']:.0f}",
            f"{f['server_cpu_ms']:.0f}"]
