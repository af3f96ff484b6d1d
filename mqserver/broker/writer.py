# -*- test-case-name: tests.unit.test_writer -*-
"""Group commit: storage ops collected per reactor turn, one ``apply`` per batch.

When a batch fails (disk full, I/O error, SQLite busy) its waiters get the
failure at once (so no confirm is ever sent for it), and the batch is *kept*
at the head of the queue and applied again, with the ops added since behind
it, after a delay that doubles up to ``max_retry_delay``.  Every op is an
idempotent upsert or delete of the broker's current state, and the order is
unchanged, so a later success leaves the store exactly where memory is: a
transient fault heals itself without a restart and without a silent hole.
Meanwhile the broker keeps serving from memory, and ``failing`` (with
``last_error``) is what ``/health`` and ``/metrics`` report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqserver.figures import Figure, figures
from mqserver.interfaces import IMessageStore

log = Logger()

BEHIND_AT = 50_000
"""Ops waiting for the store past which publishers are not read: about 20 MB of
messages held as objects (the store writes 10,000 per batch)."""


class StoreWriter:
    """Feeds a store one batch at a time.

    Ops added during a reactor turn go out together at the end of the turn.
    While a batch is being applied, new ops pile up and go out as the next
    batch as soon as it fires, so a slow fsync makes batches bigger rather
    than queueing one commit per message.

    What it keeps from batch to batch is made once: the figures live in an
    array (``mqserver.figures``), and the op and waiter lists are emptied,
    not replaced, so nothing the last batch of a fill made outlives it in
    the arenas the fill's messages went through (see ``figures``).
    """

    batches = Figure(int)
    last_batch_size = Figure(int)
    last_batch_seconds = Figure(float)
    # with ``batches``, a latency average for /metrics (a Prometheus summary)
    batch_seconds_total = Figure(float)

    def __init__(
        self, store: IMessageStore, clock: IReactorTime, max_batch: int = 10_000,
        retry_delay: float = 0.5, max_retry_delay: float = 5.0,
    ) -> None:
        self._store = store
        self.max_batch = max_batch
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self._delay = retry_delay
        self._retry: Any = None
        self._clock = clock
        self.ops: list[tuple[Any, ...]] = []
        # ids of pending ops that must go to the store in the same batch as
        # the op before them (``add_with_previous``); empty on the hot path
        self._glued: set[int] = set()
        self._call: Any = None
        self._stopped = False
        self._in_flight = False
        self._pending_waiters: list[Deferred[None]] = []
        self._flight_waiters: list[Deferred[None]] = []
        self.figures = figures(StoreWriter)
        self.failures = 0
        self.last_error: str | None = None
        # called when a batch succeeded and nothing is pending: the writer
        # holds no message any more (the broker then packs what it could not)
        self.on_idle: Callable[[], object] | None = None
        # ops pending past which the broker stops reading publishers until
        # half of them are written (``behind``); told through ``on_behind``
        self.behind_at = BEHIND_AT
        self.is_behind = False
        self.on_behind: Callable[[bool], object] | None = None

    @property
    def failing(self) -> bool:
        """True from a failed batch until one succeeds; ops wait for the retry."""
        return self.last_error is not None

    @property
    def settled(self) -> bool:
        """True when every op added so far is in the store: none pending, in flight or failed."""
        return not self.ops and not self._in_flight and self.last_error is None

    def stop(self) -> None:
        """No more batches or retries: the service gave up on its last flush and
        closes the store, or the store's session is gone (``BrokerService.abandon``)."""
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        if self._call is not None and self._call.active():
            self._call.cancel()

    def add(self, op: tuple[Any, ...]) -> None:
        self.ops.append(op)
        if self._call is None and not self._in_flight and self._retry is None:
            self._call = self._clock.callLater(0, self._flush)

    def add_with_previous(self, op: tuple[Any, ...]) -> None:
        """Add ``op`` so that it reaches the store in the same batch as the op added before it.

        A store applies a batch atomically, so a crash leaves both ops or
        neither: what a move needs, whose ENQUEUE into the target and REMOVE
        from the source must not be split by the ``max_batch`` cut (one
        without the other is a message in two queues, or in none).
        """
        self._glued.add(id(op))
        self.add(op)

    def behind(self) -> None:
        """More than ``behind_at`` ops wait (the broker checks after each publish run)."""
        self.is_behind = True
        if self.on_behind is not None:
            self.on_behind(True)

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

    def _retry_now(self) -> None:
        self._retry = None
        self._flush()

    def _flush(self) -> None:
        self._call = None
        if self._in_flight or not self.ops or self._retry is not None or self._stopped:
            return
        # A store may encode a batch on the reactor thread: cap what one
        # apply gets.  Waiters stay pending until the op list is empty,
        # since they wait for every op added before them.
        cut = self._cut() if len(self.ops) > self.max_batch else len(self.ops)
        batch = self.ops[:cut]
        del self.ops[:cut]
        if not self.ops:
            self._flight_waiters += self._pending_waiters
            self._pending_waiters.clear()
        self._in_flight = True
        self.last_batch_size = len(batch)
        started = self._clock.seconds()
        d = maybeDeferred(self._store.apply, batch)
        d.addBoth(self._applied, started, batch)

    def _cut(self) -> int:
        """Where a batch of at most about ``max_batch`` ops ends: never before a glued op."""
        cut, ops, glued = self.max_batch, self.ops, self._glued
        while cut < len(ops) and id(ops[cut]) in glued:
            cut += 1
        return cut

    def _applied(self, result: object, started: float, batch: list[tuple[Any, ...]]) -> None:
        self._in_flight = False
        self.batches += 1
        self.last_batch_seconds = self._clock.seconds() - started
        self.batch_seconds_total += self.last_batch_seconds
        waiters = self._flight_waiters.copy()
        self._flight_waiters.clear()
        if isinstance(result, Failure):
            self._failed(result, batch, waiters)
            return
        if self._glued:
            for op in batch:
                self._glued.discard(id(op))
        if self.last_error is not None:
            log.info("storage writes succeed again after {n} failed batches", n=self.failures)
        self.last_error = None
        self._delay = self.retry_delay
        for d in waiters:
            d.callback(None)
        if self.is_behind and len(self.ops) <= self.behind_at // 2:
            self.is_behind = False
            if self.on_behind is not None:
                self.on_behind(False)
        if self.ops:
            self._flush()
        elif self.on_idle is not None:
            self.on_idle()

    def _failed(self, failure: Failure, batch: list[tuple[Any, ...]],
                waiters: list[Deferred[None]]) -> None:
        """Fail the batch's waiters, keep its ops first in line, and retry later."""
        self.failures += 1
        first = self.last_error is None
        self.last_error = failure.getErrorMessage()
        self.ops[:0] = batch
        # a pending waiter waits for every op added before it, the failed
        # batch included: it gets this failure too
        waiters.extend(self._pending_waiters)
        self._pending_waiters.clear()
        if first:
            log.failure("storage batch of {n} ops failed; serving from memory and retrying "
                        "every {max} s at most; nothing is confirmed until a batch succeeds",
                        failure, n=len(batch), max=self.max_retry_delay)
        else:
            log.error("storage still failing ({n} failed batches, {ops} ops pending): {e}",
                      n=self.failures, ops=len(self.ops), e=self.last_error)
        # scheduled before the waiters run: one of them may be a shutdown's stop()
        if not self._stopped:
            self._retry = self._clock.callLater(self._delay, self._retry_now)
        self._delay = min(self._delay * 2, self.max_retry_delay)
        for d in waiters:
            d.errback(failure)
