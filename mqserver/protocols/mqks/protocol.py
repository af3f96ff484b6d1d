# -*- test-case-name: tests.unit.test_mqks_protocol -*-
"""The MQKS server protocol: parse request lines, call the broker, write replies.

Parsing is one ``split`` per ``dataReceived`` chunk, then one per line into at
most four words, with dispatch through a dict of bound methods; a chunk's
publishes and plain acks go to the broker as runs, its confirmed publishes
wait for the store together (``publishing``, ``acking``); replies and
deliveries are buffered and written once per chunk (or once per reactor
turn for deliveries), never once per line (``output``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqserver.broker.overflow import QueueFullError
from mqserver.broker.queue import Consumer
from mqserver.interfaces import IClientConnection, IDeliverySink, IFlowControlled
from mqserver.limits import Limits, find_control
from mqserver.model import Message
from mqserver.protocols.backpressure import Backpressure
from mqserver.protocols.mqks import codec
from mqserver.protocols.mqks.acking import Acking
from mqserver.protocols.mqks.codec import MQKSError, with_data
from mqserver.protocols.mqks.evaluator import EvalError, safe_eval
from mqserver.protocols.mqks.output import Output
from mqserver.protocols.mqks.publishing import Publishing
from mqserver.protocols.mqks.stats_view import stats_names

log = Logger()

CHECKED_EVENTS = 65536
"""How many valid event names an MQKS factory remembers: as many as the broker
caches routes for.  A publish to an event it does not remember takes the
one-at-a-time path and checks the name again; with 4,096, publishes spread
over 10,000 queues' events all did (issue 19: 9.2 -> 7.8 us per message)."""


class MQKSFactory(Factory):
    """Shared by every MQKS connection: consumer ids are global, as in the original."""

    def __init__(
        self, broker: Any, max_line: int = 16 * 1024 * 1024, limits: Limits | None = None,
        workers: list[str] | None = None,
    ) -> None:
        self.broker = broker
        self.max_line = max_line
        self.limits = limits or Limits()
        self.consumers: dict[bytes, Consumer] = {}
        # this server's MQKS listeners, config['workers'] of _eval (``listening``)
        self.workers: list[str] = workers if workers is not None else []
        # event names that passed the name check: a publish looks its event up
        # here instead of checking it again (bounded: cleared when full)
        self.checked_events: set[bytes] = set()
        # while an MQKS connection handles a received chunk: the other
        # connections it gave output (deliveries), flushed at the chunk's end
        # instead of by a timer each (at a low rate, a message per chunk)
        self.chunk_outputs: list[MQKSProtocol] | None = None

    def check_event(self, event: bytes) -> None:
        """Raise ``MQKSError`` unless ``event`` is a valid name; remember the valid ones."""
        self.limits.check_name(event, "name", MQKSError)
        if len(self.checked_events) >= CHECKED_EVENTS:
            self.checked_events.clear()
        self.checked_events.add(event)

    def listening(self, address: Any) -> None:
        """A listener of this factory got ``address``: list it in ``config['workers']``.

        The original's entries are ``host:port_for_workers:port_for_clients``;
        its client connects to the last field and its stats tool groups by
        the first, so a TCP listener is ``host:port:port``.  A Unix socket
        has no such entry.
        """
        port = getattr(address, "port", None)
        if port is not None:
            self.workers.append(f"{address.host}:{port}:{port}")

    def buildProtocol(self, addr: Any) -> MQKSProtocol:
        protocol = MQKSProtocol(self)
        protocol.factory = self
        return protocol

    def refusal(self, reason: str) -> bytes:
        """The line a connection over ``--max-connections`` gets before the close."""
        eid = codec.error_id(self.broker.clock.seconds())
        log.warn("mqks error {eid}: connection refused: {reason}",
                 eid=eid.decode("ascii"), reason=reason)
        return b"None error %s\n" % eid

    def consumer(self, consumer_id: bytes) -> Consumer | None:
        """The live consumer with this id (one removed by delete_queue is gone)."""
        consumer = self.consumers.get(consumer_id)
        if consumer is not None and not consumer.active:
            del self.consumers[consumer_id]
            return None
        return consumer


