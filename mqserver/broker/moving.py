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

Only ready messages move, oldest first, ``CHUNK`` per reactor turn so that
a million-message move does not stall every client; deliveries in flight
stay with their consumers.  A move never drops a message: it stops at the
target's ``max_length`` whatever its overflow policy, and says so.

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

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqserver.journal.schema import MOVED, PUBLISHED, REASON_MOVED
from mqserver.model import ENQUEUE, REMOVE, Message

if TYPE_CHECKING:
    from mqserver.broker.core import Broker
    from mqserver.broker.queue import Queue

DEAD_LETTER_HEADERS = ("x-dead-letter-reason", "x-dead-letter-queue")
"""The headers ``Settling._discard`` adds to a dead-letter copy."""

TARGET_FULL = "target full"
QUEUE_DELETED = "queue deleted"

CHUNK = 2_000
"""Messages moved per reactor turn: a large move must not stall every client.
About 10 us each with a durable store, so a turn stays near 20 ms."""


@dataclass(frozen=True)
class MoveResult:
    """What a move did: how many moved, and why it stopped short of what was asked."""

    moved: int
    left: int
    """Ready messages still in the source afterwards."""
    stopped: str | None = None
    """None, ``TARGET_FULL`` (the target reached its ``max_length``) or
    ``QUEUE_DELETED`` (either queue was deleted while the move ran)."""


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
             keep_dead_letter_headers: bool = False) -> Deferred[MoveResult]:
        """Move the oldest ``limit`` (None: all) ready messages of ``source`` to ``target``.

        Both queues must exist: a typo in the target would otherwise hide
        the messages in a queue nobody reads.  The first ``CHUNK`` move at
        once, the rest ``CHUNK`` per reactor turn; the Deferred fires with
        the ``MoveResult`` once the last has (``durable()`` after that says
        when the store has them).  The messages to move are counted at the
        start: a move into a queue whose dead-letter target is the source
        must not chase its own tail.

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
        count = len(from_queue.ready) if limit is None else min(limit, len(from_queue.ready))
        run = _Run(self, from_queue, to_queue, count, keep_dead_letter_headers)
        run.step()
        return run.done

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
            broker._repack(target)
        if copy.expires_at is not None:
            target.ttl_ready += 1
            broker._watch_expiry(target, copy)
        writer = broker.writer
        if writer is not None:
            writer.add((ENQUEUE, copy))
            writer.add_with_previous((REMOVE, source.name, message.seq))


class _Run:
    """One move under way: what is left to move, one chunk per reactor turn."""

    def __init__(self, mover: Mover, source: Queue, target: Queue, count: int,
                 keep_headers: bool) -> None:
        self.mover = mover
        self.source = source
        self.target = target
        self.remaining = count
        self.last = source.ready[-1].seq if source.ready else 0
        self.keep_headers = keep_headers
        self.moved = 0
        self.done: Deferred[MoveResult] = Deferred()

    def step(self) -> None:
        try:
            stopped = self._chunk()
        except Exception:
            if not self.done.called:  # a cancelled caller has gone already
                self.done.errback(Failure())
            return
        if stopped is not None or not self.remaining:
            if not self.done.called:
                self.done.callback(MoveResult(self.moved, len(self.source.ready), stopped))
        else:
            self.mover.broker.clock.callLater(0, self.step)

    def _chunk(self) -> str | None:
        """Move the next chunk; why the move stops early, if it does.

        Only messages ready when the move started go (``last``): consumers
        may take some of them meanwhile, and what is published or rejected
        into the source later stays there.
        """
        source, target = self.source, self.target
        if source.deleted or target.deleted:
            return QUEUE_DELETED
        count = min(CHUNK, self.remaining)
        room = None if target.limit is None else max(0, target.limit - len(target.ready))
        if room is not None:
            count = min(count, room)
        move_one, keep, last = self.mover._move_one, self.keep_headers, self.last
        moved = 0
        while moved < count and source.ready and source.ready[0].seq <= last:
            move_one(source, target, keep)
            moved += 1
        source.moved += moved
        self.moved += moved
        self.remaining -= moved
        if moved:
            self.mover.broker._kick(target)
        if not source.ready or source.ready[0].seq > last:
            self.remaining = 0  # none of the counted ones left
        if self.remaining and moved == room:
            return TARGET_FULL
        return None
