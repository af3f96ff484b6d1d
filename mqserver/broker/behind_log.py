# -*- test-case-name: tests.unit.test_behind_log -*-
"""The log lines about a store's writer far behind: at most one per ``QUIET_SECONDS``.

A bulk load into a store slower than its publishers pauses and resumes them
every few hundred milliseconds: the writer is "far behind" at 50,000
waiting ops and "caught up" at half of that (``StoreWriter``).  One line
per change was some 80 lines per 1M-message SQLite fill, and a user reading
the log saw a flood where one fact matters: publishers are being held back
by the disk, and how much.  So the first change after a quiet spell is
logged at once, the changes in the next ``QUIET_SECONDS`` are counted,
and one line then sums them up with the state the writer is in by then.
The pause itself is not delayed: ``MemoryAlarm.store_behind`` pauses and
resumes publishers at every change; ``mqserver_store_behind`` shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

log = Logger()

QUIET_SECONDS = 10.0


class BehindLog:
    """Told every change of the writer's state; writes the lines.

    ``state()`` gives (far behind now, publishing connections) when a
    summing-up line is written."""

    def __init__(self, clock: Any, state: Callable[[], tuple[bool, int]],
                 quiet: float = QUIET_SECONDS) -> None:
        self.clock = clock
        self.state = state
        self.quiet = quiet
        self.pauses = 0  # since the last line
        self.paused_seconds = 0.0  # of the time since the last line
        self._paused_at: float | None = None
        self._last: float | None = None  # when the last line was written
        self._due: Any = None  # the summing-up line's IDelayedCall

    def changed(self, waiting: bool, publishers: int) -> None:
        now = self.clock.seconds()
        if waiting:
            self.pauses += 1
            self._paused_at = now
        elif self._paused_at is not None:
            self.paused_seconds += now - self._paused_at
            self._paused_at = None
        if self._due is not None:
            return  # counted: the summing-up line says it
        if self._last is None or now - self._last >= self.quiet:
            log.info("storage writes {state}: {action} reading from {n} publishing connections",
                     state="far behind" if waiting else "caught up",
                     action="stopped" if waiting else "resumed", n=publishers)
            self._wrote(now)
        else:
            self._due = self.clock.callLater(self._last + self.quiet - now, self._sum_up)

    def _sum_up(self) -> None:
        self._due = None
        now = self.clock.seconds()
        waiting, publishers = self.state()
        since = now if self._last is None else self._last  # never None: a line came first
        paused = self.paused_seconds + (0.0 if self._paused_at is None else now - self._paused_at)
        log.info("storage writes {state}: publishers were paused {pauses} {times} in the last "
                 "{span:.0f} s, {paused:.1f} s in all; {action} from {n} publishing connections",
                 state="still far behind" if waiting else "caught up", pauses=self.pauses,
                 times="time" if self.pauses == 1 else "times",
                 span=now - since, paused=paused,
                 action="not reading" if waiting else "reading", n=publishers)
        self._wrote(now)

    def _wrote(self, now: float) -> None:
        self._last = now
        self.pauses = 0
        self.paused_seconds = 0.0
        if self._paused_at is not None:
            self._paused_at = now

    def stop(self) -> None:
        """Drop a summing-up line not yet due (the broker is stopping)."""
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None
