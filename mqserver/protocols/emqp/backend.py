# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""The backend socket (47290): workers' INFORM, READY, REPLY, HEARTBEAT and KBYE.

A worker is known from its INFORM on; anything else from an unknown identity
is dropped with a log line (eventmq's job manager notices the missing
heartbeats and INFORMs again).  A DISCONNECT from a worker, which crashed the
original router, is logged and ignored.
"""

from __future__ import annotations

from collections.abc import Iterator

from twisted.logger import Logger

from mqserver.limits import CONTROL_MARKS
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import READY, EMQPError
from mqserver.protocols.emqp.endpoint import EndpointHandler
from mqserver.protocols.emqp.service import EMQPService, Worker
from mqserver.zmtp.codec import describe
from mqserver.zmtp.connection import ZMTPConnection
from mqserver.zmtp.router import UnroutableError, ZMTPRouterFactory

log = Logger()


class BackendHandler(EndpointHandler):
    def __init__(self, service: EMQPService) -> None:
        super().__init__(service)
        self._commands = {
            codec.READY: self._ready,
            codec.REPLY: self._reply,
            codec.HEARTBEAT: self._heartbeat,
            codec.KBYE: self._kbye,
            codec.KBAI: self._kbye,
            codec.ACK: self._heartbeat,
        }

    # a run of messages (see EndpointHandler.messages_received), then each one
    def handle_run(
        self, router: ZMTPRouterFactory, identity: bytes, messages: Iterator[list[bytes]]
    ) -> None:
        """Count a known worker's READYs (4 frames, the first empty, ``READY`` in
        capitals) and give them in one ``add_slots``, before any other message
        of the run is handled the long way (``message_received``), so the order
        of what they cause is kept."""
        workers = self.service.workers
        worker = workers.get(identity)
        max_id = self.service.limits.max_id
        ready = 0  # READYs not given yet
        for frames in messages:
            # a fresh msgid in each (eventmq's job manager): its check inlined
            # (``Limits.check_id``'s fast test), else the long way says why
            if (worker is not None and len(frames) == 4 and not frames[0]
                    and frames[2] == READY and 0 < len(msgid := frames[3]) <= max_id
                    and (msgid.isalnum() or msgid.translate(CONTROL_MARKS).isalnum())):
                ready += 1
                continue
            if ready and worker is not None:
                self._ready_many(worker, ready)
                ready = 0
            self.message_received(router, identity, frames)
            worker = workers.get(identity)  # an INFORM or KBYE changes it
        if ready and worker is not None:
            self._ready_many(worker, ready)

    def _ready_many(self, worker: Worker, count: int) -> None:
        """``count`` READYs at once: liveness once, slots in one ``add_slots``."""
        worker.last_seen = self.service.clock.seconds()
        if not self.service.draining:
            self.service.broker.add_slots(worker.slots, count)

    def message_received(
        self, router: ZMTPRouterFactory, identity: bytes, frames: list[bytes]
    ) -> None:
        try:
            envelope = codec.parse(frames, self.service.limits)
            worker = self.service.workers.get(identity)
            if worker is not None:
                worker.last_seen = self.service.clock.seconds()
            if envelope.command == codec.INFORM:
                self._inform(identity, envelope)
                return
            if worker is None:
                raise EMQPError("from a worker that has not INFORMed")
            handler = self._commands.get(envelope.command)
            if handler is None:
                raise EMQPError("not a worker command")
            handler(worker, envelope)
        except EMQPError as e:
            log.warn(
                "emqp-backend: dropped {cmd!r} from {id}: {e}",
                cmd=frames[2][:40] if len(frames) > 2 else b"", id=describe(identity), e=e,
            )

    def _inform(self, identity: bytes, envelope: codec.Envelope) -> None:
        body = envelope.body
        if len(body) < 2 or body[1] != codec.WORKER:
            kind = body[1] if len(body) > 1 else b""
            raise EMQPError(f"INFORM of type {kind!r} on the backend (schedulers use the frontend)")
        if self.service.draining:
            raise EMQPError("draining after DISCONNECT")
        queues = codec.parse_worker_queues(body[0], self.service.limits)
        worker = self.service.register_worker(identity, queues)
        connection = self.service.backend.peers.get(identity)
        if connection is not None and connection.paused:
            self.service.broker.pause(worker.connection)
        try:
            self.service.backend.send(identity, codec.message(codec.ACK, envelope.msgid))
        except UnroutableError:
            log.debug("emqp-backend: worker {id} left before its ACK", id=describe(identity))

    def router_started(self, router: ZMTPRouterFactory) -> None:
        router.on_flow = self._flow
        super().router_started(router)

    def _flow(self, connection: ZMTPConnection, paused: bool) -> None:
        """A worker that does not read is handed no more requests until it drains
        (READY slots bound them too, but a worker may send many READYs)."""
        worker = self.service.workers.get(connection.identity)  # type: ignore[arg-type]
        if worker is not None and not worker.removed:
            if paused:
                self.service.broker.pause(worker.connection)
            else:
                self.service.broker.resume(worker.connection)

    def _ready(self, worker: Worker, envelope: codec.Envelope) -> None:
        if not self.service.draining:
            self.service.broker.add_slots(worker.slots)

    def _reply(self, worker: Worker, envelope: codec.Envelope) -> None:
        body = envelope.body
        if len(body) < 2:
            raise EMQPError("a worker's REPLY needs a result and the request's msgid")
        self.service.worker_reply(worker, body[0], body[1])

    def _heartbeat(self, worker: Worker, envelope: codec.Envelope) -> None:
        """Liveness was recorded for any message; nothing else to do."""

    def _kbye(self, worker: Worker, envelope: codec.Envelope) -> None:
        self.service.remove_worker(worker, "it said goodbye")
