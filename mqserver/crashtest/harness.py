"""The cycles: start the server, check and drain what the last kill left, load it, kill it."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mqserver.crashtest import emqp, http, mqks, phpmq
from mqserver.crashtest.ledger import DURABLE, Ledger
from mqserver.crashtest.server import ServerProcess
from mqserver.crashtest.topology import QUEUES


class CrashCheckError(AssertionError):
    """The server lost a confirmed message, brought back a settled one, or garbled a body."""


@dataclass
class CycleReport:
    """One load-and-kill, and what the restart after it gave back."""

    cycle: int
    published: int = 0  # copies: a publish to an event bound to two queues makes two
    confirmed: int = 0
    done: Counter[str] = field(default_factory=Counter)  # durable settles by kind
    recovered: int = 0
    must: int = 0
    killed_after: float = 0.0


class CrashTest:
    """Runs the cycles against one ``--storage`` configuration."""

    def __init__(self, storage_args: list[str], workdir: Path, seed: int = 0,
                 max_kill_delay: float = 1.5) -> None:
        self.args = [*storage_args, f"--data-dir={workdir / 'data'}", "--ttl-interval=0.25"]
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.seed = seed
        self.max_kill_delay = max_kill_delay
        self.ledger = Ledger()
        self.reports: list[CycleReport] = []
        self.servers: list[ServerProcess] = []

    def run(self, cycles: int) -> list[CycleReport]:
        for cycle in range(cycles + 1):
            server = ServerProcess(self.args, self.workdir)
            self.servers.append(server)
            try:
                if self.reports:
                    self._verify_and_drain(server.ports["mqks"], self.reports[-1])
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

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of every server run so far that match ``pattern`` (a regex)."""
        regex = re.compile(pattern)
        return [line for server in self.servers for line in server.output if regex.search(line)]

    def _fail(self, text: str) -> CrashCheckError:
        return CrashCheckError(f"{text} (seed {self.seed}, args {self.args})")

    def _verify_and_drain(self, port: int, report: CycleReport) -> None:
        ledger = self.ledger
        started = time.time()
        must = ledger.must(started)
        try:
            found, garbled = mqks.drain(port, list(QUEUES), must)
        except ConnectionError as e:
            raise self._fail(str(e)) from None
        problems = ledger.check(found, started, time.time())
        if garbled:
            problems.append(f"{len(garbled)} bodies differ, e.g. {garbled[:3]}")
        if problems:
            raise self._fail("after the restart: " + "; ".join(problems))
        report.recovered, report.must = sum(found.values()), len(must)
        report.done["expired"] = ledger.done["expired"]

    def _load_and_kill(self, server: ServerProcess, cycle: int, report: CycleReport) -> None:
        ledger = self.ledger = Ledger()
        ports, rng = server.ports, self.rng
        http.Client(ports["http"]).declare()
        setup = mqks.Barrier(ports["mqks"], ledger)  # the options are durable before the load
        setup.lines.send(b"s publish --confirm %s x\n" % mqks.BARRIER_EVENT)
        if not setup.lines.expect(b"s ok "):
            raise self._fail("the queues' set-up was not confirmed")
        prefix = f"c{cycle}"
        consumer = phpmq.Consumer(ports["phpmq"], ledger, random.Random(rng.random()))
        ezmq = emqp.Emqp(ports, ledger, random.Random(rng.random()), prefix + "e")
        workers: list[Callable[[threading.Event], None]] = [
            mqks.Producer(ports["mqks"], ledger, random.Random(rng.random()), prefix + "m").run,
            mqks.Consumer(ports["mqks"], ledger, random.Random(rng.random())).run,
            *(http.Publisher(ports["http"], ledger, random.Random(rng.random()), f"{prefix}h{n}_",
                             purges=n == 0).run for n in range(3)),
            consumer.run, ezmq.client, ezmq.worker, setup.run,
        ]
        stop = threading.Event()
        errors: list[BaseException] = []

        def guarded(work: Callable[[threading.Event], None]) -> None:
            try:
                work(stop)
            except Exception as e:  # reported below, unless the kill caused it
                errors.append(e)

        threads = [threading.Thread(target=guarded, args=(w,), daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        # the random moment of the crash counts from when every client has
        # had something settled, so that on a slow or busy machine every
        # kill still lands in mixed traffic
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not errors:
            with ledger.lock:
                if {"mqks-ack", "phpmq-005", "publish"} <= set(ledger.done) and ezmq.pending:
                    break
            time.sleep(0.01)
        delay = rng.uniform(0.05, self.max_kill_delay)
        time.sleep(delay)
        server.kill()
        stop.set()
        for thread in threads:
            thread.join(10)
        ezmq.close()
        if any(not isinstance(e, OSError) for e in errors):
            raise self._fail(f"a client failed: {errors!r}")
        with ledger.lock:
            report.published = len(ledger.copies)
            report.confirmed = sum(c.ops[0].state == DURABLE for c in ledger.copies.values())
            report.done = Counter(ledger.done)
        report.killed_after = delay
