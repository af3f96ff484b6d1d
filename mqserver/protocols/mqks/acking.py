# -*- test-case-name: tests.unit.test_mqks_ack_runs,tests.unit.test_mqks_protocol -*-
"""MQKS acks gathered into runs within a received chunk, like publishes (``publishing``).

A consumer that drains a pipelined queue answers each chunk of deliveries
with a chunk of ``ack`` lines, all for itself.  The broker settles
consecutive acks of one consumer as a run (``IBroker.ack_run``) with its
lookups and its queue's kick done once, and the protocol looks the
consumer up once per run instead of once per line (issue 8).  A line joins
the chunk's run of acks only where the one-at-a-time way (``_settle``)
would ack with no reply and no error: no ``--confirm``, no ``--all``, a
request id and a message id of letters and digits within
``--max-id-bytes`` (such an id passes the check a message the consumer
does not hold gets), and a live consumer.  At most one run is pending, of
publishes or of acks: each is stored before the other starts, before any
other line, a too-long line's error and the chunk's pump, so everything
is answered, logged and settled in the order the lines came.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from mqserver.broker.queue import Consumer
from mqserver.protocols.mqks.codec import CONFIRM

# the namespace operators filter MQKS errors on (they were logged by protocol.py)
log = Logger(namespace="mqserver.protocols.mqks.protocol")


class Acking:
    """The ack runs of ``MQKSProtocol`` (a mixin: it uses the protocol's attributes)."""

    broker: Any
    factory: Any
    _max_id: int
    _error: Any  # Output's
    _run: list[tuple[bytes, bytes]]  # Publishing's
    _store_run: Any  # Publishing's
    _answer_confirms: Any  # Publishing's
    _confirms: list[bytes]  # Publishing's
    # the gathered ack lines of this chunk (split into four words), all for
    # ``_ack_consumer``, whose id they name as ``_ack_consumer_id``
    _acks: list[list[bytes]]
    _ack_consumer: Consumer | None = None
    _ack_consumer_id = b""

    def _gather_ack(self, words: list[bytes]) -> bool:
        """Add an ack line split into four words to the chunk's run of acks, if it can go there.

        False for a line ``_settle`` could answer, or whose consumer is
        gone: it goes the one-at-a-time way, after the pending run is stored.
        """
        request_id, _, consumer_id, message_id = words
        max_id = self._max_id
        if not (request_id.isalnum() and len(request_id) <= max_id
                and message_id.isalnum() and len(message_id) <= max_id):
            return False
        if not self._acks or consumer_id != self._ack_consumer_id:
            self._store_pending()  # publishes or another consumer's acks: they came first
            # "--confirm" is a flag here, even if a consumer has that id
            consumer = None if consumer_id == CONFIRM else self.factory.consumer(consumer_id)
            if consumer is None:
                return False
            self._ack_consumer = consumer
            self._ack_consumer_id = consumer_id
        self._acks.append(words)
        return True

    def _store_acks(self) -> None:
        """Settle the gathered acks: one broker run."""
        acks, self._acks = self._acks, []
        consumer, self._ack_consumer = self._ack_consumer, None
        try:
            self.broker.ack_run(consumer, [words[3] for words in acks])
        except Exception:
            # not knowing which of them were settled, none is answered as done
            log.failure("mqks {action} failed", action=b"ack")
            self._answer_confirms()  # the publishes before them were stored
            for words in acks:
                self._error(words[0], "internal error")

    def _store_pending(self) -> None:
        """Store the chunk's pending run, of publishes or of acks (never both)."""
        if self._run:
            self._store_run()
        if self._acks:
            self._store_acks()

    def _store_runs(self) -> None:
        """Store the pending run and answer the confirmed publishes stored:
        before anything the next line or the chunk's end writes."""
        self._store_pending()
        if self._confirms:
            self._answer_confirms()
