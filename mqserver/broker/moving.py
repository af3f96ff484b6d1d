# -*- test-case-name: tests.unit.test_moving -*-
"""Moving ready messages from one queue to another: an operator's replay.

The common case is a dead-letter queue replayed into its source after the
consumer's bug was fixed.  A moved message keeps its id, body, headers,
event, publisher and publish time; its retry count starts again at 0, and
the two headers the broker added when it dead-lettered it
(``x-dead-letter-reason``, ``x-dead-letter-queue``) are dropped unless the
caller keeps them: after the replay the message is again what its publisher
sent, and a consumer that treats those headers as "this one failed before"
would treat the replay as a failure too.  A later dead-lettering writes
them afresh.

Only ready messages move, oldest first; deliveries in flight stay with
their consumers.  A move never drops a message: it stops at the target's
``max_length`` whatever its overflow policy, and says so.

Durability: for each message the ENQUEUE into the target and the REMOVE
from the source are glued into one store batch
(``StoreWriter.add_with_previous``), and a store applies a batch
atomically, so a crash at any point of a long move (which spans batches)
leaves every message in exactly one of the two queues.  The journal gets a
``moved`` record in the source (the copy left it) and a ``published``
record in the target with reason ``moved`` (a copy arrived), so each
queue's balance holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqserver.journal.schema import MOVED, PUBLISHED, REASON_MOVED
from mqserver.model import ENQUEUE, REMOVE, Message

if TYPE_CHECKING:
    from mqserver.broker.core import Broker
    from mqserver.broker.queue import Queue

DEAD_LETTER_HEADERS = ("x-dead-letter-reason", "x-dead-letter-queue")
"""The headers ``Settling._discard`` adds to a dead-letter copy."""

TARGET_FULL = "target full"


@dataclass(frozen=True)
class MoveResult:
    """What a move did: how many moved, and why it stopped short of what was asked."""

    moved: int
    left: int
    """Ready messages still in the source afterwards."""
    stopped: str | None = None
    """None, or ``TARGET_FULL``: the target reached its ``max_length``."""


class MoveError(ValueError):
    """A move that cannot start: an unknown queue, or a queue onto itself."""


class Mover:
    """Moves messages between the queues of the broker it is handed.

    Reads the broker's queues, seq counter, writer and journal at the moment
    of each move (the journal is attached after the broker is made).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def move(self, source: bytes, target: bytes, limit: int | None = None,
             keep_dead_letter_headers: bool = False) -> MoveResult:
        """Move the oldest ``limit`` (None: all) ready messages of ``source`` to ``target``.

        Both queues must exist: a typo in the target would otherwise hide
        the messages in a queue nobody reads.

        :raises MoveError: a queue does not exist, or they are the same.
        """
        broker = self.broker
        if source == target:
            raise MoveError("a queue cannot be moved onto itself")
        from_queue = broker.queues.get(source)
        to_queue = broker.queues.get(target)
        for name, queue in ((source, from_queue), (target, to_queue)):
            if queue is None:
                raise MoveError(f"no queue {name.decode('utf-8', 'replace')!r}")
        assert from_queue is not None and to_queue is not None
        # counted before the first message moves: a move into a queue whose
        # dead-letter target is the source must not chase its own tail
        count = len(from_queue.ready) if limit is None else min(limit, len(from_queue.ready))
        stopped = None
        if to_queue.limit is not None:
            room = max(0, to_queue.limit - len(to_queue.ready))
            if room < count:
                count, stopped = room, TARGET_FULL
        for _ in range(count):
            self._move_one(from_queue, to_queue, keep_dead_letter_headers)
        from_queue.moved += count
        if count:
            broker._kick(to_queue)
        return MoveResult(count, len(from_queue.ready), stopped)

    def _move_one(self, source: Queue, target: Queue, keep_headers: bool) -> None:
        broker = self.broker
        message = source.ready.popleft()
        if message.expires_at is not None:
            source.ttl_ready -= 1
        headers = message.headers
        if headers and not keep_headers and any(h in headers for h in DEAD_LETTER_HEADERS):
            headers = {k: v for k, v in headers.items() if k not in DEAD_LETTER_HEADERS} or None
        copy = Message(message.id, target.name, message.body, broker._seq, message.event,
                       headers, message.created_at, message.expires_at, 0, message.source)
        broker._seq += 1
        journal = broker.journal
        if journal is not None:
            now = broker.clock.seconds()
            journal.append((MOVED, now, source.name, message.id, message.created_at,
                            message.retry, None, None, message.source, len(message.body),
                            message.expires_at, REASON_MOVED, None, None))
            journal.append((PUBLISHED, now, target.name, copy.id, copy.created_at, 0, None,
                            None, copy.source, len(copy.body), copy.expires_at, REASON_MOVED,
                            copy.headers, journal.bodies and copy.body))
        target.ready.append(copy)
        target.enqueued += 1
        if target.enqueued >= target.pack_check_at:  # see Queue.pack_ready
            target.pack_ready(broker.pack_ready_after)
        if copy.expires_at is not None:
            target.ttl_ready += 1
            broker._watch_expiry(target, copy)
        writer = broker.writer
        if writer is not None:
            writer.add((ENQUEUE, copy))
            writer.add_with_previous((REMOVE, source.name, message.seq))
