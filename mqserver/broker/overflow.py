# -*- test-case-name: tests.unit.test_overflow -*-
"""Queue length limits and what happens to a publish that would pass one.

A queue's ``max_length`` and ``overflow`` options override the server-wide
defaults (``--max-queue-length``, ``--overflow``); ``None`` means "use the
default".  The effective pair is cached on the ``Queue`` (``limit``,
``reject``) whenever options or defaults change, so publishing reads two
attributes instead of resolving options per message.

Policies (the names RabbitMQ uses):

- ``drop-head``: the publish is accepted and the oldest ready message is
  dropped, dead-lettered (reason ``maxlen``) if the queue has a target.
- ``reject-publish``: the publish is refused with ``QueueFullError`` before
  anything changed; an event routed to several queues goes to none of them
  if any is full, so a refusal means "nothing was stored" for every protocol.

Only ready messages count, as in RabbitMQ: deliveries in flight, requeues
and dead-letter copies are never refused (refusing them would lose
messages the broker already took responsibility for).
"""

from __future__ import annotations

from collections.abc import Iterable

from mqserver.broker.queue import Queue

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
OVERFLOW_POLICIES = (DROP_HEAD, REJECT_PUBLISH)


class QueueFullError(Exception):
    """A publish was refused: the queue is at its max-length with ``reject-publish``.

    ``stored``: for a run of publishes, how many of them went in before the
    refused one (the rest were not published).
    """

    def __init__(self, queue: bytes, limit: int) -> None:
        super().__init__(
            f"queue {queue.decode('utf-8', 'replace')!r} is full ({limit} ready messages, "
            "overflow reject-publish)"
        )
        self.queue = queue
        self.limit = limit
        self.stored = 0


def check_policy(value: str) -> str:
    """Validates ``--overflow`` (and the HTTP field) while it is parsed."""
    if value not in OVERFLOW_POLICIES:
        raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}, not {value!r}")
    return value


check_policy.coerceDoc = "One of drop-head, reject-publish."  # type: ignore[attr-defined]


class Overflow:
    """Mixed into ``Broker``: server-wide defaults and the publish-time check."""

    queues: dict[bytes, Queue]
    max_queue_length: int | None = None
    overflow: str = DROP_HEAD
    # how many queues currently refuse publishes when full: zero keeps the
    # check off the publish path entirely
    rejecting = 0

    def set_limits(self, max_queue_length: int | None, overflow: str = DROP_HEAD) -> None:
        """Change the server-wide defaults; every queue without its own picks them up."""
        self.max_queue_length = max_queue_length or None
        self.overflow = check_policy(overflow)
        for queue in self.queues.values():
            self._apply_limits(queue)

    def _apply_limits(self, queue: Queue) -> None:
        """Recompute a queue's effective limit after its options (or the defaults) changed."""
        options = queue.options
        limit = options.max_length if options.max_length is not None else self.max_queue_length
        reject = limit is not None and (options.overflow or self.overflow) == REJECT_PUBLISH
        if reject != queue.reject:
            self.rejecting += 1 if reject else -1
        queue.limit = limit
        queue.reject = reject

    def _forget_limits(self, queue: Queue) -> None:
        """A deleted queue no longer counts among the rejecting ones."""
        if queue.reject:
            self.rejecting -= 1
            queue.reject = False
        queue.limit = None

    def check_room(self, names: Iterable[bytes]) -> None:
        """Raise ``QueueFullError`` if any of these queues refuses another message."""
        queues = self.queues
        for name in names:
            queue = queues.get(name)
            if queue is not None and queue.reject and len(queue.ready) >= queue.limit:  # type: ignore[operator]
                queue.refused += 1
                raise QueueFullError(name, queue.limit)  # type: ignore[arg-type]
