# -*- test-case-name: tests.unit.test_web_consumers -*-
"""Consuming over HTTP: long-poll sessions that are broker connections.

An HTTP client has no connection the broker could watch, so each named
consumer is a broker ``Connection`` (protocol ``http``) kept alive by a
lease: every poll and ack renews it, and when it runs out the connection is
closed like a dropped socket, so unacked messages go back to their queue
(retry + 1, in their original place).

Credit is the consumer's window: zero between polls, so the broker hands
this consumer nothing while no client is waiting, and ``unacked + max``
during a poll.  A poll answers one reactor turn after its first delivery,
so everything the dispatch pump handed over in that turn goes out together.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import implementer

from mqserver.interfaces import IClientConnection, IDeliverySink
from mqserver.model import Message, new_message_id
from mqserver.web.router import APIError, text

log = Logger()

ZERO_WAIT_GRACE = 0.1
"""A poll with timeout 0 still waits this long for ready messages to be dispatched
(dispatch happens on the next reactor turn), but not for new ones."""


@implementer(IDeliverySink, IClientConnection)
class HTTPConsumer:
    """One named consumer: its broker connection, its lease, and its waiting poll."""

    def __init__(self, registry: HTTPConsumers, name: bytes, queue: bytes, peer: str) -> None:
        self.registry = registry
        self.broker = registry.broker
        self.name = name
        self.connection = self.broker.connection_opened("http", peer, self)
        self.consumer = self.broker.consume(
            self.connection, name, queue, window=0, manual_ack=True
        )
        self.lease = 30.0
        self._lease_call: Any = None
        self._poll: Deferred[list[Message]] | None = None
        self._want = 0
        self._batch: list[Message] = []
        self._calls: list[Any] = []
        self.closed = False

    @property
    def queue(self) -> bytes:
        return self.consumer.queue.name

    def renew(self, lease: float | None = None) -> None:
        """Restart the lease (a poll or an ack is activity)."""
        if lease is not None:
            self.lease = lease
        if self._lease_call is not None and self._lease_call.active():
            self._lease_call.reset(self.lease)
        else:
            self._lease_call = self.broker.clock.callLater(self.lease, self._lease_expired)

    def _lease_expired(self) -> None:
        self._lease_call = None
        if self._poll is not None:  # a client is waiting right now: it is alive
            self.renew()
            return
        self.close("lease expired")

    # -- polling ------------------------------------------------------------

    def poll(self, count: int, timeout: float) -> Deferred[list[Message]]:
        """Up to ``count`` messages: as soon as some arrive, or [] after ``timeout``."""
        if self._poll is not None:
            raise APIError(409, f"consumer {text(self.name)!r} already has a poll waiting")
        d: Deferred[list[Message]] = Deferred(lambda _: self._end_poll(cancelled=True))
        self._poll = d
        self._want = count
        self._batch = []
        clock = self.broker.clock
        if timeout <= 0:
            if not self.consumer.queue.ready:
                self._poll = None
                d.callback([])
                return d
            timeout = ZERO_WAIT_GRACE
        self._calls.append(clock.callLater(timeout, self._end_poll))
        self.sync_window()
        return d

    def sync_window(self) -> None:
        """Credit = what the waiting poll still wants (none between polls).

        Called after acks too: the window counts unacked messages, so an ack
        would otherwise leave credit behind for the broker to fill while no
        client is waiting.
        """
        consumer = self.consumer
        if not consumer.active:
            return
        wanted = max(0, self._want - len(self._batch)) if self._poll is not None else 0
        window = len(consumer.unacked) + wanted
        if consumer.window != window:
            self.broker.set_window(consumer, window)

    def _end_poll(self, cancelled: bool = False) -> None:
        """Answer the poll (unless the client went away) and take the credit back.

        A cancelled poll's batch stays unacked; the lease returns it.
        """
        for call in self._calls:
            if call.active():
                call.cancel()
        self._calls = []
        d, self._poll = self._poll, None
        batch, self._batch = self._batch, []
        self.sync_window()
        if not self.closed:
            self.renew()
        if d is not None and not cancelled:
            d.callback(batch)

    # -- IDeliverySink --------------------------------------------------------

    def deliver(self, consumer: Any, message: Message) -> None:
        self._batch.append(message)
        if len(self._batch) == 1 and self._poll is not None:
            self._calls.append(self.broker.clock.callLater(0, self._end_poll))

    def queue_changed(self, consumer: Any) -> None:
        if consumer.queue.deleted:
            # the broker already removed the consumer; end the session next turn
            # (this is called from inside the broker, which must not be re-entered)
            self.broker.clock.callLater(0, self.close, "queue deleted")

    # -- IClientConnection ----------------------------------------------------

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self._lease_call is not None and self._lease_call.active():
            self._lease_call.cancel()
        self._lease_call = None
        if self._poll is not None:
            self._end_poll()
        self.registry.forget(self)
        self.broker.connection_closed(self.connection)
        log.info("http consumer {name!r} on {queue!r} closed: {reason}",
                 name=self.name, queue=self.queue, reason=reason)


class HTTPConsumers:
    """Every HTTP consumer by name (names are global, like MQKS consumer ids)."""

    def __init__(self, broker: Any, max_sessions: int = 10_000) -> None:
        self.broker = broker
        self.max_sessions = max_sessions
        self.sessions: dict[bytes, HTTPConsumer] = {}

    def get(self, name: bytes, queue: bytes) -> HTTPConsumer:
        """The live session ``name`` on ``queue``; 404 if none, 409 if on another queue."""
        session = self.sessions.get(name)
        if session is not None and not session.consumer.active:
            session.close("consumer cancelled")
            session = None
        if session is None:
            raise APIError(
                404,
                f"no consumer {text(name)!r}: its lease may have run out, "
                "which returned its messages to the queue",
            )
        if session.queue != queue:
            raise APIError(409, f"consumer {text(name)!r} consumes {text(session.queue)!r}")
        return session

    def open(self, name: bytes | None, queue: bytes, peer: str) -> HTTPConsumer:
        """The session ``name`` (made if new; a fresh name if None)."""
        existing = self.sessions.get(name) if name is not None else None
        if existing is not None and not existing.consumer.active:
            existing.close("consumer cancelled")  # its queue went; start afresh
        elif existing is not None:
            return self.get(existing.name, queue)
        if len(self.sessions) >= self.max_sessions:
            raise APIError(503, "too many HTTP consumers; ack and let idle ones expire")
        name = name or b"http-" + new_message_id()[:16]
        session = HTTPConsumer(self, name, queue, peer)
        self.sessions[name] = session
        return session

    def forget(self, session: HTTPConsumer) -> None:
        if self.sessions.get(session.name) is session:
            del self.sessions[session.name]

    def close_all(self, reason: str) -> None:
        for session in list(self.sessions.values()):
            session.close(reason)
