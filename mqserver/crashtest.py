"""Crash-safety harness: ``kill -9`` a real server under load, restart it, check what came back.

Used by ``tests/integration/test_crash.py`` (a few cycles per backend in CI)
and ``python -m bench.crash_soak`` (as many cycles as you like).  It needs
nothing but an installed mqserver, so a third-party backend can run it too:
``python -m bench.crash_soak --storage=NAME``.

Each cycle starts ``twistd -n mqserver`` with MQKS on an ephemeral port and:

1. **verifies and drains** what the previous cycle left: one manual-ack
   consumer takes everything, then acks it all with ``--confirm``;
2. **loads** it: a producer publishes with ``--confirm``, the consumer acks
   about half of what it receives with ``ack --confirm``;
3. **kills** it with SIGKILL at a random moment of that load.

The ledger of the client's view decides what must, may and must not come
back: a publish is *confirmed* when its ``ok`` arrived, an ack is *done* only
when its ``ack --confirm`` answered ``ok``.  Confirmed and never-acked
messages must all come back (nothing confirmed is lost); done acks must never
come back; unconfirmed publishes and unanswered acks may go either way.
Bodies are derived from ids and compared byte for byte.

``kill -9`` keeps the kernel's page cache, so every fsync mode must pass
this; what ``--fsync=always`` adds over ``interval`` is survival of a power
cut, which a process kill cannot simulate.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

LISTENING = re.compile(r"mqks listening on [\d.]+:(\d+)")


class CrashCheckError(AssertionError):
    """The server lost a confirmed message, resurrected an acked one, or garbled a body."""


def body_of(mid: str) -> bytes:
    """The body a message id always carries: 10 to 400 bytes, checkable after recovery."""
    size = 10 + sum(mid.encode()) * 7 % 390
    return (mid + ":").encode() + bytes(97 + (i * 31 + size) % 26 for i in range(size))


def fixed_port_opt_outs() -> list[str]:
    """Flags that switch off listeners on fixed ports (``--no-http``), if this mqserver has them.

    Servers started one after the other must not fight over a default port.
    """
    from mqserver.tap import Options

    flags = {row[0] for row in Options.optFlags}
    return ["--no-http"] if "no-http" in flags else []


class ServerProcess:
    """``twistd -n mqserver`` with MQKS on an ephemeral port; its output kept for reports."""

    def __init__(self, args: list[str], workdir: Path, timeout: float = 30.0) -> None:
        twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [twistd, "-n", "--pidfile=", "mqserver", "--no-gc-tuning",
             "--protocol=mqks:tcp:0:interface=127.0.0.1", *args],
            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self._port: list[int] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or not self._port:
            self.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.output))
        self.port = self._port[0]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            match = LISTENING.search(line)
            if match and not self._port:
                self._port.append(int(match.group(1)))
                self._ready.set()
        self._ready.set()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


class Lines:
    """A socket that yields complete lines; ``None`` once the peer is gone."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._buffer = b""
        self._lock = threading.Lock()

    def send(self, data: bytes) -> bool:
        with self._lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def lines(self, timeout: float) -> list[bytes] | None:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(1 << 16)
        except TimeoutError:
            return []
        except OSError:
            return None
        if not chunk:
            return None
        data = self._buffer + chunk
        *complete, self._buffer = data.split(b"\n")
        return complete

    def close(self) -> None:
        self.sock.close()


@dataclass
class Ledger:
    """What the clients know for sure (see the module docstring)."""

    published: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)
    ack_sent: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    lock: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class CycleReport:
    """One load-and-kill, and what the restart after it gave back."""

    cycle: int
    published: int = 0
    confirmed: int = 0
    acked: int = 0
    recovered: int = 0
    must: int = 0
    killed_after: float = 0.0


def parse_delivery(line: bytes) -> tuple[str, bytes] | None:
    """(id, body) of a ``c ok {mid} event=...`` delivery line, else None."""
    parts = line.split(b" ", 4)
    if len(parts) == 5 and parts[:2] == [b"c", b"ok"] and parts[3].startswith(b"event="):
        return parts[2].decode(), parts[4]
    return None


