# -*- test-case-name: tests.unit.test_log_rest -*-
"""The log index of a backlog at rest, archived as runs (``log_seq_index``) instead of a dict.

``SeqIndex`` keeps a queue's newest 262,144 entries in its dict (about 110
bytes each: the entry, an int key, a 128-bit location int) because a remove
there is a C dict's pop, where the runs take a Python call: moving them
earlier cost W3 about 17 % (a 200,000-message backlog published, then acked).
A backlog nobody publishes to or acks gains nothing from the dict, though.

``IndexAtRest`` looks at the index once per interval (a ``LoopingCall`` on
the store's clock): a queue whose dict holds at least ``least`` entries and
changed by fewer than ``quiet`` since the previous look is at rest, and its
dict goes to the runs ``SLICE`` entries per reactor turn (a few ms), so the
reactor never stalls on a million entries.  It runs on the reactor thread,
as every index update does, and never while a compaction runs.  Nothing on
disk changes: only where the index keeps what it knows.  Once every queue
at rest is moved the memory goes back to the system (``give_back``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqserver.atrest import SliceLoop
from mqserver.giveback import give_back
from mqserver.storage.log_index import LogIndex

SLICE = 16_384
"""Entries moved per reactor turn (about 5 ms)."""
LEAST = 4096
"""Dict entries a queue must hold to be moved at rest (less than half a megabyte)."""
QUIET = 256
"""A dict that changed by fewer entries than this in an interval is at rest."""
LOOKS_PER_PACK = 4
"""Looks per interval of the broker's packing at rest (``--pack-at-rest``, 1 s):
a quarter second apart, so a backlog's index is archived 0.25-0.5 s after its
last write, and the checkpoint that follows (``Checkpointer.rested``) is what
a crash restart walks from; at 1 s apart it came 1-2 s after, and a crash
in between walked up to ``ARCHIVE_AT`` records from the last one (0.5 s).
A look is a ``len`` per queue."""


class IndexAtRest:
    """Finds a ``LogIndex``'s queues at rest each interval and archives them a slice per turn.

    ``index`` gives the store's current index (recovery replaces it) and
    ``busy`` tells when to keep out of the way (a compaction running, the
    store closing).
    """

    def __init__(self, clock: Any, index: Callable[[], LogIndex],
                 busy: Callable[[], bool], rested: Callable[[], object] = lambda: None) -> None:
        self.clock = clock
        self.index = index
        self.busy = busy
        self.rested = rested  # every queue at rest is archived (the store's checkpoint)
        self.least = LEAST
        self.quiet = QUIET
        self.slice = SLICE
        # queue -> its dict's size at the previous look
        self._marks: dict[bytes, int] = {}
        # queues found at rest, moved from the first
        self._moving: list[bytes] = []
        self._loop = SliceLoop(clock, self._look, self.move_slice, self._moving.clear,
                               "a log index at rest", "moving a log index at rest")

    def start(self, interval: float) -> None:
        """Look every ``interval`` seconds (0 or less: never)."""
        self._loop.start(interval)

    def stop(self) -> None:
        self._loop.stop()
        self._moving.clear()

    def look(self) -> None:
        """Find the queues at rest and start moving them (errors are logged, and the
        next interval looks again)."""
        self._loop.look()

    def _look(self) -> bool:
        previous, marks = self._marks, {}
        for queue, by_seq in self.index().messages.items():
            size = len(by_seq)
            if size < self.least:
                continue
            marks[queue] = size
            before = previous.get(queue)
            if before is not None and abs(size - before) < self.quiet \
                    and queue not in self._moving:
                self._moving.append(queue)
        self._marks = marks
        return bool(self._moving)

    def move_slice(self) -> bool:
        """Archive one slice of the first queue found at rest; True while more are due."""
        moving = self._moving
        if self.busy():
            moving.clear()  # found again at a later look
            return False
        if moving:
            by_seq = self.index().messages.get(moving[0])
            if by_seq is not None:
                by_seq.archive_oldest(self.slice)
            if not by_seq:  # all archived, or the queue is gone
                moving.pop(0)
                if not moving:
                    give_back()
                    self.rested()
        return bool(moving)
