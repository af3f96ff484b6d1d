# -*- test-case-name: tests.unit.test_writer -*-
"""Group commit: storage ops collected per reactor turn, one ``apply`` per batch."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqserver.interfaces import IMessageStore

log = Logger()


class StoreWriter:
    """Feeds a store one batch at a time.

    Ops added during a reactor turn go out together at the end of the turn.
    While a batch is being applied, new ops pile up and go out as the next
    batch as soon as it fires, so a slow fsync makes batches bigger rather
    than queueing one commit per message.
    """

    def __init__(
        self, store: IMessageStore, clock: IReactorTime, max_batch: int = 10_000
    ) -> None:
        self._store = store
        self.max_batch = max_batch
        self._clock = clock
        self.ops: list[tuple[Any, ...]] = []
        self._call: Any = None
        self._in_flight = False
        self._pending_waiters: list[Deferred[None]] = []
        self._flight_waiters: list[Deferred[None]] = []
        self.batches = 0
        self.last_batch_size = 0
        self.last_batch_seconds = 0.0
        # with ``batches``, a latency average for /metrics (a Prometheus summary)
        self.batch_seconds_total = 0.0
        self.failures = 0
        self.last_error: str | None = None

    def add(self, op: tuple[Any, ...]) -> None:
        self.ops.append(op)
        if self._call is None and not self._in_flight:
            self._call = self._clock.callLater(0, self._flush)

    def wait(self) -> Deferred[None]:
        """Fires when every op added so far is durable (fails if its batch failed)."""
        if self.ops:
            d: Deferred[None] = Deferred()
            self._pending_waiters.append(d)
            return d
        if self._in_flight:
            d = Deferred()
            self._flight_waiters.append(d)
            return d
        return succeed(None)

    def _flush(self) -> None:
        self._call = None
        if self._in_flight or not self.ops:
            return
        if len(self.ops) > self.max_batch:
            # A store may encode a batch on the reactor thread: cap what one
            # apply gets.  Waiters stay pending until the op list is empty,
            # since they wait for every op added before them.
            batch, self.ops = self.ops[: self.max_batch], self.ops[self.max_batch :]
        else:
            batch, self.ops = self.ops, []
            self._flight_waiters, self._pending_waiters = self._pending_waiters, []
        self._in_flight = True
        self.last_batch_size = len(batch)
        started = self._clock.seconds()
        d = maybeDeferred(self._store.apply, batch)
        d.addBoth(self._applied, started)

    def _applied(self, result: object, started: float) -> None:
        self._in_flight = False
        self.batches += 1
        self.last_batch_seconds = self._clock.seconds() - started
        self.batch_seconds_total += self.last_batch_seconds
        waiters, self._flight_waiters = self._flight_waiters, []
        if isinstance(result, Failure):
            self.failures += 1
            self.last_error = result.getErrorMessage()
            log.failure("storage batch of {n} ops failed", result, n=self.last_batch_size)
            for d in waiters:
                d.errback(result)
        else:
            self.last_error = None
            for d in waiters:
                d.callback(None)
        if self.ops:
            self._flush()