@implementer(IDeliverySink, IPushProducer, IClientConnection, IFlowControlled)
class MQKSProtocol(Backpressure, Output, Publishing, Acking, Protocol):
    """One MQKS client; ``Backpressure`` pauses its deliveries while it cannot take them."""

    def __init__(self, factory: MQKSFactory) -> None:
        self.factory = factory
        self.broker = factory.broker
        self.max_line = factory.max_line
        self.limits = factory.limits
        self._max_id = self.limits.max_id
        self._checked_events = factory.checked_events
        self.connection: Any = None
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._out: list[bytes] = []
        self._held: dict[Consumer, list[bytes]] = {}
        self._flush_due = False
        self._receiving = False
        self._closing = False
        self._run: list[tuple[bytes, bytes]] = []
        self._run_confirms: list[int] = []
        self._confirms: list[bytes] = []
        self._acks: list[list[bytes]] = []

    # -- connection ---------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        peer_text = f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
        self.connection = self.broker.connection_opened("mqks", peer_text, self)
        self.transport.registerProducer(self, True)
        log.info("mqks connection {id} opened from {peer}", id=self.connection.id, peer=peer_text)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._out = []  # a flush still due finds nothing to write
        self._held = {}
        if self.connection is None:
            return
        for consumer_id, consumer in list(self.connection.consumers.items()):
            if self.factory.consumers.get(consumer_id) is consumer:
                del self.factory.consumers[consumer_id]
        self.broker.connection_closed(self.connection)
        log.info(
            "mqks connection {id} closed: {reason}",
            id=self.connection.id,
            reason=reason.getErrorMessage(),
        )

    # IFlowControlled: the memory alarm stops reading from publishers
    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.transport.resumeProducing()

    def close(self, reason: str) -> None:
        """IClientConnection: an operator drops this client (HTTP API)."""
        log.info("mqks connection {id} closed by the server: {reason}",
                 id=self.connection.id if self.connection else None, reason=reason)
        self._closing = True
        # answers already made (a shutdown's confirms) go out before the close
        self._flush()
        self.transport.loseConnection()

    # -- parsing ------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        if codec.LF not in data:
            self._pending.append(data)
            self._pending_size += len(data)
            if self._pending_size > self.max_line:
                self._line_too_long()
            return
        if self._pending:
            self._pending.append(data)
            data = b"".join(self._pending)
            self._pending = []
        lines = data.split(b"\n")
        rest = lines.pop()
        self._pending_size = len(rest)
        if rest:
            self._pending.append(rest)
        self._receiving = True
        self.broker.hold_pump()
        factory = self.factory
        outer, factory.chunk_outputs = factory.chunk_outputs, []
        try:
            request, max_line = self._request, self.max_line
            if len(data) <= max_line:  # the usual chunk: none of its lines can be too long
                for line in lines:
                    request(line)
            else:
                for line in lines:
                    if len(line) > max_line:
                        self._line_too_long()
                        return
                    request(line)
            if self._pending_size > max_line:
                self._line_too_long()
        finally:
            self._store_runs()  # the chunk's pump delivers its publishes, acks make room
            # deliveries to this connection join its replies in one write
            self.broker.pump_now()
            self._receiving = False
            self._flush()
            others, factory.chunk_outputs = factory.chunk_outputs, outer
            for other in others:
                other._flush(deliveries=True)

    def _request(self, line: bytes) -> None:
        # At most four words: id, action, and a publish's event and body or an
        # ack's consumer and message ids, so those need no second split.
        words = line.rstrip().split(b" ", 3)
        if len(words) == 4:
            action = words[1]
            if action == b"publish":
                if self._gather(words):
                    return  # stored with the chunk's run of publishes (``publishing``)
            elif action == b"ack" and self._gather_ack(words):
                return  # settled with the chunk's run of acks (``acking``)
        self._store_runs()  # whatever this line does or answers comes after them
        if len(words) < 3:
            self._error(b"None", "a request needs an id, an action and data")
            return
        request_id = words[0]
        if not 0 < len(request_id) <= self._max_id or not (
            request_id.isalnum() or find_control(request_id) is None
        ):
            try:
                self.limits.check_id(request_id, "request id", MQKSError)
            except MQKSError as e:
                # not echoed: the id itself is what is wrong (too long, control characters)
                self._error(b"None", str(e))
                return
        handler = ACTIONS.get(words[1])
        if handler is None:
            self._error(request_id, f"unknown action {words[1]!r}")
            return
        try:
            handler(self, request_id, words)
        except (MQKSError, EvalError, QueueFullError) as e:
            self._error(request_id, str(e))
        except Exception:
            log.failure("mqks {action} failed", action=words[1])
            self._error(request_id, "internal error")

    def _names(self, queue: bytes, *groups: list[bytes]) -> None:
        """Queue and event names (and masks) obey ``--max-name-bytes`` and its characters,
        and one request lists at most ``--max-names-per-request`` events and masks."""
        check = self.limits.check_name
        check(queue, "name", MQKSError)
        self.limits.check_names(sum(map(len, groups)), "events and masks", MQKSError)
        for group in groups:
            for name in group:
                check(name, "name", MQKSError)

    def _line_too_long(self) -> None:
        self._store_runs()  # the lines before this one are answered before it
        self._pending = []
        self._pending_size = 0
        self._error(b"None", f"request line longer than {self.max_line} bytes")
        self._flush()
        self._closing = True
        self.transport.loseConnection()

    # -- IDeliverySink ------------------------------------------------------

    def deliver(self, consumer: Consumer, message: Message) -> None:
        data = codec.delivery(consumer.id, message)
        held = self._held
        if held and consumer in held:
            # after its consume's ``ok `` (``Output``); a resume unpaused it: pause it
            # again, so the dispatch hands it no more than this one meanwhile
            held[consumer].append(data)
            consumer.paused = True
        else:
            self._write(data)
        self._count_output(len(data))

    def queue_changed(self, consumer: Consumer) -> None:
        queue = consumer.queue
        options = queue.options
        events = set() if queue.deleted else self.broker.bindings.events_of(queue.name)
        self._write(
            codec.update_line(
                consumer.id,
                queue.name,
                events,
                options.delete_when_unused,
                options.delete_when_unused_bare,
                consumer.manual_ack,
            )
        )

    # -- actions ------------------------------------------------------------

    def _consume(self, consumer_id: bytes, data: bytes) -> None:
        args = codec.parse_consume(data, self.limits.max_names)
        self._names(args.queue, args.replace, args.add)
        broker = self.broker
        old = self.factory.consumer(consumer_id)
        if old is not None:
            broker.cancel(old)
        queue = broker.declare_queue(args.queue)
        options = dataclasses.replace(
            queue.options,
            delete_when_unused=args.delete_when_unused,
            delete_when_unused_bare=args.bare,
        )
        if args.max_length is not None:
            options = dataclasses.replace(options, max_length=args.max_length)
        if args.overflow is not None:
            options = dataclasses.replace(options, overflow=args.overflow)
        consumer = broker.consume(
            self.connection, consumer_id, args.queue, window=None, manual_ack=args.manual_ack
        )
        self.factory.consumers[consumer_id] = consumer
        broker.reconfigure(
            args.queue,
            replace=args.replace or None,
            add=args.add,
            options=options,
            notify_except=None if args.has_add else consumer,
        )
        if args.confirm:
            self._confirm_consume(consumer_id, consumer)

    def _rebind(self, request_id: bytes, data: bytes) -> None:
        args = codec.parse_rebind(data, self.limits.max_names)
        self._names(args.queue, args.replace, args.remove, args.remove_mask, args.add)
        if args.remove_all:
            self.broker.reconfigure(args.queue, remove=self.broker.bindings.events_of(args.queue))
        else:
            self.broker.reconfigure(
                args.queue,
                replace=args.replace or None,
                remove=args.remove,
                remove_masks=args.remove_mask,
                add=args.add,
            )
        if args.confirm:
            self._confirm(request_id)

    def _settle(self, request_id: bytes, words: list[bytes], one: Any, every: Any) -> None:
        confirm, consumer_id, message_id = codec.parse_settle_words(words)
        # The id checks run only where an id matched nothing: a consumer's id
        # was checked by its consume, an unacked message's by its publish
        # (two checks less per ack on the hot path, the same answers).
        consumer = self.factory.consumer(consumer_id)
        if consumer is None:
            self.limits.check_id(consumer_id, "consumer id", MQKSError)
            if message_id != codec.ALL:
                self.limits.check_id(message_id, "message id", MQKSError)
            return  # the original answers nothing here, even with --confirm
        if message_id == codec.ALL:
            every(consumer)
        elif not one(consumer, message_id):
            self.limits.check_id(message_id, "message id", MQKSError)
        if confirm:
            self._confirm(request_id)

    def _ack(self, request_id: bytes, words: list[bytes]) -> None:
        self._settle(request_id, words, self.broker.ack, self.broker.ack_all)

    def _reject(self, request_id: bytes, words: list[bytes]) -> None:
        self._settle(request_id, words, self.broker.reject, self.broker.reject_all)

    def _delete_consumer(self, request_id: bytes, data: bytes) -> None:
        confirm, consumer_id = codec.parse_single(data, "consumer id")
        self.limits.check_id(consumer_id, "consumer id", MQKSError)
        consumer = self.factory.consumer(consumer_id)
        if consumer is None:
            return
        del self.factory.consumers[consumer_id]
        self.broker.cancel(consumer)
        if confirm:
            self._confirm(request_id)

    def _delete_queue(self, request_id: bytes, data: bytes) -> None:
        confirm, queue = codec.parse_single(data, "queue")
        self._names(queue)
        self.broker.delete_queue(queue)
        if confirm:
            self._confirm(request_id)

    def _ping(self, request_id: bytes, data: bytes) -> None:
        confirm, data = codec.strip_confirm(data)
        self._ok(request_id, data)
        if confirm:
            # after the pong, as the original answered: its client's
            # ping(confirm=True) waits for this bare confirm (the original
            # server never sent one, so that call blocked there)
            self._ok(request_id)

    def _eval(self, request_id: bytes, data: bytes) -> None:
        # the original strips --confirm from every action; _eval answers with its result only
        worker, code = codec.parse_eval(codec.strip_confirm(data)[1])
        if worker not in (None, 0):
            raise MQKSError(f"no worker {worker}: this server is worker 0 of 1")
        names = stats_names(
            self.broker, self.factory.consumers, self.connection.id, request_id,
            self.factory.workers,
        )
        text = str(safe_eval(code, names))
        try:
            result = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate that no name produced
            result = text.encode("utf-8", "backslashreplace")
        self._ok(request_id, codec.escape_body(result))


ACTIONS: dict[bytes, Callable[[MQKSProtocol, bytes, list[bytes]], None]] = {
    b"publish": MQKSProtocol._publish,
    b"ack": MQKSProtocol._ack,
    b"reject": MQKSProtocol._reject,
    b"consume": with_data(MQKSProtocol._consume),
    b"rebind": with_data(MQKSProtocol._rebind),
    b"delete_consumer": with_data(MQKSProtocol._delete_consumer),
    b"delete_queue": with_data(MQKSProtocol._delete_queue),
    b"ping": with_data(MQKSProtocol._ping),
    b"_eval": with_data(MQKSProtocol._eval),
}
"""Each action's handler of (protocol, request id, words), one table for every
connection (a table of bound methods each was half of what an idle connection
holds, issue 19).  The hot actions take the request's words as ``_request``
split them; the others take their data, everything after the action, as sent."""
