# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""The frontend socket (47291): clients' REQUEST, SCHEDULE, UNSCHEDULE, PUBLISH; schedulers.

A REQUEST is answered ``REPLY <msgid>`` once it is stored (durable with a
durable store), which is the moment the broker has taken responsibility for
it; the original sent it when a worker got the job and never when the job
waited.  SCHEDULE and UNSCHEDULE get ``ACK <msgid>`` the same way.

The answers to a run of REQUESTs (consecutive ones in one received chunk)
are held in order and go out in one write: at once on a memory store, after
one durability wait for the whole run on a durable one, never a wait per
request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from twisted.logger import Logger

from mqserver.broker.overflow import QueueFullError
from mqserver.limits import CONTROL_MARKS
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import (
    REQUEST,
    EMQPError,
    check_job,
    encode_replies,
    encode_reply,
)
from mqserver.protocols.emqp.endpoint import EndpointHandler
from mqserver.protocols.emqp.service import EMQPService, Peer
from mqserver.zmtp.codec import describe
from mqserver.zmtp.connection import ZMTPConnection
from mqserver.zmtp.router import UnroutableError, ZMTPRouterFactory

log = Logger()


class FrontendHandler(EndpointHandler):
    def __init__(self, service: EMQPService) -> None:
        super().__init__(service)
        self._commands = {
            codec.REQUEST: self._request,
            codec.SCHEDULE: self._schedule,
            codec.UNSCHEDULE: self._unschedule,
            codec.PUBLISH: self._publish,
            codec.INFORM: self._inform,
            codec.HEARTBEAT: self._heartbeat,
            codec.KBYE: self._kbye,
            codec.KBAI: self._kbye,
            codec.DISCONNECT: self._disconnect,
            codec.REPLY: self._heartbeat,
            codec.ACK: self._heartbeat,
        }
        # (queue, header frame) pairs that passed check_job: a client sends the
        # same ones again and again, and the limits never change
        self._valid_jobs: set[tuple[bytes, bytes]] = set()

    # a run of messages (see EndpointHandler.messages_received), then each one
    def handle_run(
        self, router: ZMTPRouterFactory, identity: bytes, messages: Iterator[list[bytes]]
    ) -> None:
        """Take the common REQUEST (7 frames, the first empty, ``REQUEST`` in
        capitals) without building an ``Envelope`` or a ``Request``, and store
        consecutive ones bound for one queue with the same headers as one
        broker run; anything else, and any REQUEST a check refuses, goes the
        long way (``message_received``) after the run so far, which checks it
        again and logs why."""
        service = self.service
        connection = service.frontend.peers.get(identity)
        if service.draining or connection is None:  # everything is refused, with a log line
            super().handle_run(router, identity, messages)
            return
        max_id, valid_jobs = service.limits.max_id, self._valid_jobs
        schedulers, route = service.schedulers, service.route_request
        publishing = connection.publisher
        replies: list[bytes] = []  # REPLYs that go out together, before anything else
        target, fields, entries = b"", None, []  # the requests not stored yet: one run
        run_headers = None  # their header frame: a request with it and ``target`` joins them
        try:
            for frames in messages:
                if len(frames) != 7 or frames[0] or frames[2] != REQUEST:
                    self._store(identity, target, fields, entries, replies)
                    self._long_way(router, identity, frames, replies)
                    run_headers = None  # what the long way did is not looked into
                    continue
                _, _, _, msgid, queue, headers, payload = frames
                # ``Limits.check_id``'s fast test, inlined: a fresh msgid in each
                if 0 < len(msgid) <= max_id and (
                        msgid.isalnum() or msgid.translate(CONTROL_MARKS).isalnum()):
                    if schedulers:  # liveness, recorded as message_received does
                        self._seen(identity)
                    if queue == target and headers == run_headers:
                        # the run's queue and headers again: checked and routed with
                        # its first request, and a queue with requests stays known
                        entries.append((msgid, payload))
                        continue
                    try:
                        if (queue, headers) not in valid_jobs:
                            self._check_job(queue, headers)
                        where, what = route(queue, headers, identity)
                    except EMQPError:
                        where = None
                else:
                    where = None
                if where is None:  # the long way says why
                    self._store(identity, target, fields, entries, replies)
                    self._long_way(router, identity, frames, replies)
                    run_headers = None
                    continue
                if not publishing:
                    self._publishing(identity)
                    publishing = True
                if where != queue:  # to default: logged and stored in order with the rest
                    self._store(identity, target, fields, entries, replies)
                    service.redirected(queue, msgid)
                    self._store(identity, where, what, [(msgid, payload)], replies)
                    continue
                if what is not fields:  # shared per queue, headers and client
                    self._store(identity, target, fields, entries, replies)
                    target, fields = where, what
                run_headers = headers
                entries.append((msgid, payload))
            self._store(identity, target, fields, entries, replies)
        finally:
            self._send_replies(identity, replies)

    def _store(
        self, identity: bytes, target: bytes, fields: dict[str, str] | None,
        entries: list[tuple[bytes, bytes]], replies: list[bytes],
    ) -> None:
        """Store ``entries`` (requests, in order) in ``target`` as one run and
        add each one's answer to ``replies``: ``REPLY`` (sent once stored),
        ``ERROR ... QueueFull`` for one a full queue refused (reject-publish),
        the ones after it tried again."""
        publish_run = self.service.broker.publish_to_queue_run
        while entries:
            try:
                publish_run(target, entries, fields, None, "emqp")
                stored, refused = entries, None
            except QueueFullError as e:
                stored, refused = entries[:e.stored], e
            if stored:
                replies.append(encode_replies([msgid for msgid, _ in stored]))
            if refused is None:
                break
            msgid = entries[len(stored)][0]
            replies.append(self._refusal(identity, codec.Envelope(REQUEST, msgid, []), refused))
            entries[:] = entries[len(stored) + 1:]
        entries.clear()

    def _long_way(
        self, router: ZMTPRouterFactory, identity: bytes, frames: list[bytes],
        replies: list[bytes],
    ) -> None:
        """``message_received``, after the REPLYs held so far (answers keep their order)."""
        self._send_replies(identity, replies)
        self.message_received(router, identity, frames)

    def _send_replies(self, identity: bytes, replies: list[bytes]) -> None:
        """The answers held, in order, in one write, once what was stored so far
        is durable: one wait for a run of requests, however long."""
        if replies:
            self._when_stored(identity, b"".join(replies))
            replies.clear()

    def message_received(
        self, router: ZMTPRouterFactory, identity: bytes, frames: list[bytes]
    ) -> None:
        try:
            envelope = codec.parse(frames, self.service.limits)
        except EMQPError as e:
            log.warn("emqp: dropped a malformed message from {id}: {e}", id=describe(identity), e=e)
            return
        self._seen(identity)
        handler = self._commands.get(envelope.command)
        if handler is None:
            log.warn(
                "emqp: dropped unknown command {cmd!r} from {id}",
                cmd=envelope.command, id=describe(identity),
            )
            return
        try:
            handler(identity, envelope)
        except EMQPError as e:
            log.warn(
                "emqp: dropped {cmd} {msgid!r} from {id}: {e}",
                cmd=envelope.command.decode("ascii", "replace"), msgid=envelope.msgid,
                id=describe(identity), e=e,
            )

    def _check_job(self, queue: bytes, headers: bytes) -> None:
        """``check_job``, remembering the pairs that pass (a bounded few)."""
        check_job(queue, headers, self.service.limits)
        if len(self._valid_jobs) >= 1024:
            self._valid_jobs.clear()
        self._valid_jobs.add((queue, headers))

    def _seen(self, identity: bytes) -> None:
        """Any well-formed message from a scheduler shows it is alive."""
        scheduler = self.service.schedulers.get(identity)
        if scheduler is not None:
            scheduler.last_seen = self.service.clock.seconds()

    def router_started(self, router: ZMTPRouterFactory) -> None:
        router.on_flow = self._flow
        super().router_started(router)

    @staticmethod
    def _flow(connection: ZMTPConnection, paused: bool) -> None:
        """A client that does not read its answers is not read from either, so the
        answers to its new requests cannot pile up in our buffer."""
        if paused:
            connection.hold_reading("answers")
        else:
            connection.release_reading("answers")

    def _publishing(self, identity: bytes) -> None:
        """Tell the memory alarm this client publishes (it stops reading from publishers)."""
        connection = self.service.frontend.peers.get(identity)
        if connection is not None and not connection.publisher:
            connection.publisher = True
            self.service.broker.flow.publishing(connection)

    def _refuse(self, identity: bytes, envelope: codec.Envelope, error: QueueFullError) -> None:
        self._send_encoded(identity, self._refusal(identity, envelope, error))

    @staticmethod
    def _refusal(identity: bytes, envelope: codec.Envelope, error: QueueFullError) -> bytes:
        """``ERROR <new msgid> <request msgid> QueueFull <text>``, laid out like the ``REPLY``
        and ``ACK`` that name a request: it was not stored (reject-publish); logged."""
        log.warn("emqp: {cmd} {msgid!r} from {id} refused: {e}",
                 cmd=envelope.command.decode("ascii", "replace"), msgid=envelope.msgid,
                 id=describe(identity), e=error)
        return codec.encode(codec.ERROR, codec.new_msgid(), envelope.msgid, codec.QUEUE_FULL,
                            str(error).encode("utf-8"))

    # -- commands -----------------------------------------------------------

    def _accepting(self, envelope: codec.Envelope) -> bool:
        if self.service.draining:
            log.warn(
                "emqp: draining after DISCONNECT; {cmd} {msgid!r} refused",
                cmd=envelope.command.decode("ascii", "replace"), msgid=envelope.msgid,
            )
            return False
        return True

    def _request(self, identity: bytes, envelope: codec.Envelope) -> None:
        if not self._accepting(envelope):
            return
        request = codec.parse_request(envelope.body, self.service.limits)
        self._publishing(identity)
        try:
            self.service.publish_request(
                request.queue, request.headers, request.payload, envelope.msgid, identity
            )
        except QueueFullError as e:
            self._refuse(identity, envelope, e)
            return
        self._when_stored(identity, encode_reply(envelope.msgid))

    def _schedule(self, identity: bytes, envelope: codec.Envelope) -> None:
        if not self._accepting(envelope):
            return
        key = self.service.scheduler.schedule(
            codec.parse_schedule(envelope.body, self.service.limits)
        )
        log.info("emqp: job {key} scheduled by {id}", key=key, id=describe(identity))
        self._when_stored(identity, codec.encode(codec.ACK, codec.new_msgid(), envelope.msgid))

    def _unschedule(self, identity: bytes, envelope: codec.Envelope) -> None:
        schedule = codec.parse_schedule(envelope.body)
        found = self.service.scheduler.unschedule(schedule.payload)
        log.info(
            "emqp: UNSCHEDULE from {id}: {what}", id=describe(identity),
            what="job removed" if found else "no such job",
        )
        self._when_stored(identity, codec.encode(codec.ACK, codec.new_msgid(), envelope.msgid))

    def _publish(self, identity: bytes, envelope: codec.Envelope) -> None:
        body = envelope.body
        if len(body) < 2 or not body[0]:
            raise EMQPError("PUBLISH needs a topic and a message")
        self.service.limits.check_name(body[0], "topic", EMQPError)
        # eventmq sends topic, message; the spec's second form has headers between
        topic, payload = body[0], body[-1]
        fields = {"emqp-headers": codec.text(body[1])} if len(body) > 2 else None
        self._publishing(identity)
        try:
            count = self.service.broker.publish_event(
                topic, envelope.msgid, payload, fields, None, "emqp"
            )
        except QueueFullError as e:
            self._refuse(identity, envelope, e)
            return
        if not count:
            log.debug("emqp: PUBLISH on {topic!r} reached no queue", topic=topic)

    def _inform(self, identity: bytes, envelope: codec.Envelope) -> None:
        body = envelope.body
        kind = body[1] if len(body) > 1 else b""
        if kind != codec.SCHEDULER:
            raise EMQPError(f"INFORM of type {kind!r} on the frontend (workers use the backend)")
        if self.service.draining:
            return
        self.service.schedulers[identity] = Peer(identity, self.service.clock.seconds())
        log.info("emqp: scheduler {id} joined", id=describe(identity))
        self._send(identity, codec.message(codec.ACK, envelope.msgid))

    def _heartbeat(self, identity: bytes, envelope: codec.Envelope) -> None:
        """Liveness was recorded for any message; nothing else to do."""

    def _kbye(self, identity: bytes, envelope: codec.Envelope) -> None:
        if self.service.schedulers.pop(identity, None) is not None:
            log.info("emqp: scheduler {id} said goodbye", id=describe(identity))

    def _disconnect(self, identity: bytes, envelope: codec.Envelope) -> None:
        raise EMQPError("DISCONNECT is only accepted on the admin socket")

    # -- output -------------------------------------------------------------

    def _send(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            self.service.frontend.send(identity, frames)
        except UnroutableError:
            log.debug("emqp: {id} left before its answer", id=describe(identity))

    def _when_stored(self, identity: bytes, answer: bytes) -> None:
        """Send ``answer`` (encoded) once what was done so far is durable."""
        if self.service.broker.writer is None:
            # nothing to wait for: no Deferred per request on a memory store
            self._send_encoded(identity, answer)
            return
        d = self.service.broker.durable()
        d.addCallbacks(lambda _: self._send_encoded(identity, answer), self._store_failed)

    def _send_encoded(self, identity: bytes, answer: bytes) -> None:
        try:
            self.service.frontend.send_encoded(identity, answer)
        except UnroutableError:
            log.debug("emqp: {id} left before its answer", id=describe(identity))

    @staticmethod
    def _store_failed(failure: Any) -> None:
        log.failure("emqp: storing a request failed; no answer sent", failure)
