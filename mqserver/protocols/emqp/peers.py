# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""The peers the broker keeps per identity: workers (core consumers) and schedulers.

A worker is kept by identity, not by TCP connection: libzmq reconnects a
DEALER with the same identity after a network blip, and the job manager
goes on as if nothing happened, so only missing heartbeats remove it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.broker.queue import Consumer, Slots
from mqserver.interfaces import IClientConnection, IDeliverySink
from mqserver.model import Message
from mqserver.zmtp.codec import describe

if TYPE_CHECKING:
    from mqserver.protocols.emqp.service import EMQPService

log = Logger()


@implementer(IDeliverySink, IClientConnection)
class Worker:
    """One worker (an eventmq job manager): its queues, slots and in-flight timers."""

    def __init__(
        self, service: EMQPService, identity: bytes, queues: list[tuple[int, bytes]], now: float
    ) -> None:
        self.service = service
        self.identity = identity
        self.queues = queues
        self.last_seen = now
        self.slots = Slots()
        self.connection: Any = None
        self.undelivered: list[Message] = []
        self.timers: dict[tuple[bytes, bytes], IDelayedCall] = {}
        self.gone = False
        self.removed = False
        self.processed = 0

    def deliver(self, consumer: Consumer, message: Message) -> bool:
        return self.service.deliver(self, consumer, message)

    def queue_changed(self, consumer: Consumer) -> None:
        if consumer.queue.deleted:
            log.info(
                "emqp: queue {queue!r} of worker {worker} was deleted",
                queue=consumer.queue.name, worker=describe(self.identity),
            )

    def close(self, reason: str) -> None:
        """IClientConnection: an operator drops this worker (HTTP API).

        Its requests go back to their queues at once (a real failure: each
        counts against its ``retry-count``), and its ZMTP connection is
        dropped; if the job manager reconnects it must INFORM again.
        """
        log.info("emqp: worker {worker} closed by the server: {reason}",
                 worker=describe(self.identity), reason=reason)
        self.service.remove_worker(self, f"closed by the server: {reason}")
        connection = self.service.backend.peers.get(self.identity)
        if connection is not None:
            connection.close()

    def in_flight(self) -> int:
        return sum(len(c.unacked) for c in self.connection.consumers.values())


class Peer:
    """A scheduler that INFORMed on the frontend: it gets heartbeats and can time out."""

    def __init__(self, identity: bytes, now: float) -> None:
        self.identity = identity
        self.last_seen = now
