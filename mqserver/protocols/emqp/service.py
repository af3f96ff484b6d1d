# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""The eMQP broker state: workers as consumers of the shared core, requests as messages.

A REQUEST becomes a message in its queue (``broker.publish_to_queue``), so it
waits durably when no worker is free.  A worker is one broker connection
with a consumer per queue it INFORMed, at ``priority=weight``, all sharing
one ``Slots`` that each READY adds to.  What is needed to rebuild the frames
(original queue frame, headers, client identity) travels in the message's
headers, so a request recovered after a restart is forwarded exactly like a
fresh one.

Tracking: a request is kept unacked until the worker's REPLY when the client
asked for a reply, a guarantee, retries or a timeout; it is then forwarded
with ``reply-requested`` so the worker does reply.  Anything else is acked
as soon as it is sent, as the original router forgot it then.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.broker.core import MAX_RETRIES
from mqserver.broker.queue import Consumer
from mqserver.limits import Limits
from mqserver.model import Message
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import DEFAULT_QUEUE, REPLY
from mqserver.protocols.emqp.drain import Drain, close_all, say_goodbye
from mqserver.protocols.emqp.fields import (
    H_CLIENT,
    H_REPLY,
    H_TIMEOUT,
    H_TRACK,
    RequestFrames,
    request_fields,
)
from mqserver.protocols.emqp.peers import Peer, Worker
from mqserver.protocols.emqp.scheduler import ScheduleRunner
from mqserver.zmtp.codec import describe
from mqserver.zmtp.router import DEFAULT_MAX_FRAMES, UnroutableError, ZMTPRouterFactory

log = Logger()

_TIMEOUT_RESULT = json.dumps({"value": codec.TIMEOUT_ERROR}).encode("ascii")
_KEEP_FOR_RUNS = ("guarantee",)
_KEEP_NUMBERS = ("retry-count", "timeout")


def _outcome(queue: Any, final: bool) -> str:
    """What becomes of a failed request, for the log: the broker dead-letters a message
    whose retries ran out only if its queue has a dead-letter target; else it is gone."""
    if not final:
        return "retrying"
    target = queue.options.dead_letter
    if target is None or target == queue.name:
        return "retries exhausted, dropped (the queue has no dead-letter queue)"
    return f"retries exhausted, dead-lettered to {target.decode('utf-8', 'replace')!r}"


