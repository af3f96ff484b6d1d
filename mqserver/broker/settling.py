# -*- test-case-name: tests.unit.test_broker -*-
"""Settling deliveries: ack, reject, dead-letter, and TTL expiry.

A mixin of ``Broker``: split out to keep each module readable; it uses the
broker's queues, seq counter, op writer and dispatch kick.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mqserver.journal.schema import (
    DEAD_LETTERED,
    EXPIRED,
    PUBLISHED,
    REASON_REJECTED,
    REQUEUED,
    SLIM_ACKED,
)
from mqserver.model import (
    REMOVE,
    REQUEUE,
    Message,
)

if TYPE_CHECKING:
    from mqserver.broker.queue import Consumer, Queue

MAX_RETRIES = "x-max-retries"
"""Message header: redeliveries allowed before the message is dead-lettered."""

KEEP: Any = object()
"""Marker for 'leave this setting as it is'."""


class Settling:
    queues: dict[bytes, Queue]
    clock: Any
    _seq: int
    _expiry: list[tuple[float, bytes]]
    journal: Any
    writer: Any
    _pump_held: bool
    _chunk_time: float

    # -- settling -----------------------------------------------------------

    def ack(self, consumer: Consumer, message_id: bytes) -> bool:
        message = consumer.unacked.pop(message_id, None)
        if message is None:
            return False
        queue = consumer.queue
        consumer.acked += 1
        queue.acked += 1
        journal = self.journal
        if journal is not None:
            # slim: the journal knows the rest from the delivery; acks in one
            # received chunk share its time (see hold_pump)
            append = journal.append  # see Journal.append: read once, then called
            append((consumer.tags[SLIM_ACKED],
                    self._chunk_time if self._pump_held else self.clock.seconds(), message_id))
        if self.writer is not None:  # the hot path skips _op's call without a durable store
            self.writer.add((REMOVE, queue.name, message.seq))
        self._kick(queue)
        return True

    def ack_run(self, consumer: Consumer, message_ids: Iterable[bytes]) -> int:
        """``ack`` of each of ``message_ids`` in turn; how many the consumer held.

        What a protocol calls for consecutive acks of one consumer in one
        received chunk (issue 8).  The queue, the journal's tag and time and
        the store's writer are looked up once, and the queue is kicked once
        at the end instead of per ack: a kick only looks at the queue's
        ready messages and consumers, which acks leave as they were.  The
        records, ops and counters are those of the single acks; only the
        time of the journal's records, outside a held chunk, is the run's.
        """
        pop = consumer.unacked.pop
        queue = consumer.queue
        journal = self.journal
        writer = self.writer
        settled = 0
        try:
            if journal is None and writer is None:  # the memory store's hot path
                for message_id in message_ids:
                    if pop(message_id, None) is not None:
                        settled += 1
                return settled
            append = tag = now = None
            if journal is not None:
                append = journal.append  # see Journal.append: read once, then called
                tag = consumer.tags[SLIM_ACKED]
                now = self._chunk_time if self._pump_held else self.clock.seconds()
            add = writer.add if writer is not None else None
            name = queue.name
            for message_id in message_ids:
                message = pop(message_id, None)
                if message is None:
                    continue
                settled += 1
                if append is not None:
                    append((tag, now, message_id))
                if add is not None:
                    add((REMOVE, name, message.seq))
            return settled
        finally:
            # in a finally: should a store's op fail, what was settled is counted
            if settled:
                consumer.acked += settled
                queue.acked += settled
                self._kick(queue)

    def settle_sent(self, consumer: Consumer, message: Message, now: float) -> None:
        """Ack a delivery its sink settled as it sent it (``IDeliverySink.deliver``).

        Called by dispatch, so without ``ack``'s kick: the queue's pump is
        running, and a kick would only schedule one more that finds nothing.
        """
        del consumer.unacked[message.id]
        queue = consumer.queue
        consumer.acked += 1
        queue.acked += 1
        if self.journal is not None:
            self.journal.append((consumer.tags[SLIM_ACKED], now, message.id))
        if self.writer is not None:
            self.writer.add((REMOVE, queue.name, message.seq))

    def ack_any(self, queue_name: bytes, message_id: bytes) -> bool:
        """Ack a delivery of ``queue_name`` whichever consumer holds it (PHPMQ 004)."""
        queue = self.queues.get(queue_name)
        if queue is None:
            return False
        for consumer in queue.consumers:
            if message_id in consumer.unacked:
                return self.ack(consumer, message_id)
        return False

    def ack_all(self, consumer: Consumer) -> int:
        ids = list(consumer.unacked)
        for message_id in ids:
            self.ack(consumer, message_id)
        return len(ids)

    def reject(self, consumer: Consumer, message_id: bytes, ttl: float | None = KEEP) -> bool:
        """Back to the tail with retry + 1 (and, if given, a new TTL; 0 or None: none)."""
        message = consumer.unacked.pop(message_id, None)
        if message is None:
            return False
        queue = consumer.queue
        message.retry += 1
        # decided before the message gets its new seq: a discard's REMOVE
        # must name the seq the store holds it under
        if not self._within_retry_limit(queue, (message,)):
            self._kick(queue)
            return True
        old_seq = message.seq
        message.seq = self._seq
        self._seq += 1
        if ttl is not KEEP:
            message.expires_at = self.clock.seconds() + ttl if ttl else None
        queue.rejected += 1
        if self.journal is not None:
            connection = consumer.connection
            self.journal.append((REQUEUED, self.clock.seconds(), queue.name, message.id,
                                 message.created_at, message.retry, consumer.id, connection.id,
                                 connection.protocol, len(message.body), message.expires_at,
                                 REASON_REJECTED, None, consumer.key))
        queue.ready.append(message)
        if message.expires_at is not None:
            queue.ttl_ready += 1
            heapq.heappush(self._expiry, (message.expires_at, queue.name))
        self._op((REQUEUE, message, old_seq))
        self._kick(queue)
        return True

    def _within_retry_limit(self, queue: Queue, messages: Iterable[Message]) -> list[Message]:
        """Dead-letter messages redelivered more often than their ``x-max-retries`` allows."""
        keep = []
        for message in messages:
            headers = message.headers
            limit = headers.get(MAX_RETRIES) if headers else None
            if limit is not None and message.retry > int(limit):
                self._discard(queue, message, b"retries")
            else:
                keep.append(message)
        return keep

    def reject_all(self, consumer: Consumer) -> int:
        ids = list(consumer.unacked)
        for message_id in ids:
            self.reject(consumer, message_id)
        return len(ids)

    def dead_letter(self, consumer: Consumer, message_id: bytes, reason: bytes) -> bool:
        message = consumer.unacked.pop(message_id, None)
        if message is None:
            return False
        self._discard(consumer.queue, message, reason, in_flight=True)
        if consumer.window is not None:
            self._kick(consumer.queue)
        return True

    def _discard(
        self, queue: Queue, message: Message, reason: bytes, in_flight: bool = False
    ) -> None:
        """Remove a message for good: to the dead-letter target if there is one.

        ``in_flight``: it was delivered and not returned, so the journal's
        delivery count is one more than its retries.
        """
        target = queue.options.dead_letter
        if target == queue.name:
            target = None
        # the target is declared (a DECLARE op) before the REMOVE, so that
        # the REMOVE and the copy's ENQUEUE are adjacent and glued (_append)
        target_queue = None if target is None else (
            self.queues.get(target) or self.declare_queue(target))
        self._op((REMOVE, queue.name, message.seq))
        if reason == b"expired":
            queue.expired += 1
        else:
            queue.dead_lettered += 1
        journal = self.journal
        if journal is not None:
            now = self.clock.seconds()
            journal.append((EXPIRED if reason == b"expired" else DEAD_LETTERED, now, queue.name,
                            message.id, message.created_at, message.retry + in_flight, None, None,
                            message.source, len(message.body), message.expires_at, reason, None,
                            None))
        if target_queue is None:
            return
        headers = dict(message.headers or {})
        headers["x-dead-letter-reason"] = reason.decode("ascii", "replace")
        headers["x-dead-letter-queue"] = queue.name.decode("utf-8", "replace")
        copy = message.copy_to(target, self._seq)
        self._seq += 1
        copy.headers = headers
        copy.expires_at = None
        if journal is not None:
            journal.append((PUBLISHED, now, target, copy.id, copy.created_at, 0, None, None,
                            copy.source, len(copy.body), None, reason, headers,
                            journal.bodies and copy.body))
        self._append(target_queue, copy)
        target_queue.enqueued += 1

    # -- timers -------------------------------------------------------------

    def _watch_expiry(self, queue: Queue, message: Message) -> None:
        """Have the TTL sweep visit ``queue`` when ``message`` expires.

        The sweep scans a whole queue, so a burst into one queue with one
        expiry (one TTL, a publish time shared within a millisecond) needs one
        heap entry, and its messages share one float: about 100 bytes less
        per message.  Popping an entry forgets the queue's hint, so a message
        is never left without an entry to wake the sweep.
        """
        hint = queue.expiry_hint
        if hint is not None and message.expires_at == hint[0]:
            message.expires_at = hint[0]
        else:
            queue.expiry_hint = hint = (message.expires_at, queue.name)
            heapq.heappush(self._expiry, hint)

    def expire_due(self) -> int:
        """Remove ready messages whose TTL has passed; returns how many."""
        now = self.clock.seconds()
        heap = self._expiry
        due: set[bytes] = set()
        while heap and heap[0][0] <= now:
            name = heapq.heappop(heap)[1]
            due.add(name)
            if name in self.queues:
                self.queues[name].expiry_hint = None
        removed = 0
        for name in due:
            queue = self.queues.get(name)
            if queue is None or not queue.ttl_ready:
                continue
            expired = queue.take_expired(now)
            for message in expired:
                self._discard(queue, message, b"expired")
            removed += len(expired)
        return removed
