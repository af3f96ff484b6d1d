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

from mqserver.broker.bindings import BindingIndex, mask_regex
from mqserver.broker.dispatch import by_priority, round_robin
from mqserver.broker.queue import Connection, Consumer, Queue, Slots
from mqserver.broker.writer import StoreWriter
from mqserver.interfaces import IBroker, IMessageStore
from mqserver.model import (
    BIND,
    DECLARE,
    DELETE,
    DELETE_QUEUE,
    ENQUEUE,
    PUT,
    REMOVE,
    REQUEUE,
    UNBIND,
    Message,
    QueueOptions,
    Recovered,
)

log = Logger()

MAX_RETRIES = "x-max-retries"
"""Message header: redeliveries allowed before the message is dead-lettered."""

KEEP: Any = object()
"""Marker for 'leave this setting as it is'."""


@implementer(IBroker)
class Broker:
    def __init__(
        self, store: IMessageStore, clock: IReactorTime, dispatch_batch: int = 1024
    ) -> None:
        self.store = store
        self.clock = clock
        self.dispatch_batch = dispatch_batch
        self.queues: dict[bytes, Queue] = {}
        self.bindings = BindingIndex()
        self.connections: dict[int, Connection] = {}
        self.writer = StoreWriter(store, clock) if store.durable else None
        self._next_connection = 1
        self._seq = 1
        self._dirty: dict[bytes, Queue] = {}
        self._pump_call: Any = None
        self._expiry: list[tuple[float, bytes]] = []
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
            for event in rq.bindings:
                self.bindings.bind(rq.name, event)
            queue.restore(rq.messages)
            for message in rq.messages:
                if message.expires_at is not None:
                    heapq.heappush(self._expiry, (message.expires_at, rq.name))
        self._seq = max(self._seq, recovered.next_seq)
        for namespace, values in recovered.records.items():
            self.records.setdefault(namespace, {}).update(values)

    def durable(self) -> Deferred[None]:
        return self.writer.wait() if self.writer is not None else succeed(None)

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

    # -- connections --------------------------------------------------------

    def connection_opened(self, protocol: str, peer: str, sink: Any) -> Connection:
        connection = Connection(
            self._next_connection, protocol, peer, sink, self.clock.seconds()
        )
        self._next_connection += 1
        self.connections[connection.id] = connection
        return connection

    def connection_closed(self, connection: Connection) -> None:
        for consumer in list(connection.consumers.values()):
            self.cancel(consumer)
        self.connections.pop(connection.id, None)

    def pause(self, connection: Connection) -> None:
        """The client's transport is full: stop delivering to it."""
        connection.paused = True
        for consumer in connection.consumers.values():
            consumer.paused = True

    def resume(self, connection: Connection) -> None:
        connection.paused = False
        for consumer in connection.consumers.values():
            consumer.paused = False
            self._kick(consumer.queue)

    # -- queues and bindings ------------------------------------------------

    def declare_queue(self, name: bytes, options: QueueOptions | None = None) -> Queue:
        """The queue called ``name``, created (with ``options``) if it is new."""
        queue = self.queues.get(name)
        if queue is None:
            queue = Queue(name, options or QueueOptions(), self.clock.seconds())
            self.queues[name] = queue
            self._op((DECLARE, name, queue.options))
        elif options is not None and options != queue.options:
            self._set_options(queue, options)
        return queue

    def _set_options(self, queue: Queue, options: QueueOptions) -> None:
        queue.options = options
        self._op((DECLARE, queue.name, options))
        if queue.consumers and queue.unused_timer is not None:
            queue.unused_timer.cancel()
            queue.unused_timer = None

    def reconfigure(
        self,
        name: bytes,
        replace: Iterable[bytes] | None = None,
        remove: Iterable[bytes] = (),
        remove_masks: Iterable[bytes] = (),
        add: Iterable[bytes] = (),
        options: QueueOptions = KEEP,
        notify_except: Consumer | None = None,
    ) -> bool:
        """Change a queue's bindings and options; tell its consumers if anything changed.

        Binding changes apply in the order replace, remove, remove by mask,
        add, whatever order the caller listed them in.  Masks remove only
        bound events that contain a dot.  Returns whether anything changed.
        """
        queue = self.declare_queue(name)
        old = self.bindings.events_of(name)
        new = set(replace) if replace else set(old)
        new.difference_update(remove)
        masks = list(remove_masks)
        if masks and new:
            regex = mask_regex(masks)
            new.difference_update([e for e in new if b"." in e and regex.match(e)])
        new.update(add)
        for event in sorted(old - new):
            self.bindings.unbind(name, event)
            self._op((UNBIND, name, event))
        for event in sorted(new - old):
            self.bindings.bind(name, event)
            self._op((BIND, name, event))
        changed = new != old
        if options is not KEEP and options != queue.options:
            self._set_options(queue, options)
            changed = True
        if changed:
            for consumer in list(queue.consumers):
                if consumer is not notify_except:
                    consumer.sink.queue_changed(consumer)
        return changed

    def delete_queue(self, name: bytes) -> bool:
        """Drop a queue, its bindings, messages and consumers.  False if unknown.

        Consumers are told (``queue_changed``) after the queue lost its
        bindings and options, then removed; their unacked messages go too.
        """
        queue = self.queues.pop(name, None)
        self.bindings.unbind_all(name)
        self._dirty.pop(name, None)
        if queue is None:
            return False
        queue.deleted = True
        queue.options = QueueOptions()
        if queue.unused_timer is not None:
            queue.unused_timer.cancel()
            queue.unused_timer = None
        consumers, queue.consumers = queue.consumers, []
        for consumer in consumers:
            consumer.sink.queue_changed(consumer)
            consumer.active = False
            consumer.unacked.clear()
            consumer.connection.consumers.pop(consumer.id, None)
        queue.ready.clear()
        self._op((DELETE_QUEUE, name))
        return True

    def purge(self, name: bytes) -> int:
        """Drop a queue's ready messages; returns how many."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        count = len(queue.ready)
        if self.writer is not None:
            for message in queue.ready:
                self.writer.add((REMOVE, name, message.seq))
        queue.ready.clear()
        queue.ttl_ready = 0
        return count

    # -- publishing ---------------------------------------------------------

    def publish_event(
        self,
        event: bytes,
        message_id: bytes,
        body: bytes,
        headers: dict[str, str] | None = None,
        ttl: float | None = None,
        source: str | None = None,
    ) -> int:
        self.published += 1
        names = self.bindings.route(event)
        if not names:
            self.unroutable += 1
            return 0
        now = self.clock.seconds()
        queues = self.queues
        for name in names:
            queue = queues.get(name)
            if queue is None:
                queue = self.declare_queue(name)
            self._enqueue(queue, message_id, body, event, headers, ttl, source, now)
        return len(names)

    def publish_to_queue(
        self,
        name: bytes,
        message_id: bytes,
        body: bytes,
        headers: dict[str, str] | None = None,
        ttl: float | None = None,
        source: str | None = None,
    ) -> Message:
        self.published += 1
        queue = self.queues.get(name) or self.declare_queue(name)
        return self._enqueue(
            queue, message_id, body, None, headers, ttl, source, self.clock.seconds()
        )

    def _enqueue(
        self,
        queue: Queue,
        message_id: bytes,
        body: bytes,
        event: bytes | None,
        headers: dict[str, str] | None,
        ttl: float | None,
        source: str | None,
        now: float,
    ) -> Message:
        if ttl is None:
            ttl = queue.options.default_ttl
        expires_at = now + ttl if ttl else None
        message = Message(
            message_id, queue.name, body, self._seq, event, headers, now, expires_at, 0, source
        )
        self._seq += 1
        self._append(queue, message)
        self.queued += 1
        queue.enqueued += 1
        limit = queue.options.max_length
        if limit is not None and len(queue.ready) > limit:
            oldest = queue.ready.popleft()
            if oldest.expires_at is not None:
                queue.ttl_ready -= 1
            self._discard(queue, oldest, b"maxlen")
        return message

    def _append(self, queue: Queue, message: Message) -> None:
        """Put a new (or newly sequenced) message at the tail and record it."""
        queue.ready.append(message)
        if message.expires_at is not None:
            queue.ttl_ready += 1
            heapq.heappush(self._expiry, (message.expires_at, queue.name))
        self._op((ENQUEUE, message))
        if queue.consumers:
            self._kick(queue)

    # -- consumers ----------------------------------------------------------

    def consume(
        self,
        connection: Connection,
        consumer_id: bytes,
        queue_name: bytes,
        window: int | None = None,
        manual_ack: bool = True,
        priority: int = 0,
        slots: Slots | None = None,
    ) -> Consumer:
        """Start a consumer; an existing one with the same id on the connection is replaced.

        ``priority`` (eMQP worker weight): consumers of a higher priority with
        credit are served first.  ``slots``: credit shared by several consumers
        (one eMQP worker on several queues), spent one per delivery and given
        back with ``add_slots``.
        """
        old = connection.consumers.get(consumer_id)
        if old is not None:
            self.cancel(old)
        queue = self.declare_queue(queue_name)
        if priority or slots is not None:
            queue.weighted = True
        if queue.unused_timer is not None:
            queue.unused_timer.cancel()
            queue.unused_timer = None
        consumer = Consumer(consumer_id, queue, connection, window, manual_ack, priority, slots)
        if slots is not None:
            slots.consumers.append(consumer)
        queue.consumers.append(consumer)
        connection.consumers[consumer_id] = consumer
        self._kick(queue)
        return consumer

    def add_slots(self, slots: Slots, count: int = 1) -> None:
        """Give shared credit back (an eMQP READY) and dispatch to it."""
        slots.free += count
        for consumer in slots.consumers:
            self._kick(consumer.queue)

    def set_window(self, consumer: Consumer, window: int | None) -> None:
        consumer.window = window
        self._kick(consumer.queue)

    def cancel(self, consumer: Consumer, requeue: bool = True) -> None:
        """Remove a consumer; its unacked messages return (retry + 1) in their original order."""
        if not consumer.active:
            return
        consumer.active = False
        queue = consumer.queue
        if consumer.slots is not None and consumer in consumer.slots.consumers:
            consumer.slots.consumers.remove(consumer)
        if consumer.connection.consumers.get(consumer.id) is consumer:
            del consumer.connection.consumers[consumer.id]
        consumers = queue.consumers
        index = consumers.index(consumer)
        del consumers[index]
        if index < queue.rr:
            queue.rr -= 1
        unacked = list(consumer.unacked.values())
        consumer.unacked.clear()
        if requeue and unacked:
            for message in unacked:
                message.retry += 1
            unacked = self._within_retry_limit(queue, unacked)
            for message in unacked:
                self._op((REQUEUE, message, message.seq))
            queue.requeued += len(unacked)
            self._restore(queue, unacked)
        elif unacked:
            for message in unacked:
                self._op((REMOVE, queue.name, message.seq))
        if not consumers and not queue.deleted:
            self._unused(queue)

    def _unused(self, queue: Queue) -> None:
        delay = queue.options.delete_when_unused
        if delay is None:
            return
        if delay <= 0:
            self.delete_queue(queue.name)
        else:
            queue.unused_timer = self.clock.callLater(delay, self._delete_if_unused, queue)

    def _delete_if_unused(self, queue: Queue) -> None:
        queue.unused_timer = None
        if not queue.consumers and self.queues.get(queue.name) is queue:
            self.delete_queue(queue.name)

    # -- settling -----------------------------------------------------------

    def ack(self, consumer: Consumer, message_id: bytes) -> bool:
        message = consumer.unacked.pop(message_id, None)
        if message is None:
            return False
        queue = consumer.queue
        consumer.acked += 1
        queue.acked += 1
        self._op((REMOVE, queue.name, message.seq))
        self._kick(queue)
        return True

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
        old_seq = message.seq
        message.seq = self._seq
        self._seq += 1
        message.retry += 1
        if not self._within_retry_limit(queue, (message,)):
            self._kick(queue)
            return True
        if ttl is not KEEP:
            message.expires_at = self.clock.seconds() + ttl if ttl else None
        queue.rejected += 1
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
        self._discard(consumer.queue, message, reason)
        if consumer.window is not None:
            self._kick(consumer.queue)
        return True

    def _discard(self, queue: Queue, message: Message, reason: bytes) -> None:
        """Remove a message for good: to the dead-letter target if there is one."""
        self._op((REMOVE, queue.name, message.seq))
        target = queue.options.dead_letter
        if reason == b"expired":
            queue.expired += 1
        else:
            queue.dead_lettered += 1
        if target is None or target == queue.name:
            return
        target_queue = self.queues.get(target) or self.declare_queue(target)
        headers = dict(message.headers or {})
        headers["x-dead-letter-reason"] = reason.decode("ascii", "replace")
        headers["x-dead-letter-queue"] = queue.name.decode("utf-8", "replace")
        copy = message.copy_to(target, self._seq)
        self._seq += 1
        copy.headers = headers
        copy.expires_at = None
        self._append(target_queue, copy)
        target_queue.enqueued += 1

    # -- dispatch -----------------------------------------------------------

    def _kick(self, queue: Queue) -> None:
        if queue.ready and queue.consumers:
            self._dirty[queue.name] = queue
            if self._pump_call is None:
                self._pump_call = self.clock.callLater(0, self._pump)

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

    # -- timers -------------------------------------------------------------

    def expire_due(self) -> int:
        """Remove ready messages whose TTL has passed; returns how many."""
        now = self.clock.seconds()
        heap = self._expiry
        due: set[bytes] = set()
        while heap and heap[0][0] <= now:
            due.add(heapq.heappop(heap)[1])
        removed = 0
        for name in due:
            queue = self.queues.get(name)
            if queue is None or not queue.ttl_ready:
                continue
            keep = []
            expired = []
            for message in queue.ready:
                if message.expires_at is not None and message.expires_at <= now:
                    expired.append(message)
                else:
                    keep.append(message)
            if expired:
                queue.ready.clear()
                queue.ready.extend(keep)
                queue.ttl_ready -= len(expired)
                for message in expired:
                    self._discard(queue, message, b"expired")
                removed += len(expired)
        return removed

    # -- stats --------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(queue.in_flight() for queue in self.queues.values())

    def ready_count(self) -> int:
        return sum(len(queue.ready) for queue in self.queues.values())

    def consumer_count(self) -> int:
        return sum(len(queue.consumers) for queue in self.queues.values())