class CrashTest:
    """Runs the cycles against one ``--storage`` configuration."""

    def __init__(self, storage_args: list[str], workdir: Path, seed: int = 0,
                 messages: int = 500_000, max_kill_delay: float = 0.6) -> None:
        self.args = [*storage_args, f"--data-dir={workdir / 'data'}", *fixed_port_opt_outs()]
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.seed = seed
        self.messages = messages
        self.max_kill_delay = max_kill_delay
        self.ledger = Ledger()
        self.reports: list[CycleReport] = []
        self.servers: list[ServerProcess] = []
        self._killed = threading.Event()

    def run(self, cycles: int) -> list[CycleReport]:
        for cycle in range(cycles + 1):
            server = self._start()
            try:
                checked = self._verify_and_drain(server.port, first=cycle == 0)
                if self.reports:
                    self.reports[-1].recovered, self.reports[-1].must = checked
                if cycle == cycles:
                    break
                report = CycleReport(cycle)
                self._load_and_kill(server, cycle, report)
                self.reports.append(report)
            finally:
                if cycle < cycles:
                    server.kill()
                else:
                    server.stop()
        return self.reports

    def _start(self) -> ServerProcess:
        server = ServerProcess(self.args, self.workdir)
        self.servers.append(server)
        return server

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of every server run so far that match ``pattern`` (a regex)."""
        regex = re.compile(pattern)
        return [line for server in self.servers for line in server.output if regex.search(line)]

    def _fail(self, text: str) -> CrashCheckError:
        return CrashCheckError(f"{text} (seed {self.seed}, args {self.args})")

    def _verify_and_drain(self, port: int, first: bool) -> tuple[int, int]:
        ledger = self.ledger
        must = ledger.confirmed - ledger.ack_sent
        may = (ledger.published - ledger.confirmed) | (ledger.ack_sent - ledger.acked)
        consumer = Lines(port)
        if first:
            consumer.send(b"rb rebind --confirm q ev\n")
        consumer.send(b"c consume --confirm q --manual-ack\n")
        got: dict[str, bytes] = {}
        deadline = time.monotonic() + 30
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            lines = consumer.lines(0.1)
            if lines is None:
                raise self._fail("server closed the connection while draining")
            for line in lines:
                delivery = parse_delivery(line)
                if delivery is None:
                    continue
                mid, body = delivery
                if mid in got:
                    raise self._fail(f"{mid} delivered twice after restart")
                got[mid] = body
            if lines:
                quiet_since = time.monotonic()
            else:
                # the server recovered before it listened, so deliveries flow at
                # once; three quiet seconds with messages missing means lost
                quiet = time.monotonic() - quiet_since
                if quiet > 3.0 or (quiet > 0.3 and must <= set(got)):
                    break
        lost = must - set(got)
        if lost:
            raise self._fail(
                f"{len(lost)} confirmed, unacked messages lost, e.g. {sorted(lost)[:5]}"
            )
        back = set(got) & ledger.acked
        if back:
            raise self._fail(f"{len(back)} acked messages came back, e.g. {sorted(back)[:5]}")
        unknown = set(got) - must - may
        if unknown:
            raise self._fail(f"{len(unknown)} unexpected messages, e.g. {sorted(unknown)[:5]}")
        garbled = [mid for mid, body in got.items() if body != body_of(mid)]
        if garbled:
            raise self._fail(f"{len(garbled)} bodies differ, e.g. {garbled[:5]}")
        consumer.send(b"aa ack --confirm c --all\n")
        self._expect(consumer, b"aa ok ")
        consumer.close()
        self.ledger = Ledger()
        return len(got), len(must)

    def _expect(self, client: Lines, wanted: bytes) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines = client.lines(0.5)
            if lines is None:
                break
            if wanted in lines:
                return
        raise self._fail(f"no {wanted!r} from the server")

    def _load_and_kill(self, server: ServerProcess, cycle: int, report: CycleReport) -> None:
        ledger = self.ledger
        producer, consumer = Lines(server.port), Lines(server.port)
        consumer.send(b"c consume --confirm q --manual-ack\n")
        ack_every = self.rng.choice([2, 3])
        threads = [
            threading.Thread(target=self._produce, args=(producer, cycle), daemon=True),
            threading.Thread(target=self._confirmations, args=(producer,), daemon=True),
            threading.Thread(target=self._consume, args=(consumer, ack_every), daemon=True),
        ]
        self._killed.clear()
        with ledger.lock:
            acked_before = len(ledger.acked)
        for thread in threads:
            thread.start()
        # the random moment of the crash (a real process, real time) counts
        # from the first confirmed ack of this cycle, so that on a slow or
        # busy machine every kill still lands in mixed publish/ack traffic
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with ledger.lock:
                if len(ledger.acked) > acked_before:
                    break
            time.sleep(0.01)
        delay = self.rng.uniform(0.05, self.max_kill_delay)
        time.sleep(delay)
        server.kill()
        self._killed.set()
        for thread in threads:
            thread.join(10)
        producer.close()
        consumer.close()
        with ledger.lock:
            report.published = len(ledger.published)
            report.confirmed = len(ledger.confirmed)
            report.acked = len(ledger.acked)
        report.killed_after = delay

    def _produce(self, producer: Lines, cycle: int) -> None:
        """Publish in chunks of 50 until killed, with at most 2,000 unconfirmed at a time."""
        ledger = self.ledger
        for start in range(0, self.messages, 50):
            mids = [f"k{cycle}_{n}" for n in range(start, min(start + 50, self.messages))]
            with ledger.lock:
                while len(ledger.published) - len(ledger.confirmed) > 2000:
                    ledger.lock.wait(0.1)
                    if self._killed.is_set():
                        return
                ledger.published.update(mids)
            data = b"".join(b"%s publish --confirm ev %s\n" % (m.encode(), body_of(m))
                            for m in mids)
            if not producer.send(data):
                return

    def _confirmations(self, producer: Lines) -> None:
        ledger = self.ledger
        while (lines := producer.lines(5.0)) is not None:
            confirmed = [line[:-4].decode() for line in lines if line.endswith(b" ok ")]
            with ledger.lock:
                ledger.confirmed.update(confirmed)
                ledger.lock.notify_all()

    def _consume(self, consumer: Lines, ack_every: int) -> None:
        ledger = self.ledger
        count = 0
        while (lines := consumer.lines(5.0)) is not None:
            acks, done = [], []
            for line in lines:
                delivery = parse_delivery(line)
                if delivery is not None:
                    count += 1
                    if count % ack_every == 0:
                        acks.append(delivery[0])
                elif line.startswith(b"a") and line.endswith(b" ok "):
                    done.append(line[1:-4].decode())
            with ledger.lock:
                ledger.ack_sent.update(acks)
                ledger.acked.update(done)
            if acks and not consumer.send(
                b"".join(b"a%s ack --confirm c %s\n" % (m.encode(), m.encode()) for m in acks)
            ):
                return
