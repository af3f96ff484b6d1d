# -*- test-case-name: tests.unit.test_broker -*-
"""Connections and their consumers: opening, flow, subscribing, cancelling.

A mixin of ``Broker``, split out like ``Settling`` and ``Topology`` to keep
each module readable; it uses the broker's queues, journal, op writer and
dispatch kick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqserver.broker.leaving import journal_closed, journal_in_flight
from mqserver.broker.queue import Connection, Consumer, Slots
from mqserver.journal.schema import (
    CONNECTION_CLOSED,
    CONNECTION_OPENED,
    CONSUMER_OPENED,
    DELETED,
    REASON_CONSUMER_GONE,
    REQUEUED,
    SLIM_KIND,
)
from mqserver.model import REMOVE, REQUEUE, Message

if TYPE_CHECKING:
    from mqserver.broker.flow import MemoryAlarm


class Subscriptions:
    clock: Any
    journal: Any
    flow: MemoryAlarm
    connections: dict[int, Connection]
    _next_connection: int
    _journal_keys: int

    # -- connections --------------------------------------------------------

    def connection_opened(self, protocol: str, peer: str, sink: Any) -> Connection:
        connection = Connection(
            self._next_connection, protocol, peer, sink, self.clock.seconds()
        )
        self._next_connection += 1
        self.connections[connection.id] = connection
        if self.journal is not None:
            self.journal.note_protocol(protocol)
            self.journal.append((CONNECTION_OPENED, connection.opened_at, None, None, None, 0,
                                 None, connection.id, protocol, None, None, None, None, None))
        return connection

    def connection_closed(self, connection: Connection) -> None:
        for consumer in list(connection.consumers.values()):
            self.cancel(consumer)
        self.connections.pop(connection.id, None)
        self.flow.forget(connection.sink)
        if self.journal is not None:
            self.journal.append((CONNECTION_CLOSED, self.clock.seconds(), None, None, None, 0,
                                 None, connection.id, connection.protocol, None, None, None, None,
                                 None))

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
        # a multiple of 8: the journal's slim records carry it plus their tag
        self._journal_keys += SLIM_KIND + 1
        consumer.key = self._journal_keys
        consumer.tags = tuple(range(consumer.key, consumer.key + SLIM_KIND + 1))
        if slots is not None:
            slots.consumers.append(consumer)
        queue.consumers.append(consumer)
        connection.consumers[consumer_id] = consumer
        if self.journal is not None:
            # last: the key that slim delivered/acked records name this consumer by
            self.journal.append((CONSUMER_OPENED, self.clock.seconds(), queue.name, None, None, 0,
                                 consumer_id, connection.id, connection.protocol, None, None, None,
                                 None, consumer.key))
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
        if self.journal is not None:
            self._journal_cancel(consumer, unacked, requeue)
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

    def _journal_cancel(self, consumer: Consumer, unacked: list[Message], requeue: bool) -> None:
        now = self.clock.seconds()
        append = self.journal.append
        name = consumer.queue.name
        connection = consumer.connection
        if requeue:
            for message in unacked:
                # retry + 1 happens just after: these are the deliveries so far
                append((REQUEUED, now, name, message.id, message.created_at, message.retry + 1,
                        consumer.id, connection.id, connection.protocol, len(message.body),
                        message.expires_at, REASON_CONSUMER_GONE, None, consumer.key))
        else:  # dropped with their consumer: each copy's terminal record
            journal_in_flight(self.journal, DELETED, now, consumer, unacked,
                              REASON_CONSUMER_GONE)
        journal_closed(self.journal, now, consumer, None)
