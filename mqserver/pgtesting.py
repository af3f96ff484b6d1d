# -*- test-case-name: tests.unit.test_pgtesting -*-
"""Public test helper: throwaway PostgreSQL clusters on loopback.

The tests of ``--storage=postgres`` (and of anything built on it, such as
active/standby failover) need real PostgreSQL servers they can start, stop,
restart and kill at will.  ``PostgresCluster`` is one: ``initdb`` in a fresh
temporary directory, ``postgres`` on a free 127.0.0.1 port, stopped (or
killed) by the PID this process started::

    cluster = PostgresCluster.create()      # initdb + start
    dsn = cluster.dsn()                     # host=127.0.0.1 port=N ...
    cluster.restart(mode="immediate")       # a crash of the database server
    cluster.kill()                          # kill -9 of the whole server
    replica = cluster.replica("r1", synchronous=True)   # pg_basebackup, streaming
    replica.promote()                       # the replica becomes a primary
    cluster.destroy()                       # stop and delete the directory

Why the details:

- **An unprivileged user.**  PostgreSQL refuses to run as root, and CI and
  these machines run as root.  As root the cluster runs as the ``postgres``
  user (Debian's package makes it; created here if missing), through
  ``subprocess``'s ``user=``/``group=``; otherwise as whoever runs the tests.
  Its directory is therefore a ``mkdtemp`` in the system temporary directory
  (pytest's ``tmp_path`` is private to root) handed to that user.
- **The binaries, the Debian way**: ``$MQSERVER_PG_BINDIR``, else the newest
  ``/usr/lib/postgresql/*/bin``, else ``pg_config --bindir``, else ``PATH``.
  ``find_bindir`` returns None when there is no server, and the tests skip
  saying so.
- **Cheap and unsafe on purpose**: ``fsync=off`` and friends.  A test kills
  mqserver or PostgreSQL processes, never the machine, and the page cache
  survives both; what fsync adds is survival of a power cut, which no test
  here can cause.
- **Stopped by PID**: ``postgres`` is started directly (no ``pg_ctl``, no
  service), so its PID is ours to signal; ``kill()`` SIGKILLs the
  postmaster and every process it forked (found in ``/proc``: each backend
  is a session of its own) at once, as a lost machine would.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

#: postgresql.conf settings of every test cluster (see the module docstring)
TEST_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "40",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}
#: shutdown modes (``pg_ctl stop -m``) and the signal that asks the postmaster for each
STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
RUN_AS = "postgres"


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None if there is no server."""
    candidates: list[str] = []
    if os.environ.get("MQSERVER_PG_BINDIR"):
        candidates.append(os.environ["MQSERVER_PG_BINDIR"])
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            candidates.append(subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True,
            ).stdout.strip())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for candidate in candidates:
        bindir = Path(candidate)
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_user() -> pwd.struct_passwd | None:
    """Who the server runs as: None (ourselves) unless we are root, else ``postgres``."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(RUN_AS)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUN_AS],
            check=True, capture_output=True,
        )
        return pwd.getpwnam(RUN_AS)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def process_running(pid: int) -> bool:
    """Alive and not a zombie (a zombie waits for its parent to reap it, and holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class PostgresCluster:
    """One PostgreSQL server over a data directory of its own; see the module docstring.

    ``directory`` holds ``data/`` (the cluster), ``socket/`` and ``server.log``.
    """

    def __init__(self, directory: Path, bindir: Path, port: int | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.bindir = bindir
        self.port = port or free_port()
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.user = server_user()
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls, bindir: Path | None = None, **kwargs: Any) -> PostgresCluster:
        """A new cluster in a fresh temporary directory, started."""
        bindir = bindir or find_bindir()
        if bindir is None:
            raise FileNotFoundError("no PostgreSQL server binaries (initdb, postgres) found")
        cluster = cls(Path(tempfile.mkdtemp(prefix="mqserver-pg-")), bindir, **kwargs)
        try:
            cluster.initdb()
            cluster.start()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def dsn(self, dbname: str = "postgres", **params: Any) -> str:
        """A libpq connection string to this server (``params`` are added as key=value)."""
        fields = {"host": "127.0.0.1", "port": self.port, "user": "postgres", "dbname": dbname,
                  **params}
        return " ".join(f"{key}={value}" for key, value in fields.items())

    def _run_kwargs(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def initdb(self) -> None:
        """Make the cluster: superuser ``postgres``, trust auth on loopback only, UTF-8."""
        self._chown(self.directory)
        (self.directory / "socket").mkdir()
        self._chown(self.directory / "socket")
        self._run([str(self.bindir / "initdb"), "--pgdata", str(self.data), "--username",
                   "postgres", "--auth", "trust", "--encoding", "UTF8", "--locale", "C",
                   "--no-sync", "--no-instructions"])
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# mqserver.pgtesting\n")
            for name, value in self.settings.items():
                conf.write(f"{name} = {value}\n")

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, cwd=self.directory, **self._run_kwargs())
        if done.returncode:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it accepts connections."""
        if self.process is not None:
            raise RuntimeError("the cluster is already running")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server writes it until it exits
        self._chown(self.log_path)
        try:
            self.process = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-k", str(self.directory / "socket")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.directory, start_new_session=True, **self._run_kwargs(),
            )
        finally:
            log.close()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the postmaster says ``ready`` in ``postmaster.pid`` (or fail with its log)."""
        deadline = time.monotonic() + timeout
        pidfile = self.data / "postmaster.pid"
        while True:
            if self.process is None or self.process.poll() is not None:
                self.process = None
                raise RuntimeError(f"PostgreSQL exited at start:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                lines = pidfile.read_text().splitlines()
                if len(lines) >= 8 and lines[7].strip() == "ready" and self._accepts():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL not ready in {timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _accepts(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def log_tail(self, size: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        return ""

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Shut down (``smart``, ``fast`` or ``immediate``, as ``pg_ctl -m``); wait for the PID."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(STOP_SIGNALS[mode])
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(process)

    def kill(self) -> None:
        """SIGKILL the postmaster and all its backends at once, as a lost machine would.

        The next ``start`` runs crash recovery from the WAL.
        """
        process, self.process = self.process, None
        if process is not None:
            self._kill_group(process)

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the postmaster and its children (each of which is a session of its own)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGSTOP)  # no more forks while we look
        children = _children(process.pid)
        for pid in [*children, process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
        # a restart must not find the old shared memory still attached
        deadline = time.monotonic() + 10
        while any(process_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.02)

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode``) and start again on the same port."""
        self.stop(mode)
        self.start()

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` with ``psql`` (no Python driver needed); its output, tuples only."""
        done = subprocess.run(
            [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-d", self.dsn(dbname), "-c", sql],
            capture_output=True, text=True, cwd=self.directory,
        )
        if done.returncode:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def create_database(self, name: str) -> str:
        """A new, empty database; returns its DSN."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def replica(self, name: str = "replica", synchronous: bool = False) -> PostgresCluster:
        """A streaming replica of this running cluster, started (``pg_basebackup -R``).

        It connects as ``application_name=name``; ``synchronous`` makes it the
        primary's synchronous standby (``synchronous_standby_names``), so a
        commit on the primary returns only once the replica has its WAL.
        """
        standby = PostgresCluster(Path(tempfile.mkdtemp(prefix="mqserver-pg-")), self.bindir,
                                  settings=self.settings)
        try:
            standby._chown(standby.directory)
            (standby.directory / "socket").mkdir()
            standby._chown(standby.directory / "socket")
            standby._run([str(self.bindir / "pg_basebackup"), "--pgdata", str(standby.data),
                          "--dbname", self.dsn(), "--write-recovery-conf",
                          "--wal-method", "stream", "--no-sync"])
            with (standby.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(f"primary_conninfo = '{self.dsn(application_name=name)}'\n")
            standby.start()
        except BaseException:
            standby.destroy()
            raise
        if synchronous:
            self.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            self.psql("SELECT pg_reload_conf()")
            self.wait_for(f"SELECT sync_state FROM pg_stat_replication "
                          f"WHERE application_name = '{name}'", "sync")
        return standby

    def wait_for(self, sql: str, answer: str, timeout: float = 30.0) -> None:
        """Poll ``sql`` until it answers ``answer`` (a replica's state, a promotion)."""
        deadline = time.monotonic() + timeout
        while (got := self.psql(sql).strip()) != answer:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sql!r} still answers {got!r}, not {answer!r}")
            time.sleep(0.05)

    def promote(self, timeout: float = 30.0) -> None:
        """Make this replica a primary (``pg_promote``), waiting until it takes writes."""
        self.psql(f"SELECT pg_promote(true, {int(timeout)})")

    def destroy(self) -> None:
        """Stop the server (fast, then by force) and delete its directory."""
        self.stop("fast")
        shutil.rmtree(self.directory, ignore_errors=True)
