# -*- test-case-name: tests.unit.test_broker -*-
"""The broker: publishing, dispatch, settling and queue lifecycle.

Everything runs on the reactor thread and changes memory at once; a durable
store gets the same changes as op tuples through ``StoreWriter``.  Dispatch is
pumped once per reactor turn over the queues that changed, in bounded
batches, so a publish burst becomes one write per consumer connection and a
huge backlog never blocks the reactor.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.broker.bindings import BindingIndex
from mqserver.broker.dispatch import by_priority, round_robin
from mqserver.broker.flow import MemoryAlarm
from mqserver.broker.moving import Mover, MoveResult
from mqserver.broker.overflow import Overflow
from mqserver.broker.publishing import Publishing
from mqserver.broker.queue import Connection, Queue
from mqserver.broker.ready import CHUNK, PACK_READY_AFTER, PackedReady
from mqserver.broker.resting import Resting
from mqserver.broker.settling import KEEP, MAX_RETRIES, Settling
from mqserver.broker.subscriptions import Subscriptions
from mqserver.broker.topology import Topology
from mqserver.broker.writer import StoreWriter
from mqserver.interfaces import IBroker, IMessageStore
from mqserver.model import DELETE, PUT, Message, Recovered
from mqserver.packed import Backlog

log = Logger()

# chunks a queue packs per reactor turn while it catches up (about 1 ms each)
CATCH_UP = 8

__all__ = ["KEEP", "MAX_RETRIES", "Broker"]


@implementer(IBroker)
class Broker(Publishing, Subscriptions, Topology, Settling, Overflow):
    def __init__(
        self, store: IMessageStore, clock: IReactorTime, dispatch_batch: int = 1024
    ) -> None:
        self.store = store
        self.clock = clock
        self.dispatch_batch = dispatch_batch
        # ready messages a queue keeps as objects before packing more (0: never)
        self.pack_ready_after = PACK_READY_AFTER
        # messages per packed chunk (small in the durability machine)
        self.pack_chunk = CHUNK
        # packed queues whose tail waits for the writer to let go (see _catch_up)
        self._lagging: set[Queue] = set()
        # messages of damaged snapshot chunks set aside (``withhold``)
        self.withheld = 0
        self._catch_up_call: Any = None
        self.queues: dict[bytes, Queue] = {}
        # packs backlogs nobody touches (started by the service: --pack-at-rest)
        self.resting = Resting(self)
        self.bindings = BindingIndex()
        self.connections: dict[int, Connection] = {}
        self.writer = StoreWriter(store, clock) if store.durable else None
        if self.writer is not None:
            self.writer.on_idle = self._writer_idle
        # the memory alarm: off until configured (see mqserver.broker.flow)
        self.flow = MemoryAlarm(clock)
        if self.writer is not None:
            # a store far behind pauses publishers as the memory alarm does
            self.writer.on_behind = self.flow.store_behind
        # mqserver.connlimits.ConnectionLimits of the listeners (set by makeService), for stats
        self.connection_limits: Any = None
        # the event journal (mqserver.journal.writer.Journal) or None: each
        # event point appends one small tuple, captured at that moment
        self.journal: Any = None
        self._next_connection = 1
        self._seq = 1
        # the last publish time, reused by publishes within the same millisecond
        self._now = -1.0
        # the last key handed out for the journal's slim records (consumers,
        # queue and protocol pairs): multiples of 8, see SLIM_KIND
        self._journal_keys = 0
        self._dirty: dict[bytes, Queue] = {}
        self._pump_call: Any = None
        # a protocol is handling a received chunk and pumps at its end (hold_pump)
        self._pump_held = False
        # when that chunk arrived, with the journal on: the time of its acks
        self._chunk_time = 0.0
        self._expiry: list[tuple[float, bytes]] = []
        self._mover = Mover(self)
        # durable records that are not messages (eMQP schedules, ...)
        self.records: dict[bytes, dict[bytes, bytes]] = {}
        # lifetime counters, for stats and MQKS _eval
        self.published = 0
        self.queued = 0
        self.delivered = 0
        self.unroutable = 0

    # -- start-up -----------------------------------------------------------

    def load(self, recovered: Recovered) -> None:
        """Rebuild state from what the store recovered (before anyone connects)."""
        now = self.clock.seconds()
        for rq in recovered.queues.values():
            queue = Queue(rq.name, rq.options, now)
            self.queues[rq.name] = queue
            self._apply_limits(queue)
            for event in rq.bindings:
                self.bindings.bind(rq.name, event)
            messages = rq.messages
            if not isinstance(messages, Backlog):  # a Backlog is in order, and packed
                messages = sorted(messages, key=_seq)
            for expires_at in queue.load(messages, self.pack_ready_after, self.pack_chunk,
                                         self._lagging, self.withhold):
                heapq.heappush(self._expiry, (expires_at, rq.name))
        self._seq = max(self._seq, recovered.next_seq)
        for namespace, values in recovered.records.items():
            self.records.setdefault(namespace, {}).update(values)

    def withhold(self, chunks: list[Any]) -> None:
        """Recovered chunks that cannot be read (``Chunk.check``: a snapshot's or a
        log replay's), already out of their queue: logged, and counted so that
        this process writes no snapshot at its stop.  Their messages are still
        in the store, which the next start then replays: nothing is lost, and
        nothing damaged is delivered."""
        for chunk in chunks:
            self.withheld += chunk.count
            log.error("{which} cannot be read ({why}); withheld until the next start, which "
                      "replays the store (no snapshot is written at this stop)",
                      which=chunk.describe(), why=chunk.check())

    def unchecked_chunks(self) -> list[Any]:
        """The recovered chunks not checked yet of every queue (``PackedReady.settle``)."""
        return [chunk for queue in self.queues.values() if isinstance(queue.ready, PackedReady)
                and queue.ready.unsettled for chunk in queue.ready.chunks if chunk.unchecked]

    def settle_recovered(self) -> None:
        """``PackedReady.settle`` every queue that has not yet: once its chunks were
        checked in a thread, a damaged one is reported now, not at its first read."""
        for queue in self.queues.values():
            if isinstance(queue.ready, PackedReady) and queue.ready.unsettled:
                queue.ready.settle()

    def _repack(self, queue: Queue) -> None:
        """``Queue.pack_ready`` with this broker's settings (once ``enqueued`` reaches
        ``queue.pack_check_at``)."""
        queue.pack_ready(self.pack_ready_after, self.pack_chunk, self._lagging)

    def pack_resting(self, queue: Queue, keep: int, most: int, hold: list[Message]) -> bool:
        """``Queue.pack_resting`` with this broker's chunks and writer: all but the
        first ``keep`` messages, up to ``most`` chunks; True if there is more
        (``Resting``)."""
        return queue.pack_resting(keep, most, hold, self.pack_chunk, self._lagging)

    def _writer_idle(self) -> None:
        if self._lagging and self._catch_up_call is None:
            self._catch_up_call = self.clock.callLater(0, self._catch_up)

    def _catch_up(self) -> None:
        """Pack what packed queues left as objects while the writer held it.

        A burst into a durable store leaves its newest messages in the tail
        of ``PackedReady`` (packing waits for the writer: see ``_pack``
        there); once the writer is idle they are packed here, a few chunks per
        queue per reactor turn, so a backlog that stopped growing is not left
        at three times the memory.
        """
        self._catch_up_call = None
        # the same set throughout: each PackedReady adds its queue to it
        # (``on_lag``) when the writer holds its tail again
        lagging = list(self._lagging)
        self._lagging.clear()
        more = False
        for queue in lagging:
            ready = queue.ready
            if not queue.deleted and isinstance(ready, PackedReady) and ready.catch_up(CATCH_UP):
                self._lagging.add(queue)
                more = True
        if more:
            self._catch_up_call = self.clock.callLater(0, self._catch_up)

    def durable(self) -> Deferred[None]:
        return self.writer.wait() if self.writer is not None else succeed(None)

    def move(self, source: bytes, target: bytes, limit: int | None = None,
             keep_dead_letter_headers: bool = False) -> Deferred[MoveResult]:
        """Move ready messages between queues (see ``mqserver.broker.moving``)."""
        return self._mover.move(source, target, limit, keep_dead_letter_headers)

    def _op(self, op: tuple[Any, ...]) -> None:
        if self.writer is not None:
            self.writer.add(op)

    def put_record(self, namespace: bytes, key: bytes, value: bytes) -> None:
        """Keep a non-message record (durably, with a durable store)."""
        self.records.setdefault(namespace, {})[key] = value
        self._op((PUT, namespace, key, value))

    def delete_record(self, namespace: bytes, key: bytes) -> None:
        if self.records.get(namespace, {}).pop(key, None) is not None:
            self._op((DELETE, namespace, key))

    # -- dispatch -----------------------------------------------------------

    def _kick(self, queue: Queue) -> None:
        if queue.ready and queue.consumers:
            self._dirty[queue.name] = queue
            if self._pump_call is None and not self._pump_held:
                self._pump_call = self.clock.callLater(0, self._pump)

    def hold_pump(self) -> None:
        """A protocol starts on a received chunk and calls ``pump_now`` at its end.

        Until then what the chunk makes ready waits for that call instead of
        a timer: at a low rate, where every message is a chunk of its own,
        that is a ``callLater`` made and cancelled per message saved.  With
        the journal on, the chunk's acks are journaled at the time it arrived
        (a clock read per chunk instead of per ack).
        """
        self._pump_held = True
        if self.journal is not None:
            self._chunk_time = self.clock.seconds()

    def pump_now(self) -> None:
        """Dispatch what was made ready since the last pump now, not at the next reactor turn.

        A protocol calls it at the end of each received chunk: at a low rate
        every message is a turn of its own, and dispatching in the turn that
        published (or acked) it saves a timer and a reactor iteration per
        message.  A pipelined chunk still dispatches once for all its lines,
        and the pump stays bounded (``dispatch_batch`` per queue; the rest
        goes to the next turn), so a backlog never blocks the reactor.
        """
        self._pump_held = False
        call = self._pump_call
        if call is not None:
            call.cancel()
            self._pump()
        elif self._dirty:
            self._pump()

    def _pump(self) -> None:
        self._pump_call = None
        dirty, self._dirty = self._dirty, {}
        now = self.clock.seconds()
        for queue in dirty.values():
            try:
                dispatch = by_priority if queue.weighted else round_robin
                if not queue.deleted and dispatch(self, queue, now):
                    self._dirty[queue.name] = queue
            except Exception:
                log.failure("dispatch failed for queue {queue!r}", queue=queue.name)
        if self._dirty:
            self._pump_call = self.clock.callLater(0, self._pump)

    def _restore(self, queue: Queue, messages: Iterable[Message]) -> None:
        """Messages back to ready at their original place, with their expiry watched."""
        queue.restore(messages)
        for message in messages:
            if message.expires_at is not None:
                heapq.heappush(self._expiry, (message.expires_at, queue.name))
        self._kick(queue)

    def count_delivered(self, queue: Queue, sent: int) -> None:
        queue.delivered += sent
        self.delivered += sent

    # -- stats --------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(queue.in_flight() for queue in self.queues.values())

    def ready_count(self) -> int:
        return sum(len(queue.ready) for queue in self.queues.values())

    def consumer_count(self) -> int:
        return sum(len(queue.consumers) for queue in self.queues.values())


def _seq(message: Message) -> int:
    return message.seq
