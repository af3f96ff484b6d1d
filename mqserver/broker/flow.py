# -*- test-case-name: tests.unit.test_flow -*-
"""The server-wide memory alarm: stop reading from publishers until memory drops.

Like RabbitMQ's memory alarm.  A ``LoopingCall`` measures the process's
resident memory (RSS, from ``/proc/self/statm``: one small read, no walk
over the broker's objects) every ``interval`` seconds.  RSS is what the
operating system and an OOM killer see, and it covers everything the broker
holds: message bodies in queues and in flight, transport buffers, journal
and storage batches.  A count of queued body bytes would miss the buffers
and Python's per-object overhead, which for small messages is most of it.

At or above ``high`` bytes the alarm goes on: every connection that has
published (``IFlowControlled`` providers registered with ``publishing``) is
told to stop reading, and one that publishes for the first time while the
alarm is on is stopped at once.  Consumers keep reading, so acks still
drain queues.  Below ``low`` bytes the alarm goes off and reading resumes.

The same pause holds while a durable store's writer is far behind
(``store_behind``, set by the broker): a publisher faster than the disk
would otherwise pile its messages up in the writer's backlog, as objects
that cannot be packed until written, without bound.

Freed memory does not always go back to the operating system (glibc keeps
freed chunks in its arenas), so while the alarm is on each check first asks
glibc to return what it can (``malloc_trim``); otherwise a drained broker
could stay in alarm forever.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.broker.behind_log import BehindLog
from mqserver.giveback import malloc_trim

log = Logger()

LOW_RATIO = 0.9
"""The alarm goes off below this share of the high-water mark."""


def rss_bytes() -> int:
    """This process's resident set size, or 0 where ``/proc`` is missing."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
"""Where a container's memory limit is (cgroup v2, then v1)."""


def physical_memory(cgroup_limits: tuple[str, ...] = CGROUP_LIMITS) -> int:
    """Bytes of RAM the process may use: the machine's, or its cgroup's limit if lower.

    A fraction of the host's RAM would put the alarm above a container's
    limit, where the OOM killer acts first.  0 if the platform does not say.
    """
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        ram = 0
    for path in cgroup_limits:
        try:
            with open(path, "rb") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (ram or int(text) + 1):
            return int(text)
    return ram


def parse_watermark(value: str) -> float:
    """``--memory-high-watermark``: a fraction of RAM (0 < x <= 1), bytes, or KiB/MiB/GiB.

    0 turns the alarm off.  Returns the number as given; ``watermark_bytes``
    resolves a fraction against the machine's RAM.
    """
    text = value.strip()
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "k": 1024, "m": 1024**2, "g": 1024**3}
    for suffix, factor in sorted(units.items(), key=lambda item: -len(item[0])):
        if text.lower().endswith(suffix):
            number = float(text[: -len(suffix)])
            if number < 0:
                break
            return number * factor
    else:
        number = float(text)
        if number >= 0:
            return number
    raise ValueError(f"a memory high-water mark must not be negative: {value!r}")


parse_watermark.coerceDoc = (  # type: ignore[attr-defined]
    "A fraction of RAM (e.g. 0.4), bytes, or a number with KiB/MiB/GiB; 0: off."
)


def watermark_bytes(value: float, ram: int | None = None) -> int | None:
    """The high-water mark in bytes, or None for no alarm (0, or a fraction of unknown RAM)."""
    if value <= 0:
        return None
    if value <= 1:
        ram = physical_memory() if ram is None else ram
        return int(value * ram) or None
    return int(value)


class MemoryAlarm:
    """Watches memory and pauses publishers; ``broker.flow`` (off until ``configure``)."""

    def __init__(self, clock: Any, measure: Callable[[], int] = rss_bytes) -> None:
        self.clock = clock
        self.measure = measure
        self.high: int | None = None
        self.low: int | None = None
        self.active = False
        # the store's writer is far behind (see the module docstring)
        self.store_waiting = False
        self.behind_log = BehindLog(clock, lambda: (self.store_waiting, len(self.publishers)))
        self.used = 0
        self.alarms = 0
        # weak: a connection that went away without saying so is simply forgotten
        self.publishers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._trim = malloc_trim()
        self._loop: LoopingCall | None = None

    def configure(self, high: int | None, interval: float = 1.0) -> None:
        """Set the high-water mark in bytes (None: off) and how often to measure."""
        self.high = high
        self.low = int(high * LOW_RATIO) if high is not None else None
        self.interval = interval

    def start(self) -> None:
        if self.high is None or self._loop is not None:
            return
        self._loop = LoopingCall(self.check)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        self.behind_log.stop()

    @property
    def paused(self) -> bool:
        """Publishers are not read: the memory alarm is on, or the store is far behind."""
        return self.active or self.store_waiting

    def store_behind(self, waiting: bool) -> None:
        """The store's writer is (no longer) far behind: stop (resume) reading publishers."""
        if waiting == self.store_waiting:
            return
        was = self.paused
        self.store_waiting = waiting
        self.behind_log.changed(waiting, len(self.publishers))
        if self.paused != was:
            self._pause_all(self.paused)

    def publishing(self, publisher: Any) -> None:
        """``publisher`` (an ``IFlowControlled``) publishes; paused at once while ``paused``.

        Call it once per connection: a ``WeakSet`` membership test costs far
        more than an attribute test on the caller's side.
        """
        if publisher not in self.publishers:
            self.publishers.add(publisher)
            if self.paused:
                publisher.pause_reading()

    def forget(self, publisher: Any) -> None:
        self.publishers.discard(publisher)

    def check(self) -> None:
        """One measurement; never raises (a LoopingCall that raises stops for good)."""
        try:
            if self.active and self._trim is not None:
                self._trim()
            self.used = self.measure()
            if not self.active and self.high is not None and self.used >= self.high:
                self._set(True)
            elif self.active and (self.low is None or self.used < self.low):
                self._set(False)
        except Exception:
            log.failure("memory check failed; it runs again next interval")

    def _set(self, active: bool) -> None:
        was = self.paused
        self.active = active
        publishers = list(self.publishers)
        if active:
            self.alarms += 1
            log.warn(
                "memory alarm: {used} bytes in use >= high-water mark {high}; "
                "stopped reading from {n} publishing connections",
                used=self.used, high=self.high, n=len(publishers),
            )
        else:
            log.info(
                "memory alarm cleared: {used} bytes in use < {low}; "
                "resumed reading from {n} publishing connections",
                used=self.used, low=self.low, n=len(publishers),
            )
        if self.paused != was:
            self._pause_all(self.paused)

    def _pause_all(self, pause: bool) -> None:
        for publisher in list(self.publishers):
            try:
                if pause:
                    publisher.pause_reading()
                else:
                    publisher.resume_reading()
            except Exception:
                log.failure("memory alarm: pausing or resuming {p!r} failed", p=publisher)
