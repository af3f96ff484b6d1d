"""mqserver under test: every protocol on ephemeral loopback ports, one storage setup.

One server per storage setup (memory, memory with the journal, sqlite, log
with ``interval:50`` and ``always``, postgres) serves MQKS, PHPMQ, eMQP and
HTTP at once; the rounds of each protocol take turns on it.  ``postgres``
gets a PostgreSQL cluster of its own (``bench.database``), started before
the server and stopped after it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import database
from bench.proc import Server
from mqserver.journal.sink import QUIET

LISTENING = re.compile(r"\] ([\w-]+) listening on [\d.]+:(\d+)")
LABELS = ("mqks", "phpmq", "emqp", "emqp-backend", "emqp-admin", "http")
TOKEN = "bench-token"

#: storage setup name -> twistd storage options (``journal`` adds ``--journal``).
STORAGES: dict[str, list[str]] = {
    "memory": ["--storage=memory"],
    "memory+journal": ["--storage=memory"],
    "sqlite": ["--storage=sqlite", "--sqlite-sync=full"],
    "log-interval": ["--storage=log", "--fsync=interval:50"],
    "log-always": ["--storage=log", "--fsync=always"],
    "postgres": ["--storage=postgres"],  # --postgres-dsn of its own cluster
}


def missing(storage: str) -> str | None:
    """Why ``storage`` cannot run here (the ``postgres`` setup needs a server), or None."""
    return database.missing() if storage == "postgres" else None


def start_mqserver(storage: str, workdir: Path, wrapper: tuple[str, ...] = (),
                   timeout: float = 30.0, extra: tuple[str, ...] = ()) -> Server:
    """Start ``twistd -n mqserver`` for ``storage`` in ``workdir`` and learn its ports.

    ``wrapper`` runs it under another command (``bench.callgrind``: valgrind),
    which may need a longer start-up ``timeout``; ``extra`` are more mqserver
    options (``bench.idle``: ``--max-connections``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    compiled()
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    any_port = "tcp:0:interface=127.0.0.1"
    argv = [*wrapper, sys.executable, twistd, "-n", "--pidfile=", "mqserver",
            f"--protocol=mqks:{any_port}", f"--protocol=phpmq:{any_port}",
            f"--protocol=emqp:{any_port}", f"--emqp-backend={any_port}",
            f"--emqp-admin={any_port}", f"--http={any_port}", f"--http-token={TOKEN}",
            f"--data-dir={workdir}/data", *STORAGES[storage], *extra]
    if storage.endswith("+journal"):
        argv.append(f"--journal={workdir}/journal")
    db = database.Database.start() if storage == "postgres" else None
    try:
        if db is not None:
            argv.append(f"--postgres-dsn={db.dsn()}")
        server = Server(f"mqserver-{storage}", argv, workdir)
    except BaseException:
        if db is not None:
            db.stop()
        raise
    if db is not None:
        server.companions.append(db)
    try:
        matches = server.wait_for_log(LISTENING, count=len(LABELS), timeout=timeout)
    except RuntimeError:
        server.stop()
        raise
    server.ports = {m.group(1): int(m.group(2)) for m in matches}
    return server


_COMPILE = ("import compileall, importlib.util, os; compileall.compile_dir("
            "os.path.dirname(importlib.util.find_spec('mqserver').origin), quiet=2)")


@functools.cache
def compiled() -> None:
    """mqserver's modules compiled to bytecode once, as pip leaves an installed
    package: a start-up is timed as a deployed server's.  A checkout with
    PYTHONDONTWRITEBYTECODE set, or sources newer than their ``.pyc``, made
    every start compile about 90 modules again (90 ms of a 0.3 s start).
    Compiled where a server imports them from: a process started outside the
    checkout, as the servers are (an editable install's own directory)."""
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([sys.executable, "-c", _COMPILE], cwd=cwd, check=True)


def settle_journal(journal: Path, still: float = QUIET + 0.5) -> None:
    """Wait until the journal process writing into ``journal`` has written
    everything (the files stop growing for ``still`` seconds, longer than it
    holds a burst's batches), so its encoding does not slow the next round,
    of this server or another."""

    def size() -> int:
        return sum(f.stat().st_size for f in journal.rglob("*") if f.is_file())

    before = -1
    while journal.exists() and (now := size()) != before:
        before = now
        time.sleep(still)
