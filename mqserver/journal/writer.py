# -*- test-case-name: tests.unit.test_journal -*-
"""The journal as a Twisted service: buffer in memory, hand batches over on a timer.

The broker calls ``Journal.append`` with a tuple of plain values at each event
(no I/O, no encoding).  ``append`` is ``list.extend``: the values are kept in
one flat list and the tuple is freed at once.  Keeping hundreds of thousands
of live tuples per second cost more than building them, because each one
counts towards the garbage collector's next collection, and with a large
backlog of messages those collections are what the broker pays for.

A ``LoopingCall`` on the injected clock takes what accumulated and either

* hands it to a ``Feeder`` thread, which frames it with ``marshal`` and
  writes it to the journal process (``mqserver.journal.sink``), which
  encodes and writes segments on another core: the default with a real
  reactor; or
* encodes and writes it in-process with a ``SegmentWriter`` (no reactor
  given: unit tests, tools).

Both flush paths catch and log their errors, so the timer never dies.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.journal.feeder import Feeder
from mqserver.journal.segments import SegmentWriter, safe_node

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
        self.pending: list[Any] = []
        # the broker's per-event cost is this one call.  An instance attribute
        # holding a builtin method: callers read it into a local first
        # (``append = journal.append``), which Python 3.11 specializes, where
        # ``journal.append(...)`` takes the slow generic method lookup
        self.append = self.pending.extend
        # protocol name -> the same as bytes, for the slim published record:
        # the batches cross as marshal version 2 (mqserver.journal.sink),
        # which encodes a str anew each time but copies bytes.  Names the
        # broker has not seen open a connection pass through as they are
        self.sources: dict[str | None, bytes] = {}
        self.writer: SegmentWriter | None = None
        self._process: _SinkProcess | None = None
        self._feeder: Feeder | None = None
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
        # our own pipe rather than Twisted's "w" child fd: the Feeder thread
        # writes it with blocking calls, off the reactor
        read_end, write_end = os.pipe()
        try:
            self.process_reactor.spawnProcess(
                self._process, sys.executable, args, env=None,
                childFDs={0: read_end, 1: 1, 2: "r"})
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._feeder = Feeder(write_end, self._feed_failed)

    def note_protocol(self, name: str) -> None:
        """Learn a protocol's name as it opens a connection (see ``sources``)."""
        if name not in self.sources:
            self.sources[name] = name.encode("utf-8", "surrogatepass")

    def _feed_failed(self, error: BaseException, lost: int) -> None:
        """From the feeder thread: the journal process stopped reading."""
        self.process_reactor.callFromThread(
            log.error, "journal process stopped reading ({error}); {lost} values and all "
            "later records are dropped", error=error, lost=lost)

    def _process_ended(self, reason: Any) -> None:
        if self.running:
            log.error("journal process ended ({reason}); journal records are now dropped",
                      reason=reason.getErrorMessage())

    def flush(self) -> None:
        """Hand over what accumulated.  Runs from the LoopingCall: catches and logs."""
        batch = self.pending
        if not batch:
            if self.writer is not None:
                self.writer.seal_if_due()
            return
        self.pending = []
        self.append = self.pending.extend
        try:
            if self.writer is not None:
                self.writer.write(batch)
            elif self._feeder is not None:
                self._feeder.send(batch)
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
        if self._feeder is not None and self._process is not None:
            feeder, self._feeder = self._feeder, None
            feeder.close()
            return self._process.ended
        return succeed(None)
