# -*- test-case-name: tests.unit.test_broker -*-
"""The broker's records: queues, consumers and client connections."""

from __future__ import annotations

import sys
from bisect import insort
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from mqserver.broker.ready import CHUNK, PackedReady, take_expired
from mqserver.model import Message, QueueOptions
from mqserver.packed import Backlog, Chunk, expiries


class Queue:
    """FIFO of ready messages plus the consumers that drain it.

    In-flight messages are held by their consumer (``Consumer.unacked``), not
    here: settling is always done through a consumer.  Counters only ever
    grow; rates are differences between two reads.

    ``ready`` is a plain deque until it holds more than ``--pack-ready-after``
    messages, then a ``PackedReady`` (see mqserver.broker.ready) until it is
    small again.  Both offer the same operations; ``pack_ready`` is the only
    place where the two swap.
    """

    __slots__ = (
        "acked",
        "consumers",
        "created_at",
        "dead_lettered",
        "deleted",
        "delivered",
        "enqueued",
        "expired",
        "expiry_hint",
        "journal_tags",
        "limit",
        "moved",
        "name",
        "options",
        "pack_check_at",
        "ready",
        "refused",
        "reject",
        "rejected",
        "requeued",
        "rr",
        "rr_by_priority",
        "ttl_ready",
        "unused_timer",
        "weighted",
    )

    def __init__(self, name: bytes, options: QueueOptions, created_at: float) -> None:
        self.name = name
        self.options = options
        self.created_at = created_at
        self.ready: deque[Message] | PackedReady = deque()
        # Broker._append calls pack_ready once enqueued reaches it: comparing
        # two small ints per publish costs half what a len() does, which
        # allocates one (0: the first publish sets it from the threshold)
        self.pack_check_at = 0
        self.consumers: list[Consumer] = []
        self.rr = 0
        self.rr_by_priority: dict[int, int] = {}
        # consumers with priorities or shared slots: dispatch by priority
        self.weighted = False
        # ready messages carrying an expiry; lets the TTL sweep skip queues
        self.ttl_ready = 0
        # its newest entry in the broker's expiry heap, until the sweep pops one
        self.expiry_hint: tuple[float, bytes] | None = None
        self.unused_timer: Any = None
        # publishing protocol -> the first value of its plain published
        # records in the journal (see Broker._journal_tag)
        self.journal_tags: dict[str | None, int] = {}
        self.deleted = False
        self.enqueued = self.delivered = self.acked = self.rejected = 0
        self.requeued = self.expired = self.dead_lettered = 0
        # ready messages an operator moved to another queue (mqserver.broker.moving)
        self.moved = 0
        # effective max-length and overflow policy (see mqserver.broker.limits)
        self.limit: int | None = options.max_length
        self.reject = False
        self.refused = 0

    def restore(self, messages: Iterable[Message]) -> None:
        """Put messages back where their seq says they belong.

        The common case (all older than the head, e.g. a disconnect returning
        what was delivered first) is O(k) at the left end; anything else falls
        back to an ordered insert.
        """
        ready = self.ready
        for message in sorted(messages, key=_seq, reverse=True):
            if message.expires_at is not None:
                self.ttl_ready += 1
            if not ready or message.seq < ready[0].seq:
                ready.appendleft(message)
            elif message.seq > ready[-1].seq:
                ready.append(message)
            else:
                insort(ready, message, key=_seq)

    def load(self, messages: list[Message] | Backlog, threshold: int, chunk: int = CHUNK,
             lagging: set[Queue] | None = None,
             withheld: Callable[[list[Chunk]], object] | None = None) -> list[float]:
        """Take a recovered backlog (in seq order) into this new, empty queue.

        Past ``threshold`` (``--pack-ready-after``) it stays packed: a store's
        ``Backlog`` as its chunks are, a list packed here, as live publishing
        would have packed it; a restart must not hold a big backlog as a
        million objects where the broker before it held chunks.  Returns the
        messages' expiry times, for the broker's sweep.  Snapshot chunks that
        cannot be read go to ``withheld`` (``PackedReady.settle``): when
        this queue unpacks them, or once it first reads one when packed.
        """
        small = not 0 < threshold < len(messages)
        if small and isinstance(messages, Backlog):
            damaged = messages.settle()
            if damaged and withheld is not None:
                withheld(damaged)
        times = expiries(messages)
        self.ttl_ready += len(times)
        if small:
            self.ready = deque(messages)
        elif isinstance(messages, Backlog):
            self.ready = PackedReady.of_backlog(messages, chunk, _lag(self, lagging), withheld)
        else:
            self.ready = PackedReady.of(list(messages), threshold, chunk, _lag(self, lagging))
        return times

    def pack_ready(self, threshold: int, chunk: int = CHUNK,
                   lagging: set[Queue] | None = None) -> None:
        """Swap ``ready`` to or from its packed form (``Broker._append`` calls it
        once ``enqueued`` reaches ``pack_check_at``).

        ``threshold`` (``--pack-ready-after``, 0 or less: never) is the most
        ready messages kept as objects; ``chunk`` messages go to a chunk; the
        queue joins ``lagging`` when packing waits for a durable store's
        writer to let go of messages (``PackedReady.catch_up``).  Back to a
        deque once no chunk is left and the queue is within it again: a
        deque's append and popleft are a good deal cheaper than a Python
        method, and small queues are the hot path.  The next check is due
        when publishes alone could take a deque past the threshold (requeues
        and restores may add a few more before it), or while packed after
        ``chunk`` publishes, to see whether it can swap back.
        """
        threshold = threshold if threshold > 0 else sys.maxsize
        ready = self.ready
        if isinstance(ready, PackedReady):
            if not ready.chunks and len(ready) <= threshold:
                self.ready = ready.unpacked()
        elif len(ready) > threshold:
            self.ready = PackedReady(ready, chunk, _lag(self, lagging))
        if isinstance(self.ready, PackedReady):
            self.pack_check_at = self.enqueued + chunk
        else:
            self.pack_check_at = self.enqueued + max(1, threshold + 1 - len(self.ready))

    def pack_resting(self, keep: int, most: int, hold: list[Message], chunk: int = CHUNK,
                     lagging: set[Queue] | None = None) -> bool:
        """Pack up to ``most`` chunks of a backlog at rest, all but its first ``keep``
        messages, then its tail, the packed ones added to ``hold``
        (``PackedReady.pack_head``, ``pack_tail``, ``mqserver.broker.resting``);
        True if there is more to pack.

        A deque becomes a ``PackedReady`` first, as ``pack_ready`` would make
        it past the threshold; it swaps back as usual once drained.
        """
        ready = self.ready
        if not isinstance(ready, PackedReady):
            if len(ready) < keep + chunk:
                return False
            ready = self.ready = PackedReady(ready, chunk, _lag(self, lagging))
            self.pack_check_at = self.enqueued + chunk
        return ready.pack_head(keep, most, hold) or ready.pack_tail(most, hold)

    def take_expired(self, now: float) -> list[Message]:
        """Remove and return the ready messages whose TTL has passed at ``now``."""
        ready = self.ready
        if isinstance(ready, PackedReady):
            expired = ready.take_expired(now)
        else:
            expired = take_expired(ready, now)
        self.ttl_ready -= len(expired)
        return expired

    def in_flight(self) -> int:
        return sum(len(consumer.unacked) for consumer in self.consumers)

    def oldest_ready_age(self, now: float) -> float:
        return now - self.ready[0].created_at if self.ready else 0.0

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} ready={len(self.ready)} consumers={len(self.consumers)}>"


