"""What every fuzz target shares: a real broker on memory storage and a fake clock,
connections over StringTransport, and a log observer that turns any logged
failure into a crash atheris records.

A protocol may answer garbage with an error reply, a warning or a close; it
may never let an exception escape ``dataReceived``, log a failure (Twisted's
``log.failure``/``log.err``, e.g. "handling a frame failed" or an unhandled
error in a Deferred) or log at level critical/error.  Those are bugs.

Run a target by hand (see docs/operations.md, "Fuzzing")::

    .venv/bin/python tests/fuzz/fuzz_mqks.py -max_total_time=600 /tmp/c tests/fuzz/corpus/mqks
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import atheris
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, formatEvent, globalLogBeginner

with atheris.instrument_imports(include=["mqserver"]):
    from mqserver.broker.core import Broker
    from mqserver.limits import Limits
    from mqserver.storage.memory import MemoryStore

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

LIMITS = Limits(max_name=64, max_id=64, max_headers=8, max_names=4)
"""Small limits, so that the fuzzer reaches every over-the-limit path quickly."""


class FailureLoggedError(AssertionError):
    """A protocol logged a failure or an error while handling fuzzed input."""


class LogWatch:
    """Collects log events that mean a bug; everything else is dropped (no output)."""

    def __init__(self) -> None:
        self.bad: list[str] = []

    def __call__(self, event: dict[str, Any]) -> None:
        level = event.get("log_level")
        if "log_failure" in event or level in (LogLevel.error, LogLevel.critical):
            failure = event.get("log_failure")
            detail = failure.getTraceback() if failure is not None else ""
            self.bad.append(f"{formatEvent(event)}\n{detail}")

    def check(self) -> None:
        if self.bad:
            found, self.bad = self.bad, []
            raise FailureLoggedError("\n".join(found))


WATCH = LogWatch()


def start_logging() -> None:
    """Route every log event to ``WATCH`` only: a fuzzer prints its own statistics."""
    # twisted.python.log.err ends up on the same global publisher
    globalLogBeginner.beginLoggingTo([WATCH], discardBuffer=True, redirectStandardIO=False)


class Transport(StringTransport):
    """StringTransport, except that unregistering with no producer is a no-op, as it is
    on a real TCP transport (twisted.web's HTTPChannel does it when a request times out)."""

    def unregisterProducer(self) -> None:
        if self.producer is not None:
            super().unregisterProducer()


class World:
    """A fresh broker for one input, so inputs do not pile state on each other."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.broker = Broker(MemoryStore(), self.clock)

    def connect(self, factory: Any, port: int = 5555) -> tuple[Any, Transport]:
        protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        transport = Transport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        protocol.makeConnection(transport)
        return protocol, transport

    def turn(self, seconds: float = 0.0) -> None:
        self.clock.advance(0)
        if seconds:
            self.clock.advance(seconds)
        self.clock.advance(0)

    def feed(
        self, protocol: Any, transport: Transport, data: bytes, size: int,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        """``data`` to ``protocol`` in ``size``-byte pieces, ``check`` after each; stops
        once the protocol closed the connection, as a real transport stops reading."""
        for piece in chunks(data, size):
            if transport.disconnecting:
                return
            protocol.dataReceived(piece)
            self.clock.advance(0)
            check()
            if len(transport.value()) > 1 << 20:
                transport.clear()  # long inputs must not grow this process's memory


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in pieces of ``size`` bytes (0: whole), to split frames at every boundary."""
    if size <= 0:
        yield data
        return
    for start in range(0, len(data), size):
        yield data[start : start + size]


@contextmanager
def checked() -> Iterator[None]:
    """Around one input: any failure logged inside is raised at its end."""
    WATCH.bad.clear()
    yield
    WATCH.check()


def main(test_one_input: Callable[[bytes], None]) -> None:
    """The target's entry point: atheris options and corpus directories come from argv."""
    start_logging()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
