# -*- test-case-name: tests.unit.test_resting -*-
"""Pack a ready backlog at rest: all of it, not only what came past ``--pack-ready-after``.

A queue keeps its first ``--pack-ready-after`` ready messages (250,000 by
default) as ``Message`` objects, about 350 bytes each, because packing them
as they come and unpacking them as they go would cost a publish-then-drain
burst about 1 us per message.  A backlog that nobody publishes to or drains
gains nothing from them, though: packed, they cost about 125 bytes.

``Resting`` looks at every queue once per interval (``--pack-at-rest``, a
``LoopingCall`` on the broker's clock).  A queue holding at least ``least``
ready messages, through which fewer than ``quiet`` messages went (published,
delivered or requeued) since the previous look, is at rest: its head is
packed but for its first chunk, ``SLICE`` chunks per reactor turn (about
0.5 ms each), so the reactor never stalls on a million messages.  A burst is
never touched (it moves far more than ``quiet`` messages in an interval),
and a slow consumer unpacks one chunk per ``CHUNK`` messages it takes.

Once a queue is packed the memory goes back to the system (``give_back``:
a full collection, ``malloc_trim``).  Packing changes nothing a client or
a store can see: the same messages in
the same order (``mqserver.durability.broker_state`` is equal before and
after), and no store op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqserver.atrest import SliceLoop
from mqserver.broker.ready import CHUNK
from mqserver.giveback import give_back

if TYPE_CHECKING:
    from mqserver.broker.core import Broker
    from mqserver.broker.queue import Queue
    from mqserver.model import Message

SLICE = 8
"""Chunks packed per reactor turn (about 0.5 ms each)."""
LEAST = 4 * CHUNK
"""Ready messages a queue must hold to be packed at rest: a smaller one costs
less than a megabyte as objects."""
QUIET = CHUNK
"""Fewer messages than this through a queue in an interval, and it is at rest."""


class Resting:
    """Finds backlogs at rest each interval and packs them a slice per reactor turn.

    ``least``, ``keep``, ``quiet`` and ``slice`` are attributes so tests and the
    durability machine can make them small; how a queue packs is the
    broker's (``Broker.pack_resting``: its chunk size, its writer).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.least = LEAST
        self.keep = CHUNK  # messages left as objects at the head
        self.quiet = QUIET
        self.slice = SLICE
        # what each large queue had moved at the previous look
        self._marks: dict[Queue, int] = {}
        # queues found at rest, packed from the first; a slice is due while any is left
        self._packing: list[Queue] = []
        # what the first of them packed so far, let go of once it is done
        # (see PackedReady.pack_head: freed together, their memory goes back)
        self._held: list[Message] = []
        self._loop = SliceLoop(broker.clock, self._look, self.pack_slice, self._abandon,
                               "ready backlogs at rest", "packing a ready backlog at rest")

    def start(self, interval: float) -> None:
        """Look every ``interval`` seconds (0 or less: never)."""
        self._loop.start(interval)

    def stop(self) -> None:
        self._loop.stop()
        self._abandon()

    def look(self) -> None:
        """Find the queues at rest and start packing them (errors are logged, and the
        next interval looks again)."""
        self._loop.look()

    def _abandon(self) -> None:
        self._packing.clear()
        self._held.clear()

    def _look(self) -> bool:
        """Mark each large queue's traffic, and queue up those that moved less than ``quiet``.

        The marks are updated in place, and a mark that did not move keeps
        its object: a look at rest makes nothing that lives on (a new dict
        or count each second would land in whatever arena pymalloc offers
        then, one of those the packing is about to empty).
        """
        least, quiet, marks = self.least, self.quiet, self._marks
        large = 0
        for queue in self.broker.queues.values():
            if len(queue.ready) < least:
                continue
            large += 1
            moved = queue.enqueued + queue.delivered + queue.requeued
            before = marks.get(queue)
            if before != moved:
                marks[queue] = moved
            if before is not None and moved - before < quiet and queue not in self._packing:
                self._packing.append(queue)
        if len(marks) > large:
            queues = self.broker.queues
            for gone in [queue for queue in marks
                         if queues.get(queue.name) is not queue or len(queue.ready) < least]:
                del marks[gone]
        return bool(self._packing)

    def pack_slice(self) -> bool:
        """Pack one slice of the first queue found at rest; True while more are due."""
        packing = self._packing
        if not packing:
            return False
        queue = packing[0]
        broker = self.broker
        if queue.deleted or not broker.pack_resting(queue, self.keep, self.slice, self._held):
            packing.pop(0)
            if self._held:
                self._held.clear()
                give_back()
        return bool(packing)
