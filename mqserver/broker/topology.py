# -*- test-case-name: tests.unit.test_broker -*-
"""Queues and bindings: declaring, reconfiguring, deleting, auto-deleting.

A mixin of ``Broker``, split out to keep each module readable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mqserver.broker.bindings import BindingIndex, mask_regex
from mqserver.broker.leaving import journal_closed, journal_in_flight, journal_ready
from mqserver.broker.queue import Queue
from mqserver.broker.settling import KEEP
from mqserver.journal.schema import (
    DELETED,
    PUBLISHER_KEY,
    PURGED,
    REASON_QUEUE_DELETED,
    REASON_UNUSED,
    SLIM_PUBLISHED_PLAIN,
)
from mqserver.model import (
    BIND,
    DECLARE,
    DELETE_QUEUE,
    REMOVE,
    UNBIND,
    QueueOptions,
)

if TYPE_CHECKING:
    from mqserver.broker.queue import Consumer



class Topology:
    queues: dict[bytes, Queue]
    bindings: BindingIndex
    clock: Any
    journal: Any
    _dirty: dict[bytes, Queue]

    # -- queues and bindings ------------------------------------------------

    def declare_queue(self, name: bytes, options: QueueOptions | None = None) -> Queue:
        """The queue called ``name``, created (with ``options``) if it is new."""
        queue = self.queues.get(name)
        if queue is None:
            queue = Queue(name, options or QueueOptions(), self.clock.seconds())
            self.queues[name] = queue
            self._apply_limits(queue)
            self._op((DECLARE, name, queue.options))
        elif options is not None and options != queue.options:
            self._set_options(queue, options)
        return queue

    def _set_options(self, queue: Queue, options: QueueOptions) -> None:
        queue.options = options
        self._apply_limits(queue)
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

    def delete_queue(self, name: bytes, reason: str = REASON_QUEUE_DELETED) -> bool:
        """Drop a queue, its bindings, messages and consumers.  False if unknown.

        Consumers are told (``queue_changed``) after the queue lost its
        bindings and options, then removed; their unacked messages go too.
        The journal gets a ``deleted`` record (with ``reason``) for each copy,
        in flight or ready, and a ``consumer_closed`` for each consumer.
        """
        queue = self.queues.pop(name, None)
        self.bindings.unbind_all(name)
        self._dirty.pop(name, None)
        if queue is None:
            return False
        queue.deleted = True
        if self.journal is not None:
            now = self.clock.seconds()
            for tag in queue.journal_tags.values():  # the journal forgets their keys
                self.journal.append((PUBLISHER_KEY, now, None, None, None, 0, None, None, None,
                                     None, None, None, None, tag - SLIM_PUBLISHED_PLAIN))
        queue.options = QueueOptions()
        self._forget_limits(queue)
        if queue.unused_timer is not None:
            queue.unused_timer.cancel()
            queue.unused_timer = None
        consumers, queue.consumers = queue.consumers, []
        for consumer in consumers:
            consumer.sink.queue_changed(consumer)
            consumer.active = False
            if self.journal is not None:
                journal_in_flight(self.journal, DELETED, now, consumer,
                                  consumer.unacked.values(), reason)
                journal_closed(self.journal, now, consumer, reason)
            consumer.unacked.clear()
            consumer.connection.consumers.pop(consumer.id, None)
        if self.journal is not None:
            journal_ready(self.journal, DELETED, now, name, queue.ready, reason)
        queue.ready.clear()
        self._op((DELETE_QUEUE, name))
        return True

    def purge(self, name: bytes) -> int:
        """Drop a queue's ready messages; returns how many."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        count = len(queue.ready)
        if self.journal is not None:
            journal_ready(self.journal, PURGED, self.clock.seconds(), name, queue.ready, None)
        if self.writer is not None:
            for message in queue.ready:
                self.writer.add((REMOVE, name, message.seq))
        queue.ready.clear()
        queue.ttl_ready = 0
        return count

    def _unused(self, queue: Queue) -> None:
        delay = queue.options.delete_when_unused
        if delay is None:
            return
        if delay <= 0:
            self.delete_queue(queue.name, REASON_UNUSED)
        else:
            queue.unused_timer = self.clock.callLater(delay, self._delete_if_unused, queue)

    def _delete_if_unused(self, queue: Queue) -> None:
        queue.unused_timer = None
        if not queue.consumers and self.queues.get(queue.name) is queue:
            self.delete_queue(queue.name, REASON_UNUSED)