def _seq(message: Message) -> int:
    return message.seq


def _lag(queue: Queue, lagging: set[Queue] | None) -> Any:
    return None if lagging is None else partial(lagging.add, queue)


class Consumer:
    """A subscription of one connection to one queue.

    ``window`` caps unacked deliveries (None: unlimited).  ``unacked`` keeps
    delivery order, which is the order messages go back in.
    """

    __slots__ = (
        "acked",
        "active",
        "connection",
        "delivered",
        "id",
        "key",
        "manual_ack",
        "paused",
        "priority",
        "queue",
        "sink",
        "slots",
        "tags",
        "unacked",
        "window",
    )

    def __init__(
        self,
        id: bytes,
        queue: Queue,
        connection: Connection,
        window: int | None,
        manual_ack: bool,
        priority: int = 0,
        slots: Slots | None = None,
    ) -> None:
        self.id = id
        # names the consumer in the journal's slim records: a small int set by
        # the broker, cheaper to marshal than id(self); ``tags[kind]`` is
        # ``key + kind``, made once (past 256, each sum would be a new int)
        self.key = 0
        self.tags: tuple[int, ...] = ()
        self.priority = priority
        self.slots = slots
        self.queue = queue
        self.connection = connection
        self.sink = connection.sink
        self.window = window
        self.manual_ack = manual_ack
        self.unacked: dict[bytes, Message] = {}
        self.paused = connection.paused
        self.active = True
        self.delivered = self.acked = 0

    def has_credit(self) -> bool:
        return (
            not self.paused
            and (self.window is None or len(self.unacked) < self.window)
            and (self.slots is None or self.slots.free > 0)
        )

    def __repr__(self) -> str:
        return f"<Consumer {self.id!r} on {self.queue.name!r} unacked={len(self.unacked)}>"


class Slots:
    """Credit shared by several consumers: an eMQP worker's READY count across its queues."""

    __slots__ = ("consumers", "free")

    def __init__(self, free: int = 0) -> None:
        self.free = free
        self.consumers: list[Consumer] = []

    def __repr__(self) -> str:
        return f"<Slots free={self.free} consumers={len(self.consumers)}>"


class Connection:
    """One client connection, whatever its protocol."""

    __slots__ = ("consumers", "id", "opened_at", "paused", "peer", "protocol", "sink")

    def __init__(self, id: int, protocol: str, peer: str, sink: Any, opened_at: float) -> None:
        self.id = id
        self.protocol = protocol
        self.peer = peer
        self.sink = sink
        self.opened_at = opened_at
        self.paused = False
        self.consumers: dict[bytes, Consumer] = {}

    def __repr__(self) -> str:
        return f"<Connection {self.id} {self.protocol} {self.peer}>"
