# -*- test-case-name: tests.unit.test_phpmq_protocol -*-
"""The PHPMQ server protocol: decode frames, call the broker, write dispatches.

PHPMQ has no replies and no error frame: the server only ever sends 003
dispatches.  So a malformed frame can only be answered by closing that one
connection (the original server crashed instead).  Dispatches are buffered
and written once per reactor turn; the broker's per-consumer window is the
PHPMQ "count for consumption" credit.
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
from mqserver.limits import Limits
from mqserver.model import Message, QueueOptions
from mqserver.protocols.backpressure import Backpressure
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import (
    ACK,
    CONSUME,
    CONTENT,
    COUNT,
    DEAD_LETTER,
    DISPATCH,
    PUBLISH,
    QUEUE,
    REQUEUE,
    TTL,
    FrameDecoder,
    PHPMQError,
    Run,
)
from mqserver.protocols.phpmq.settling import Settling

log = Logger()

CONSUMER_ID = b"phpmq"
"""A PHPMQ connection consumes one queue at a time, so one consumer id suffices:
``broker.consume`` with the same id replaces (and requeues) the previous one,
which is exactly what a second 002 must do."""

ID_BATCH = 256
"""Message ids a factory draws at once."""


class PHPMQFactory(Factory):
    """Settings shared by every PHPMQ connection.

    ``revision`` None detects per connection (2017 until the client sends a
    frame only revision 2018 has); 2017 or 2018 fixes the 003 form, for 2018
    clients that only consume and so never reveal their revision.
    ``dead_letter_suffix`` (bytes, empty for none) gives every queue PHPMQ
    touches the dead-letter queue ``name + suffix``.
    """

    def __init__(
        self,
        broker: Any,
        max_content: int = codec.DEFAULT_MAX_CONTENT,
        dead_letter_suffix: bytes = b"",
        revision: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.broker = broker
        self.max_content = max_content
        self.limits = limits or Limits()
        self.dead_letter_suffix = dead_letter_suffix
        self.revision = revision
        self._ids: list[bytes] = []

    def new_message_id(self) -> bytes:
        """A fresh server id for a 001, from a batch of ``codec.message_ids``
        (one system call per batch instead of per message)."""
        if not self._ids:
            self._ids = codec.message_ids(ID_BATCH)
        return self._ids.pop()

    def new_message_ids(self, count: int) -> list[bytes]:
        """``count`` fresh server ids at once (a run of 001s)."""
        ids = self._ids
        while len(ids) < count:
            ids.extend(codec.message_ids(ID_BATCH))
        taken = ids[-count:]
        del ids[-count:]
        return taken

    def buildProtocol(self, addr: Any) -> PHPMQProtocol:
        protocol = PHPMQProtocol(self)
        protocol.factory = self
        return protocol


@implementer(IDeliverySink, IPushProducer, IClientConnection, IFlowControlled)
class PHPMQProtocol(Settling, Backpressure, Protocol):
    """One PHPMQ client; ``Backpressure`` pauses its dispatches while it cannot take them."""

    def __init__(self, factory: PHPMQFactory) -> None:
        self.factory = factory
        self.broker = factory.broker
        self.decoder = FrameDecoder(factory.max_content)
        self.connection: Any = None
        self.peer = "?"
        self.consumer: Consumer | None = None
        self.revision = factory.revision or 2017
        self._detect = factory.revision is None
        self._refused = 0
        self._valid_name: bytes | None = None
        self._heads: dict[bytes, bytes] = {}
        self._out: list[bytes] = []
        self._flush_call: Any = None
        self._receiving = False
        self._closing = False

    # -- connection ---------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
        self.connection = self.broker.connection_opened("phpmq", self.peer, self)
        self.transport.registerProducer(self, True)
        log.info("phpmq connection {id} opened from {peer}", id=self.connection.id, peer=self.peer)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._closing = True
        self._cancel_flush()
        self._out = []
        self.consumer = None
        if self.connection is None:
            return
        self.broker.connection_closed(self.connection)
        log.info(
            "phpmq connection {id} closed: {reason}",
            id=self.connection.id,
            reason=reason.getErrorMessage(),
        )

    # IFlowControlled: the memory alarm stops reading from publishers
    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        if not self._closing:
            self.transport.resumeProducing()

    def close(self, reason: str) -> None:
        """IClientConnection: an operator drops this client (HTTP API)."""
        if not self._closing:
            self._close(reason)

    # -- input --------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Handle every frame the chunk completes, then dispatch what they made
        ready (``broker.pump_now``) and write this connection's dispatches:
        deliveries an ack frees go out in the same turn, in one write."""
        if self._closing:
            return
        decoder = self.decoder
        decoder.feed(data)
        self._receiving = True
        try:
            self._handle(decoder)
            if not self._closing:
                self.broker.pump_now()
        finally:
            self._receiving = False
        self._flush()

    def _handle(self, decoder: FrameDecoder) -> None:
        """Every frame the decoder has complete: one whose handler fails closes
        the connection, and the frames after it are not handled."""
        handlers, run_handlers = HANDLERS, RUN_HANDLERS
        try:
            while items := decoder.read():
                for item in items:
                    if item.__class__ is Run:
                        run_handlers[item.type](self, item)
                    else:
                        handlers[item.type](self, item.packages)
        except PHPMQError as e:
            self._close(f"malformed frame: {e}")
        except Exception:
            log.failure("phpmq connection {id}: handling a frame failed", id=self.connection.id)
            self._close("internal error")

    def _speaks_2018(self) -> None:
        """The client sent a frame only revision 2018 has (a 001 with a TTL, a 005
        or a 006): with ``--phpmq-revision=auto`` its 003s get the TTL from now on."""
        if self._detect:
            self._detect = False
            self.revision = 2018
            self._heads.clear()
            log.info("phpmq connection {id} speaks revision 2018", id=self.connection.id)

    def _close(self, reason: str) -> None:
        """Drop the connection (the only error report PHPMQ has) and say why in the log.

        Delivery stops at once; unsent dispatches are dropped, and their
        messages go back to the queue when the connection is gone.
        """
        log.warn(
            "phpmq connection {id} from {peer} closed by the server: {reason}",
            id=self.connection.id,
            peer=self.peer,
            reason=reason,
        )
        self._closing = True
        self._cancel_flush()
        self._out = []
        self.broker.pause(self.connection)
        self.transport.loseConnection()

    # -- frames -------------------------------------------------------------

    def _checked_name(self, name: bytes) -> bytes:
        """``name`` if it obeys the server's limits (``mqserver.limits``): the
        original took any bytes, but a name other protocols cannot show is
        refused.  A connection names the same queue frame after frame, so the
        last valid name is remembered and not checked again."""
        if name != self._valid_name:
            self.factory.limits.check_name(name, "queue name", PHPMQError)
            self._valid_name = name
        return name

    def _checked_id(self, message_id: bytes) -> bytes:
        return self.factory.limits.check_id(message_id, "message id", PHPMQError)

    def _queue(self, name: bytes) -> bytes:
        """The queue a 001 or 002 names, checked, with the dead-letter option applied to it."""
        if name != self._valid_name:  # the check's own shortcut, one call earlier
            self._checked_name(name)
        suffix = self.factory.dead_letter_suffix
        if suffix and not name.endswith(suffix):
            queue = self.broker.queues.get(name)
            if queue is None:
                self.broker.declare_queue(name, QueueOptions(dead_letter=name + suffix))
            elif queue.options.dead_letter is None:
                options = dataclasses.replace(queue.options, dead_letter=name + suffix)
                self.broker.declare_queue(name, options)
        return name

    def _publish(self, packages: dict[int, bytes]) -> None:
        queue = self._queue(packages[QUEUE])
        ttl_text = packages.get(TTL)
        if ttl_text is None:
            ttl = 0
        else:
            self._speaks_2018()
            ttl = codec.parse_number(ttl_text, "TTL")
        # 0 (the 2018 client's default) and absent (2017) both mean "none chosen"
        if not self._publisher:
            self._publishing()
        try:
            self.broker.publish_to_queue(
                queue, self.factory.new_message_id(), packages[CONTENT], None, ttl or None, "phpmq"
            )
        except QueueFullError as e:
            self._refuse(e)

    def _publish_run(self, run: Run) -> None:
        """2017 001s to one queue (``codec.Run``): ``_publish`` with the queue's
        name checked and its dead-letter option applied once for all of them,
        and one broker run (``publish_to_queue_run``)."""
        queue = self._queue(run.queue)
        if not self._publisher:
            self._publishing()
        ids = self.factory.new_message_ids(len(run.values))
        entries = list(zip(ids, run.values, strict=True))
        while entries:
            try:
                self.broker.publish_to_queue_run(queue, entries, None, None, "phpmq")
                return
            except QueueFullError as e:
                self._refuse(e)
                entries = entries[e.stored + 1:]  # the refused one is dropped; the rest try

    def _refuse(self, e: QueueFullError) -> None:
        """PHPMQ has no reply to carry a refusal, and closing would also drop
        whatever the client pipelined behind it: the message is dropped,
        counted on the queue (``refused``) and logged once per connection."""
        if not self._refused:
            log.warn("phpmq connection {id}: {e}; publishes to full queues are dropped",
                     id=self.connection.id, e=e)
        self._refused += 1

    def _each_frame(self, run: Run) -> None:
        """A run of frames with no shortcut of its own (002, 006): one at a time."""
        handler = HANDLERS[run.type]
        for frame in run.frames():
            handler(self, frame.packages)

    def _consume(self, packages: dict[int, bytes]) -> None:
        queue = self._queue(packages[QUEUE])
        count = codec.parse_number(packages[COUNT], "count")
        if count == 0:
            if self.consumer is not None:
                self.broker.cancel(self.consumer)
                self.consumer = None
            return
        self.consumer = self.broker.consume(
            self.connection, CONSUMER_ID, queue, window=count, manual_ack=True
        )

    def _from_server(self, packages: dict[int, bytes]) -> None:
        raise PHPMQError("message type 003 (dispatch) is only sent by servers")

    # -- IDeliverySink ------------------------------------------------------

    def deliver(self, consumer: Consumer, message: Message) -> None:
        if self._closing:
            return
        queue = message.queue
        head = self._heads.get(queue) or self._head(queue)
        if self.revision == 2018:
            ttl = codec.remaining_ttl(message.expires_at, self.broker.clock.seconds())
            data = codec.dispatch(queue, message.body, message.id, ttl, head)
        else:
            data = codec.dispatch(queue, message.body, message.id, None, head)
        self._out.append(data)
        # written at the end of the chunk being received, else once per turn
        if self._flush_call is None and not self._receiving:
            self._flush_call = self.broker.clock.callLater(0, self._flush)
        self._count_output(len(data))

    def _head(self, queue: bytes) -> bytes:
        """``codec.dispatch_head`` of ``queue`` in this connection's revision, kept
        for the next dispatches (a connection consumes one queue at a time)."""
        if len(self._heads) >= 16:
            self._heads.clear()
        head = self._heads[queue] = codec.dispatch_head(queue, self.revision == 2018)
        return head

    def queue_changed(self, consumer: Consumer) -> None:
        """PHPMQ cannot tell a client anything; only forget a consumer whose queue
        was deleted (through another protocol), so the next 002 starts afresh."""
        if consumer.queue.deleted and consumer is self.consumer:
            self.consumer = None
            log.info(
                "phpmq connection {id}: queue {queue!r} was deleted, consumption ended",
                id=self.connection.id,
                queue=consumer.queue.name,
            )

    # -- output -------------------------------------------------------------

    def _flush(self) -> None:
        self._cancel_flush()
        if self._out:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))
            self._output_flushed()

    def _cancel_flush(self) -> None:
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None


HANDLERS: dict[int, Callable[[PHPMQProtocol, dict[int, bytes]], None]] = {
    PUBLISH: PHPMQProtocol._publish,
    CONSUME: PHPMQProtocol._consume,
    ACK: PHPMQProtocol._ack,
    REQUEUE: PHPMQProtocol._requeue,
    DEAD_LETTER: PHPMQProtocol._dead_letter,
    DISPATCH: PHPMQProtocol._from_server,
}
"""Each frame type's handler of (protocol, packages), one table for every
connection (tables of bound methods were a quarter of what an idle
connection holds, issue 19)."""

RUN_HANDLERS: dict[int, Callable[[PHPMQProtocol, Run], None]] = {
    PUBLISH: PHPMQProtocol._publish_run,
    ACK: PHPMQProtocol._ack_run,
    CONSUME: PHPMQProtocol._each_frame,
    DEAD_LETTER: PHPMQProtocol._each_frame,
}
"""The handlers of runs of repeated frames (``Run``), likewise."""