class EMQPService:
    """Everything the three eMQP sockets share."""

    def __init__(
        self,
        broker: Any,
        max_message_size: int = 64 * 1024 * 1024,
        heartbeat_interval: float = 3.0,
        peer_timeout: float = 5.0,
        drain_timeout: float = 10.0,
        dead_letter: bytes = b"",
        on_disconnect: Callable[[], Any] | None = None,
        max_frames: int = DEFAULT_MAX_FRAMES,
        limits: Limits | None = None,
    ) -> None:
        from mqserver.protocols.emqp.admin import AdminHandler
        from mqserver.protocols.emqp.backend import BackendHandler
        from mqserver.protocols.emqp.frontend import FrontendHandler

        self.broker = broker
        self.clock = broker.clock
        self.limits = limits or Limits()
        self.heartbeat_interval = heartbeat_interval
        self.peer_timeout = peer_timeout
        self.drain_timeout = drain_timeout
        self.dead_letter = dead_letter
        self.on_disconnect = on_disconnect
        self.frontend = ZMTPRouterFactory(
            FrontendHandler(self), "emqp", max_message_size, clock=self.clock,
            max_frames=max_frames,
        )
        self.backend = ZMTPRouterFactory(
            BackendHandler(self), "emqp-backend", max_message_size, clock=self.clock,
            max_frames=max_frames,
        )
        self.admin = ZMTPRouterFactory(
            AdminHandler(self), "emqp-admin", max_message_size, clock=self.clock,
            max_frames=max_frames,
        )
        self.workers: dict[bytes, Worker] = {}
        self.schedulers: dict[bytes, Peer] = {}
        self.scheduler = ScheduleRunner(broker, self.run_scheduled)
        self._drain: Drain | None = None
        # (queue, header frame, client) -> the fields of its requests
        self._fields: dict[tuple[bytes, bytes, bytes | None], dict[str, str]] = {}
        self._request_frames = RequestFrames()
        self._started = 0
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = self.clock

    # -- life cycle (the three factories start and stop us) -----------------

    def start(self) -> None:
        self._started += 1
        if self._started > 1:
            return
        self.scheduler.load()
        self._heartbeat.start(self.heartbeat_interval, now=False)

    def stop(self) -> None:
        self._started -= 1
        if self._started > 0:
            return
        if self._heartbeat.running:
            self._heartbeat.stop()
        self.scheduler.stop()
        if self._drain is not None:
            self._drain.cancel()
        if self._drain is None or not self._drain.finished:
            # the last socket stopped listening: a shutdown (SIGTERM), so
            # every peer hears KBYE before its connection closes
            say_goodbye(self)
            close_all(self)

    # -- requests -----------------------------------------------------------

    def publish_request(
        self, queue: bytes, header_frame: bytes, payload: bytes, msgid: bytes,
        client: bytes | None,
    ) -> Message:
        """Store a REQUEST in the core; raises ``EMQPError`` for malformed headers."""
        target, fields = self.route_request(queue, header_frame, client)
        if target != queue:
            self.redirected(queue, msgid)
        return self.broker.publish_to_queue(target, msgid, payload, fields, None, "emqp")

    def route_request(
        self, queue: bytes, header_frame: bytes, client: bytes | None
    ) -> tuple[bytes, dict[str, str]]:
        """The queue a REQUEST goes to (``default`` if no worker knows its own:
        the caller logs it, ``redirected``) and the fields its message
        carries; raises ``EMQPError`` for malformed headers.

        A client sends the same queue and headers over and over: the fields
        are worked out once per combination and shared (nothing changes a
        message's headers in place), which also keeps a backlog of requests
        from holding a dict each, and lets the frontend store requests that
        share them as one run.
        """
        key = (queue, header_frame, client)
        fields = self._fields.get(key)
        if fields is None:
            fields = request_fields(queue, header_frame, client)
            if len(self._fields) >= 1024:
                self._fields.clear()
            self._fields[key] = fields
        # a queue someone consumes or that holds waiting requests; others go to default
        known = self.broker.queues.get(queue)
        if known is not None and (known.consumers or known.ready):
            return queue, fields
        return DEFAULT_QUEUE, fields

    @staticmethod
    def redirected(queue: bytes, msgid: bytes) -> None:
        log.info("emqp: no worker knows queue {queue!r}; request {msgid!r} goes to default",
                 queue=queue, msgid=msgid)

    def run_scheduled(self, queue: bytes, header_frame: bytes, payload: bytes) -> None:
        """One run of a scheduled job: a REQUEST with the schedule's delivery headers."""
        headers = codec.parse_headers(header_frame)
        keep = codec.Headers(
            {f for f in headers.flags if f in _KEEP_FOR_RUNS},
            {k: v for k, v in headers.values.items() if k in _KEEP_NUMBERS},
        )
        self.publish_request(queue, codec.format_headers(keep), payload, codec.new_msgid(), None)

    # -- workers ------------------------------------------------------------

    def register_worker(self, identity: bytes, queues: list[tuple[int, bytes]]) -> Worker:
        old = self.workers.get(identity)
        if old is not None:
            self.remove_worker(old, "it INFORMed again")
        worker = Worker(self, identity, queues, self.clock.seconds())
        connection = self.backend.peers.get(identity)
        peer = f"{connection.peer if connection else '?'} {describe(identity)}"
        worker.connection = self.broker.connection_opened("emqp", peer, worker)
        self.workers[identity] = worker
        for weight, name in queues:
            if self.dead_letter and name != self.dead_letter:
                queue = self.broker.declare_queue(name)
                if queue.options.dead_letter is None:
                    self.broker.declare_queue(
                        name, replace(queue.options, dead_letter=self.dead_letter)
                    )
            self.broker.consume(
                worker.connection, name, name, window=None, manual_ack=True,
                priority=weight, slots=worker.slots,
            )
        log.info(
            "emqp: worker {worker} joined with queues {queues}",
            worker=describe(identity),
            queues=[(w, n.decode("utf-8", "replace")) for w, n in queues],
        )
        return worker

    def deliver(self, worker: Worker, consumer: Consumer, message: Message) -> bool:
        """Called by the core's dispatch: forward now, never call back into the broker.

        True (settled as sent) for an untracked request: nothing will ever
        answer for it, so the core acks it at once.
        """
        # backend.send_encoded, without its call
        connection = self.backend.peers.get(worker.identity)
        if connection is None:  # unroutable: the worker is gone
            worker.undelivered.append(message)
            if not worker.gone:
                worker.gone = True
                self.clock.callLater(0, self._unreachable, worker)
            return False
        connection.write(self._request_frames(message))
        worker.processed += 1
        fields = message.headers
        if not fields or H_TRACK not in fields:
            return True
        timeout = fields.get(H_TIMEOUT)
        if timeout:
            key = (consumer.queue.name, message.id)
            worker.timers[key] = self.clock.callLater(
                int(timeout), self._timed_out, worker, consumer, message.id
            )
        return False

    def _unreachable(self, worker: Worker) -> None:
        try:
            self.remove_worker(worker, "it is no longer connected")
        except Exception:
            log.failure("emqp: removing an unreachable worker failed")

    def remove_worker(self, worker: Worker, reason: str, failed: bool = True) -> None:
        """Forget a worker; its unacked requests go back to their queues in order.

        ``broker.cancel`` counts a redelivery for each; requests that never
        reached the worker (or all of them, with ``failed=False`` as in a
        drain) have that undone first, so only a real failure uses up a
        ``retry-count``.
        """
        if worker.removed:
            return
        worker.removed = True
        if self.workers.get(worker.identity) is worker:
            del self.workers[worker.identity]
        for timer in worker.timers.values():
            if timer.active():
                timer.cancel()
        worker.timers.clear()
        held = {
            id(m): m for c in worker.connection.consumers.values() for m in c.unacked.values()
        }
        forgiven = held if not failed else {
            id(m): m for m in worker.undelivered if id(m) in held
        }
        for message in forgiven.values():
            message.retry -= 1
        worker.undelivered.clear()
        count = len(held)
        self.broker.connection_closed(worker.connection)
        log.info(
            "emqp: worker {worker} removed ({reason}); {count} requests requeued",
            worker=describe(worker.identity), reason=reason, count=count,
        )
        if self._drain is not None:
            self._drain.check()

    def _find(self, worker: Worker, msgid: bytes) -> tuple[Consumer, Message] | None:
        for consumer in worker.connection.consumers.values():
            message = consumer.unacked.get(msgid)
            if message is not None:
                return consumer, message
        return None

    def worker_reply(self, worker: Worker, result: bytes, msgid: bytes) -> None:
        """A worker's REPLY: settle the request, forward the result if it was asked for."""
        found = self._find(worker, msgid)
        if found is None:
            log.debug("emqp: REPLY for {msgid!r}, which is not in flight", msgid=msgid)
            return
        consumer, message = found
        timer = worker.timers.pop((consumer.queue.name, msgid), None)
        if timer is not None and timer.active():
            timer.cancel()
        if codec.is_timeout_reply(result):
            self._failed(consumer, message, result, "the worker timed it out")
        else:
            fields = message.headers or {}
            self.broker.ack(consumer, msgid)
            if H_REPLY in fields:
                self.send_result(fields.get(H_CLIENT), msgid, result)
        if self._drain is not None:
            self._drain.check()

    def _timed_out(self, worker: Worker, consumer: Consumer, msgid: bytes) -> None:
        try:
            worker.timers.pop((consumer.queue.name, msgid), None)
            message = consumer.unacked.get(msgid) if consumer.active else None
            if message is not None:
                self._failed(consumer, message, _TIMEOUT_RESULT, "its timeout passed")
        except Exception:
            log.failure("emqp: enforcing a request timeout failed")

    def _failed(self, consumer: Consumer, message: Message, result: bytes, why: str) -> None:
        fields = message.headers or {}
        limit = fields.get(MAX_RETRIES)
        final = limit is not None and message.retry + 1 > int(limit)
        msgid = message.id
        log.info("emqp: request {msgid!r} failed ({why}); {outcome}", msgid=msgid, why=why,
                 outcome=_outcome(consumer.queue, final))
        self.broker.reject(consumer, msgid)
        if final and H_REPLY in fields:
            self.send_result(fields.get(H_CLIENT), msgid, result)

    def send_result(self, client_hex: str | None, msgid: bytes, result: bytes) -> None:
        if not client_hex:
            return
        client = bytes.fromhex(client_hex)
        try:
            self.frontend.send(client, codec.message(REPLY, result, msgid))
        except UnroutableError:
            log.info(
                "emqp: client {client} is gone; result of {msgid!r} dropped",
                client=describe(client), msgid=msgid,
            )

    # -- heartbeats ---------------------------------------------------------

    def _beat(self) -> None:
        try:
            now = self.clock.seconds()
            stamp = repr(now).encode("ascii")
            for router, peers in ((self.backend, self.workers), (self.frontend, self.schedulers)):
                for identity, peer in list(peers.items()):
                    if now - peer.last_seen >= self.peer_timeout:
                        self._expire(identity, peer, now)
                        continue
                    with contextlib.suppress(UnroutableError):
                        router.send(identity, codec.message(codec.HEARTBEAT, stamp))
        except Exception:
            log.failure("emqp: heartbeat round failed; it runs again next interval")

    def _expire(self, identity: bytes, peer: Worker | Peer, now: float) -> None:
        reason = f"silent for {now - peer.last_seen:.1f} s"
        if isinstance(peer, Worker):
            self.remove_worker(peer, reason)
        else:
            self.schedulers.pop(identity, None)
            log.info("emqp: scheduler {id} removed ({reason})", id=describe(identity),
                     reason=reason)

    # -- DISCONNECT ---------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._drain is not None

    def disconnect(self) -> None:
        """Drain, KBYE every peer and stop (see ``drain``); a second one is ignored."""
        if self._drain is None:
            self._drain = Drain(self)
            self._drain.start()
