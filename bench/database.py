"""The ``postgres`` setup's database: a PostgreSQL cluster of the bench's own, durable as shipped.

``mqserver.pgtesting`` starts it (Debian's server binaries, ``make
postgres-setup``; the ``postgres`` user when the bench runs as root) in a
temporary directory on a free loopback port, and stops it by PID.  The test
clusters of pgtesting turn ``fsync`` off; the bench turns it back on, with
the rest of PostgreSQL's default durability (``synchronous_commit=on``,
``full_page_writes=on``, ``shared_buffers`` 128 MB), so a confirmed batch
is a WAL flush to the disk, as a W3 figure must be.

The database does the storage work that the sqlite and log setups do inside
mqserver, so its CPU (the postmaster, the sessions, the WAL writer and
checkpointer, and what exited) is counted as the server's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
from pathlib import Path

from bench.proc import TICKS, cpu_ticks, stat_fields
from mqserver.pgtesting import PostgresCluster, find_bindir

#: postgresql.conf over pgtesting's test settings: PostgreSQL's defaults again
DURABLE_SETTINGS = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "shared_buffers": "128MB",
}


def missing() -> str | None:
    """Why the ``postgres`` setup cannot run here, or None."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg not installed (pip install 'mqserver[postgres]')"
    if find_bindir() is None:
        return "PostgreSQL server not installed (make postgres-setup)"
    return None


def version() -> str:
    """The server's version line, for the report."""
    bindir = find_bindir()
    if bindir is None:
        return "PostgreSQL not installed"
    return subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True,
                          text=True, timeout=10).stdout.strip()


class Database:
    """A running cluster for one mqserver (a ``bench.proc.Companion``)."""

    def __init__(self, cluster: PostgresCluster) -> None:
        self.cluster = cluster

    @classmethod
    def start(cls) -> Database:
        return cls(PostgresCluster.create(settings=DURABLE_SETTINGS))

    def dsn(self) -> str:
        return self.cluster.dsn()

    def cpu_seconds(self) -> float:
        """The postmaster's CPU, with its children's: the live ones from
        ``/proc``, the exited ones (reaped by it) from its own stat."""
        pid = self.cluster.pid
        if pid is None:
            return 0.0
        ticks = cpu_ticks(stat_fields(pid), children=True)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError):
                fields = stat_fields(stat.parent.name)
                if int(fields[1]) == pid:
                    ticks += cpu_ticks(fields)
        return ticks / TICKS

    def stop(self) -> None:
        self.cluster.destroy()
