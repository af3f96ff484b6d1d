# -*- test-case-name: tests.unit.test_journal -*-
"""The journal as a Twisted service: buffer in memory, hand batches over on a timer.

The broker calls ``Journal.append`` with a tuple of plain values at each event
(one list append: no I/O, no encoding).  A ``LoopingCall`` on the injected
clock takes what accumulated and either

* sends it, framed with ``marshal`` (C speed), to the journal process
  (``mqserver.journal.sink``), which encodes and writes segments on another
  core: the default with a real reactor; or
* encodes and writes it in-process with a ``SegmentWriter`` (no reactor
  given: unit tests, tools).

Both flush paths catch and log their errors, so the timer never dies.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.journal.segments import SegmentWriter, safe_node
from mqserver.journal.sink import frame

log = Logger()


class _SinkProcess(ProcessProtocol):
    """Logs the journal process's messages and reports its end."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.ended: Deferred[None] = Deferred()

    def errReceived(self, data: bytes) -> None:
        for line in data.decode("utf-8", "replace").splitlines():
            log.warn("{line}", line=line)

    def processEnded(self, reason: Any) -> None:
        self.journal._process_ended(reason)
        self.ended.callback(None)


class Journal(Service):
    """Buffered journal; ``append`` is the broker's hot-path entry point."""

    def __init__(
        self,
        directory: str,
        clock: IReactorTime,
        node: str | None = None,
        bodies: bool = False,
        segment_bytes: int = 64 * 1024 * 1024,
        segment_seconds: float = 300.0,
        flush_interval: float = 0.2,
        process_reactor: Any = None,
    ) -> None:
        self.directory = directory
        self.clock = clock
        self.node = safe_node(node or socket.gethostname())
        self.bodies = bodies
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self.process_reactor = process_reactor
        self.pending: list[tuple[Any, ...]] = []
        # bound once: the broker's per-event cost is this one call
        self.append = self.pending.append
        self.writer: SegmentWriter | None = None
        self._process: _SinkProcess | None = None
        self._transport: Any = None
        self._loop = LoopingCall(self.flush)
        self._loop.clock = clock
        self._flush_interval = flush_interval

    def startService(self) -> None:
        super().startService()
        if self.process_reactor is None:
            self.writer = SegmentWriter(self.directory, self.node, self.clock.seconds,
                                        self.bodies, self.segment_bytes, self.segment_seconds)
        else:
            self._spawn()
        self._loop.start(self._flush_interval, now=False)

    def _spawn(self) -> None:
        args = [sys.executable, "-m", "mqserver.journal.sink", self.directory,
                "--node", self.node, "--segment-bytes", str(self.segment_bytes),
                "--segment-seconds", str(self.segment_seconds)]
        if self.bodies:
            args.append("--bodies")
        self._process = _SinkProcess(self)
        self._transport = self.process_reactor.spawnProcess(
            self._process, sys.executable, args, env=None,
            childFDs={0: "w", 1: 1, 2: "r"})

    def _process_ended(self, reason: Any) -> None:
        if self.running:
            log.error("journal process ended ({reason}); journal records are now dropped",
                      reason=reason.getErrorMessage())
        self._transport = None

    def flush(self) -> None:
        """Hand over what accumulated.  Runs from the LoopingCall: catches and logs."""
        pending = self.pending
        if not pending:
            if self.writer is not None:
                self.writer.seal_if_due()
            return
        batch = pending[:]
        del pending[:]
        try:
            if self.writer is not None:
                self.writer.write(batch)
            elif self._transport is not None:
                self._transport.write(frame(batch))
        except Exception:
            log.failure("journal flush failed; {n} records are lost", n=len(batch))

    def stopService(self) -> Deferred[None]:
        """Flush and seal; with a journal process, wait until it has exited."""
        super().stopService()
        if self._loop.running:
            self._loop.stop()
        self.flush()
        if self.writer is not None:
            self.writer.seal()
            return succeed(None)
        if self._transport is not None and self._process is not None:
            self._transport.closeStdin()
            return self._process.ended
        return succeed(None)
