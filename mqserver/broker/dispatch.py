# -*- test-case-name: tests.unit.test_dispatch -*-
"""Handing ready messages to consumers, one bounded batch per queue per turn.

Two strategies: plain round-robin among the consumers with credit (MQKS,
PHPMQ: the hot path, kept flat), and by priority (eMQP worker weights): the
highest-priority consumers with credit first, round-robin among equals.
Both return True when the batch budget ran out while more could be sent, so
the pump comes back next turn instead of blocking the reactor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqserver.journal.schema import SLIM_AUTO_ACKED, SLIM_DELIVERED, SLIM_DELIVERED_FIRST
from mqserver.model import REMOVE, Message

if TYPE_CHECKING:
    from mqserver.broker.core import Broker
    from mqserver.broker.queue import Consumer, Queue

DELIVERED, EXPIRED, HELD = 0, 1, 2


def hand_over(
    broker: Broker, queue: Queue, consumer: Consumer, message: Message, now: float
) -> int:
    """Deliver one message just taken from the head of ``queue``.

    Returns EXPIRED if its TTL had passed (it was discarded), HELD if the
    consumer still holds an unacked message with the same id (it went back to
    the head), else DELIVERED.
    """
    if message.expires_at is not None:
        queue.ttl_ready -= 1
        if message.expires_at <= now:
            broker._discard(queue, message, b"expired")
            return EXPIRED
    if consumer.manual_ack:
        unacked = consumer.unacked
        if message.id in unacked:
            # an ack names a message by id: wait until the first one is settled
            queue.restore((message,))
            return HELD
        unacked[message.id] = message
    else:
        broker._op((REMOVE, queue.name, message.seq))
    slots = consumer.slots
    if slots is not None:
        slots.free -= 1
    consumer.delivered += 1
    journal = broker.journal
    if journal is not None:
        # slim records (see mqserver.journal.encode): queue and consumer
        # details come from the consumer_opened record
        tags = consumer.tags
        append = journal.append  # see Journal.append: read once, then called
        if message.retry or message.expires_at is not None:
            append((tags[SLIM_DELIVERED], now, message.id, message.created_at,
                    message.retry + 1, len(message.body), message.expires_at))
        else:  # the common case, in fewer values
            append((tags[SLIM_DELIVERED_FIRST], now, message.id, message.created_at,
                    len(message.body)))
        if not consumer.manual_ack:
            append((tags[SLIM_AUTO_ACKED], now, message.id))
    if consumer.sink.deliver(consumer, message) and consumer.manual_ack:
        broker.settle_sent(consumer, message, now)
    return DELIVERED


def round_robin(broker: Broker, queue: Queue, now: float) -> bool:
    ready = queue.ready
    consumers = queue.consumers
    count = len(consumers)
    budget = broker.dispatch_batch
    i = queue.rr
    idle = sent = 0
    more = False
    while ready and count:
        if sent >= budget:
            more = True
            break
        if i >= count:
            i = 0
        consumer = consumers[i]
        i += 1
        if consumer.paused or (
            consumer.window is not None and len(consumer.unacked) >= consumer.window
        ):
            idle += 1
            if idle >= count:
                break
            continue
        outcome = hand_over(broker, queue, consumer, ready.popleft(), now)
        if outcome == DELIVERED:
            idle = 0
            sent += 1
        elif outcome == EXPIRED:
            i -= 1
        else:
            idle += 1
            if idle >= count:
                break
    queue.rr = i
    broker.count_delivered(queue, sent)
    return more


def by_priority(broker: Broker, queue: Queue, now: float) -> bool:
    """The best priority's consumers with credit, round-robin among them.

    The group is worked out again only when it may have changed: a member
    out of credit (slots are shared by an eMQP worker's consumers, a full
    transport pauses a connection's) or a consumer held back or let in again.
    """
    ready = queue.ready
    budget = broker.dispatch_batch
    turns = queue.rr_by_priority
    sent = 0
    held: set[int] = set()
    group: list[Consumer] = []
    priority = 0
    while ready:
        if sent >= budget:
            broker.count_delivered(queue, sent)
            return True
        if not group:
            group, priority = _best(queue, held)
            if not group:
                break
        turn = turns.get(priority, 0) % len(group)
        turns[priority] = turn + 1
        consumer = group[turn]
        outcome = hand_over(broker, queue, consumer, ready.popleft(), now)
        if outcome == DELIVERED:
            sent += 1
            if held:
                held.clear()
                group = []
            else:
                for member in group:
                    if not member.has_credit():
                        group = []
                        break
        elif outcome == HELD:
            held.add(id(consumer))
            group = []
    broker.count_delivered(queue, sent)
    return False


def _best(queue: Queue, skip: set[int]) -> tuple[list[Consumer], int]:
    """The consumers of the best priority that have credit, and that priority."""
    best: list[Consumer] = []
    best_priority = 0
    for consumer in queue.consumers:
        if id(consumer) in skip or not consumer.has_credit():
            continue
        if not best or consumer.priority > best_priority:
            best, best_priority = [consumer], consumer.priority
        elif consumer.priority == best_priority:
            best.append(consumer)
    return best, best_priority
