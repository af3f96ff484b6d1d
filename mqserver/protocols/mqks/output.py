# -*- test-case-name: tests.unit.test_mqks_output -*-
"""What an MQKS connection writes: replies, errors, confirms and deliveries, buffered.

A connection's output is collected while it handles a received chunk (and
while another connection's chunk delivers to it) and written once at the
chunk's end; output made outside any chunk (a timer's delivery, a confirm
whose batch became durable) is written once at the next reactor turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from mqserver.protocols.mqks import codec

# the namespace operators filter MQKS errors on (they were logged by protocol.py)
log = Logger(namespace="mqserver.protocols.mqks.protocol")


def send_now(transport: Any) -> None:
    """Have a TCP transport send what it buffered now, not at the reactor's next write pass.

    ``transport.write`` only buffers: the reactor sends once the next poll
    reports the socket writable, a whole poll later.  For a delivery to a
    consumer that waits, that poll is most of the latency at low rates.
    ``doWrite`` is what the reactor would call then; it sends what the socket
    takes and leaves the rest (and any error) to the reactor, which keeps
    watching the socket while data is left.  Not while the connection is
    closing: there the reactor's own ``doWrite`` finishes the close.  A
    transport without ``doWrite`` (TLS over memory BIOs, test transports)
    writes as usual.
    """
    send = getattr(transport, "doWrite", None)  # a wrapper forwards to the TCP connection
    if send is not None and not getattr(send.__self__, "disconnecting", True):
        send()


class Output:
    """The output half of ``MQKSProtocol`` (a mixin: it uses the protocol's attributes)."""

    factory: Any
    broker: Any
    transport: Any
    connection: Any
    _out: list[bytes]
    _held: dict[Any, list[bytes]]
    _flush_due: bool
    _receiving: bool
    _output_flushed: Callable[[], None]  # Backpressure's

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if self._receiving or self._flush_due:
            return  # the end of this chunk, or a flush already due, writes it
        self._flush_due = True
        waiting = self.factory.chunk_outputs
        if waiting is not None:
            waiting.append(self)  # another connection's chunk made it
        else:
            self.broker.clock.callLater(0, self._flush)

    def _flush(self, deliveries: bool = False) -> None:
        """Hand the buffered output to the transport.

        ``deliveries``: the output is what another connection's chunk
        delivered here (a publish to a waiting consumer), so it is sent in
        this reactor turn (``send_now``).  A connection's answers to its own
        chunk keep the reactor's write pass: a client that pipelines gets
        them batched with whatever else arrives meanwhile.
        """
        self._flush_due = False
        if self._out:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))
            if deliveries:
                send_now(self.transport)
            self._output_flushed()

    def _error(self, request_id: bytes, detail: str) -> None:
        eid = codec.error_id(self.broker.clock.seconds())
        log.warn(
            "mqks error {eid} on connection {conn} for request {rid!r}: {detail}",
            eid=eid.decode("ascii"),
            conn=self.connection.id if self.connection else None,
            rid=request_id,
            detail=detail,
        )
        self._write(b"%s error %s\n" % (request_id, eid))

    def _ok(self, request_id: bytes, data: bytes = b"") -> None:
        self._write(b"%s ok %s\n" % (request_id, data))

    def _confirm(self, request_id: bytes) -> None:
        """``ok `` once everything this request changed is durable."""
        d = self.broker.durable()
        if d.called:
            d.addErrback(self._confirm_failed, request_id)
            self._ok(request_id)
            return
        d.addCallbacks(
            lambda _: self._ok(request_id), self._confirm_failed, errbackArgs=(request_id,)
        )

    def _confirm_all(self, request_ids: list[bytes]) -> None:
        """``_confirm`` of several requests: one wait, their ``ok `` lines in one write.

        One wait for everything the requests changed is the same as a wait
        after each: it fires once the last of them is durable, and ops of
        one reactor turn share a batch.  Failed, each gets its own error.
        """
        self.broker.durable().addCallbacks(
            self._confirmed, self._confirms_failed,
            callbackArgs=(request_ids,), errbackArgs=(request_ids,),
        )

    def _confirmed(self, _: object, request_ids: list[bytes]) -> None:
        self._write(b" ok \n".join(request_ids) + b" ok \n")

    def _confirms_failed(self, failure: Failure, request_ids: list[bytes]) -> None:
        for request_id in request_ids:
            self._confirm_failed(failure, request_id)

    def _confirm_consume(self, consumer_id: bytes, consumer: Any) -> None:
        """A consume's ``ok ``, before any delivery to the new consumer.

        The original answered ``ok `` first and then started delivering.
        Here the confirm waits for the store (``_confirm``) while the queue
        may already hold messages (a consumer that just left returned its
        unacked ones): the consumer is kept out of dispatch until the
        confirm is written, and anything it is handed meanwhile (a
        ``resumeProducing`` clears every pause of the connection) is held
        in ``_held`` and written after the confirm.
        """
        d = self.broker.durable()
        if d.called:
            d.addErrback(self._confirm_failed, consumer_id)
            self._ok(consumer_id)
            return
        self._held[consumer] = []
        consumer.paused = True
        d.addCallbacks(lambda _: self._ok(consumer_id), self._confirm_failed,
                       errbackArgs=(consumer_id,))
        d.addCallback(self._release, consumer)

    def _release(self, _: object, consumer: Any) -> None:
        """The consume's confirm is written: its consumer's deliveries follow it."""
        for data in self._held.pop(consumer, ()):
            self._write(data)
        if consumer.active:
            consumer.paused = self.connection.paused
            # set_window kicks the queue: what waited for the confirm is dispatched
            self.broker.set_window(consumer, consumer.window)

    def _confirm_failed(self, failure: Failure, request_id: bytes) -> None:
        self._error(request_id, f"storage failed: {failure.getErrorMessage()}")
