# -*- test-case-name: tests.unit.test_atrest -*-
"""A look every interval, then one bounded slice of work per reactor turn until it is done.

Packing a ready backlog at rest (``mqserver.broker.resting``) and moving a log
index at rest to its runs (``mqserver.storage.log_rest``) both find their
work on a timer and then do it a slice at a time, so the reactor never
stalls on a million messages.  ``SliceLoop`` owns that schedule; its owner
keeps what it found and knows how a slice is done.  Both calls catch and
log their errors, so the ``LoopingCall`` keeps running: a failed look is
tried at the next interval, and a failed slice drops what was due
(``abandon``) until a later look finds it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

log = Logger()


class SliceLoop:
    """``find`` every interval (True: slices are due), then ``step`` once per
    reactor turn while it returns True.

    ``work`` names what the slices do and ``looking_for`` what ``find`` looks
    for, in the log lines of a failure.
    """

    def __init__(self, clock: Any, find: Callable[[], bool], step: Callable[[], bool],
                 abandon: Callable[[], object], looking_for: str, work: str) -> None:
        self.clock = clock
        self.find = find
        self.step = step
        self.abandon = abandon
        self.looking_for = looking_for
        self.work = work
        self._call: Any = None
        self._loop = LoopingCall(self.look)
        self._loop.clock = clock

    def start(self, interval: float) -> None:
        """Look every ``interval`` seconds (0 or less: never)."""
        if interval > 0 and not self._loop.running:
            self._loop.start(interval, now=False)

    def stop(self) -> None:
        """No more looks, and the slice due (if any) is not run."""
        if self._loop.running:
            self._loop.stop()
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def look(self) -> None:
        try:
            due = self.find()
        except Exception:
            log.failure("looking for {what} failed; it looks again next interval",
                        what=self.looking_for)
            return
        if due and self._call is None:
            self._call = self.clock.callLater(0, self._next)

    def _next(self) -> None:
        self._call = None
        try:
            more = self.step()
        except Exception:
            log.failure("{work} failed; it is tried again next interval", work=self.work)
            self.abandon()
            return
        if more:
            self._call = self.clock.callLater(0, self._next)
