# -*- test-case-name: tests.unit.test_phpmq_protocol -*-
"""The PHPMQ frames that settle a delivery: 004 ack, 005 requeue, 006 dead letter.

A mixin of ``PHPMQProtocol``, which provides ``broker``, ``consumer`` (its
one consumer, or None), the limit checks ``_checked_name``/``_checked_id``
and ``_speaks_2018``.  Settling works from any connection, as acks did in
the original: a connection's own consumer is looked at first.
"""

from __future__ import annotations

from typing import Any

from mqserver.broker.queue import Consumer
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import MESSAGE_ID, QUEUE, TTL, Run

DEAD_LETTER_REASON = b"rejected"


class Settling:
    """004, 005 and 006 (see the module docstring)."""

    broker: Any
    consumer: Consumer | None

    def _holder(self, packages: dict[int, bytes]) -> Consumer | None:
        """Whoever holds the delivery a 004, 005 or 006 names: settling works from
        any connection, as acks did in the original.  This connection's own
        consumer is checked first."""
        queue = self._checked_name(packages[QUEUE])
        message_id = self._checked_id(packages[MESSAGE_ID])
        own = self.consumer
        if own is not None and own.queue.name == queue and message_id in own.unacked:
            return own
        found = self.broker.queues.get(queue)
        if found is not None:
            for consumer in found.consumers:
                if message_id in consumer.unacked:
                    return consumer
        return None

    def _ack(self, packages: dict[int, bytes]) -> None:
        queue, message_id = packages[QUEUE], packages[MESSAGE_ID]
        own = self.consumer
        if own is not None and message_id in own.unacked and own.queue.name == queue:
            # the usual ack: the name and the id were checked when they came in
            self.broker.ack(own, message_id)
        else:
            self._ack_any(queue, message_id)

    def _ack_run(self, run: Run) -> None:
        """004s of one queue (``codec.Run``): ``_ack`` with the consumer looked up once."""
        queue, own = run.queue, self.consumer
        if own is None or own.queue.name != queue:
            for message_id in run.values:
                self._ack_any(queue, message_id)
            return
        ack = self.broker.ack
        for message_id in run.values:
            # an id the consumer holds was checked when it came in, as in ``_ack``
            if not ack(own, message_id):
                self._ack_any(queue, message_id)

    def _ack_any(self, queue: bytes, message_id: bytes) -> None:
        """An ack of a message this connection's consumer does not hold."""
        self._checked_name(queue)
        self._checked_id(message_id)
        self.broker.ack_any(queue, message_id)  # an unknown id is ignored

    def _requeue(self, packages: dict[int, bytes]) -> None:
        holder = self._holder(packages)
        self._speaks_2018()
        ttl = codec.parse_number(packages[TTL], "TTL")
        if holder is not None:
            self.broker.reject(holder, packages[MESSAGE_ID], ttl=ttl)

    def _dead_letter(self, packages: dict[int, bytes]) -> None:
        holder = self._holder(packages)
        self._speaks_2018()
        if holder is not None:
            self.broker.dead_letter(holder, packages[MESSAGE_ID], DEAD_LETTER_REASON)
