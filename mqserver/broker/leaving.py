# -*- test-case-name: tests.unit.test_broker_leaving -*-
"""Journal records of copies that leave a queue without being settled.

Acks, dead letters and expiries journal themselves where they happen (the
first on the hot path, in slim records).  A purge, a queue's deletion and a
consumer cancelled without requeue drop many copies at once, off the hot
path: each copy still gets its one terminal record (``purged`` or
``deleted``), so that published = settled + dropped + still there holds
for every queue (docs/analytics.md, the ``balance`` report).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mqserver.journal.schema import CONSUMER_CLOSED

if TYPE_CHECKING:
    from mqserver.broker.queue import Consumer
    from mqserver.model import Message


def journal_ready(journal: Any, event: str, now: float, queue: bytes,
                  messages: Iterable[Message], reason: str | None) -> None:
    """One ``event`` record per ready copy, with its publisher's protocol.

    ``delivery_count`` is the deliveries it had (its retries), as on a
    ready copy's ``expired`` record.
    """
    append = journal.append
    for message in messages:
        append((event, now, queue, message.id, message.created_at, message.retry, None, None,
                message.source, len(message.body), message.expires_at, reason, None, None))


def journal_in_flight(journal: Any, event: str, now: float, consumer: Consumer,
                      messages: Iterable[Message], reason: str | None) -> None:
    """One ``event`` record per copy ``consumer`` held, naming that consumer.

    Like every record that names a consumer, it carries the consumer's
    protocol; ``delivery_count`` counts the delivery it was in.
    """
    append = journal.append
    queue = consumer.queue.name
    connection = consumer.connection
    for message in messages:
        append((event, now, queue, message.id, message.created_at, message.retry + 1,
                consumer.id, connection.id, connection.protocol, len(message.body),
                message.expires_at, reason, None, None))


def journal_closed(journal: Any, now: float, consumer: Consumer, reason: str | None) -> None:
    """``consumer_closed``: the journal forgets the consumer's key after it."""
    connection = consumer.connection
    journal.append((CONSUMER_CLOSED, now, consumer.queue.name, None, None, 0, consumer.id,
                    connection.id, connection.protocol, None, None, reason, None, consumer.key))
