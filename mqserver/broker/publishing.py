# -*- test-case-name: tests.unit.test_publishing -*-
"""Publishing: one message or a run of them, into the queues an event routes to or one queue.

A mixin of ``Broker``, like ``Settling``.  A protocol that parsed several
publishes of one client in one received chunk hands them over as a run
(``publish_event_run``, ``publish_to_queue_run``): the event is routed, the
clock read, the options looked up and the queues kicked once for all of
them, which is most of what a publish costs besides the message itself.  A
run stores exactly what the same publishes one by one would, in the same
order; only their time is the run's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mqserver.broker.overflow import QueueFullError
from mqserver.journal.schema import (
    PUBLISHER_KEY,
    SLIM_KIND,
    SLIM_PUBLISHED,
    SLIM_PUBLISHED_PLAIN,
)
from mqserver.model import ENQUEUE, Message

if TYPE_CHECKING:
    from mqserver.broker.bindings import BindingIndex
    from mqserver.broker.queue import Queue

Entries = Sequence[tuple[bytes, bytes]]
"""A run's messages: ``(message_id, body)`` pairs, in order."""


class Publishing:
    queues: dict[bytes, Queue]
    bindings: BindingIndex
    clock: Any
    journal: Any
    writer: Any
    rejecting: int
    published: int
    queued: int
    unroutable: int
    _seq: int
    _now: float
    _journal_keys: int
    declare_queue: Callable[..., Queue]
    check_room: Callable[..., None]
    _discard: Callable[..., None]
    _watch_expiry: Callable[..., None]
    _kick: Callable[[Queue], None]
    _repack: Callable[[Queue], None]

    def publish_event(
        self,
        event: bytes,
        message_id: bytes,
        body: bytes,
        headers: dict[str, str] | None = None,
        ttl: float | None = None,
        source: str | None = None,
    ) -> int:
        return self.publish_event_run(event, ((message_id, body),), headers, ttl, source)

    def publish_event_run(
        self,
        event: bytes,
        entries: Entries,
        headers: dict[str, str] | None = None,
        ttl: float | None = None,
        source: str | None = None,
    ) -> int:
        if self.rejecting and len(entries) > 1:
            return _one_by_one(self.publish_event, event, entries, headers, ttl, source)
        self.published += len(entries)
        names = self.bindings.route(event)
        if not names:
            self.unroutable += len(entries)
            return 0
        if self.rejecting:
            self.check_room(names)
        event = self.bindings.interned.get(event, event)  # one shared bytes per event name
        queues = self.queues
        targets = []
        for name in names:
            targets.append(queues.get(name) or self.declare_queue(name))
        self._enqueue(targets, entries, event, headers, ttl, source, self.clock.seconds())
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
        return self.publish_to_queue_run(name, ((message_id, body),), headers, ttl, source)

    def publish_to_queue_run(
        self,
        name: bytes,
        entries: Entries,
        headers: dict[str, str] | None = None,
        ttl: float | None = None,
        source: str | None = None,
    ) -> Message:
        queue = self.queues.get(name) or self.declare_queue(name)
        if queue.reject and len(entries) > 1:
            return _one_by_one(self.publish_to_queue, name, entries, headers, ttl, source)
        self.published += len(entries)
        if queue.reject:
            self.check_room((name,))
        return self._enqueue((queue,), entries, None, headers, ttl, source, self.clock.seconds())

    def _enqueue(
        self,
        queues: Sequence[Queue],
        entries: Entries,
        event: bytes | None,
        headers: dict[str, str] | None,
        ttl: float | None,
        source: str | None,
        now: float,
    ) -> Message:
        """Each entry, in order, into each of ``queues``; returns the last message made.

        The one loop every publish goes through, written for that: what
        ``_append`` does is inline here.
        """
        if 0.0 <= now - self._now < 50e-6:
            # messages within 50 us share one float (32 bytes less each); the
            # journal's publish times, and so its latencies, are that exact
            now = self._now
        else:
            self._now = now
        journal, writer = self.journal, self.writer
        # what each queue's messages share, worked out once per run
        plans = []
        for queue in queues:
            queue_ttl = ttl if ttl is not None else queue.options.default_ttl
            expires_at = now + queue_ttl if queue_ttl else None
            tag = None
            if journal is not None and expires_at is None and headers is None \
                    and not journal.bodies:
                tag = queue.journal_tags.get(source) or self._journal_tag(queue, source)
            plans.append((queue, queue.name, queue.limit, expires_at, tag))
        message: Any = None
        for message_id, body in entries:
            for queue, name, limit, expires_at, tag in plans:
                message = Message(
                    message_id, name, body, self._seq, event, headers, now, expires_at, 0, source
                )
                self._seq += 1
                if journal is not None:
                    if tag is not None:
                        journal.append((tag, now, message_id, len(body)))
                    else:
                        journal.append((SLIM_PUBLISHED, now, name, message_id,
                                        journal.sources.get(source, source), len(body),
                                        expires_at, headers, journal.bodies and body))
                # queue.ready read each time: pack_ready may swap it within a run
                queue.ready.append(message)
                if queue.enqueued >= queue.pack_check_at:  # see Queue.pack_ready
                    self._repack(queue)
                if expires_at is not None:
                    queue.ttl_ready += 1
                    self._watch_expiry(queue, message)
                if writer is not None:
                    writer.add((ENQUEUE, message))
                queue.enqueued += 1
                if limit is not None and len(queue.ready) > limit:
                    oldest = queue.ready.popleft()
                    if oldest.expires_at is not None:
                        queue.ttl_ready -= 1
                    self._discard(queue, oldest, b"maxlen")
        self.queued += len(entries) * len(queues)
        for queue in queues:
            if queue.consumers:
                self._kick(queue)
        if writer is not None and len(writer.ops) > writer.behind_at and not writer.is_behind:
            writer.behind()  # stop reading publishers until the store catches up
        return message

    def _journal_tag(self, queue: Queue, source: str | None) -> int:
        """A key for the plain published records of ``source`` into ``queue``,
        announced to the journal: two values less in each of those records."""
        self._journal_keys += SLIM_KIND + 1
        key = self._journal_keys
        self.journal.append((PUBLISHER_KEY, self.clock.seconds(), queue.name, None, None, 0,
                             None, None, self.journal.sources.get(source, source), None, None,
                             None, None, key))
        tag = queue.journal_tags[source] = key + SLIM_PUBLISHED_PLAIN
        return tag

    def _append(self, queue: Queue, message: Message) -> None:
        """Put a dead-letter copy at the tail and record it.

        Its ENQUEUE is glued to the op before it, the REMOVE from the queue
        it left: a batch cut between them would lose the message from both
        queues at a crash.  (New publishes go through ``_enqueue``.)
        """
        queue.ready.append(message)
        if queue.enqueued >= queue.pack_check_at:  # see Queue.pack_ready
            self._repack(queue)
        if message.expires_at is not None:
            queue.ttl_ready += 1
            self._watch_expiry(queue, message)
        if self.writer is not None:
            self.writer.add_with_previous((ENQUEUE, message))
        if queue.consumers:
            self._kick(queue)


def _one_by_one(publish: Callable[..., Any], target: bytes, entries: Entries,
                headers: dict[str, str] | None, ttl: float | None, source: str | None) -> Any:
    """A run into a queue that may refuse (reject-publish): one publish at a
    time, so a refusal stores nothing after it; ``QueueFullError.stored`` says
    how many went in before it."""
    result = None
    for stored, (message_id, body) in enumerate(entries):
        try:
            result = publish(target, message_id, body, headers, ttl, source)
        except QueueFullError as e:
            e.stored = stored
            raise
    return result
