# -*- test-case-name: tests.unit.test_zmtp_router -*-
"""One peer of a ZMTP ROUTER (``mqserver.zmtp.router``): handshake, framing, flow.

Split from the factory so each module holds one thing: this is the
per-connection state machine (greeting, NULL handshake, then whole
multipart messages), its batched writes and its backpressure.
"""

from __future__ import annotations

from operator import length_hint
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from mqserver.interfaces import IFlowControlled
from mqserver.zmtp import codec
from mqserver.zmtp.codec import COMMAND, ZMTPError, describe
from mqserver.zmtp.decoder import MessageDecoder

if TYPE_CHECKING:
    from mqserver.zmtp.router import ZMTPRouterFactory

log = Logger()

ROUTER = b"ROUTER"
FLUSH_AT = 64 * 1024
"""Bytes of held writes that go out at once: the transport's high-water mark."""

_GREETING, _HANDSHAKE, _READY, _CLOSED = range(4)


@implementer(IPushProducer, IFlowControlled)
class ZMTPConnection(TwistedProtocol):
    """One peer: greeting, NULL handshake, then multipart messages.

    Backpressure: the connection is its transport's streaming producer, so
    ``paused`` is True while the peer is not reading what we write (the
    transport's buffer is over its high-water mark) and ``factory.on_flow``
    is told.  Reading can be held for several reasons at once (the memory
    alarm, a full outgoing buffer); it resumes when none is left.
    """

    factory: ZMTPRouterFactory

    def __init__(self, factory: ZMTPRouterFactory) -> None:
        self.factory = factory
        self.identity: bytes | None = None
        self.peer = "?"
        self.version = (3, 0)
        self._state = _GREETING
        self._greeting = b""
        self._decoder = MessageDecoder(factory.max_message_size, factory.max_frames)
        self._lost = False
        self._waiters: list[Deferred[None]] = []
        self._handshake_timer: Any = None
        self.paused = False
        self.publisher = False  # registered with the memory alarm (see IFlowControlled)
        self._holds: set[str] = set()
        # writes held until the chunk handled or the reactor turn ends (see ``write``)
        self._batch: list[bytes] | None = None
        self._batched = 0  # its bytes: past FLUSH_AT it goes out at once
        # the run of messages the handler is taking (see ``_deliver``)
        self._run: list[list[bytes]] = []

    def connectionMade(self) -> None:
        address = self.transport.getPeer()
        self.peer = f"{getattr(address, 'host', address)}:{getattr(address, 'port', '')}"
        self.factory.connections.add(self)
        self.transport.registerProducer(self, True)
        self.transport.write(codec.greeting())
        if self.factory.clock is not None:
            # a peer that never finishes the handshake must not hold a socket forever
            self._handshake_timer = self.factory.clock.callLater(
                self.factory.handshake_timeout, self._fail, "no handshake in time"
            )

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._state = _CLOSED
        self._run.clear()
        self._lost = True
        self._stop_handshake_timer()
        self.factory._unregister(self)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def close(self) -> Deferred[None]:
        """Flush what was written, then disconnect; fires once the connection is gone."""
        if self._lost:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        if self._state != _CLOSED:
            self._state = _CLOSED
            self._run.clear()
            self.flush()
            # a paused producer would keep the transport open once it drained
            self.transport.unregisterProducer()
            self.transport.loseConnection()
        return waiter

    # -- flow control ---------------------------------------------------------

    def pauseProducing(self) -> None:
        """IPushProducer: our writes to the peer back up."""
        self.paused = True
        self._flow(True)

    def resumeProducing(self) -> None:
        self.paused = False
        self._flow(False)

    def stopProducing(self) -> None:
        """The transport is going away; ``connectionLost`` cleans up."""

    def _flow(self, paused: bool) -> None:
        on_flow = self.factory.on_flow
        if on_flow is not None and self.identity is not None and not self._lost:
            on_flow(self, paused)

    def hold_reading(self, reason: str) -> None:
        """Stop reading from the peer until every reason is released."""
        if not self._holds and not self._lost:
            self.transport.pauseProducing()
        self._holds.add(reason)

    def release_reading(self, reason: str) -> None:
        if reason in self._holds:
            self._holds.discard(reason)
            if not self._holds and not self._lost:
                self.transport.resumeProducing()

    def pause_reading(self) -> None:
        """IFlowControlled: the memory alarm."""
        self.hold_reading("memory")

    def resume_reading(self) -> None:
        self.release_reading("memory")

    def write(self, data: bytes) -> None:
        """Write encoded frames, joined into one write per chunk handled or,
        with a clock, per reactor turn (deliveries the core pumps, answers to
        another connection's messages)."""
        batch = self._batch
        if batch is None:
            if self.factory.clock is None:
                self.transport.write(data)
                return
            batch = self._batch = []
            self.factory.clock.callLater(0, self.flush)
        batch.append(data)
        self._batched += len(data)
        if self._batched >= FLUSH_AT:
            # the transport must see it now to pause us (backpressure); what
            # follows is held again until the pending flush
            self.flush()
            self._batch = []

    def flush(self) -> None:
        """Write what ``write`` holds now."""
        batch, self._batch, self._batched = self._batch, None, 0
        if batch and not self._lost:
            self.transport.write(b"".join(batch))

    # -- input --------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._state == _CLOSED:
            return
        try:
            if self._state != _READY:
                self._before_ready(data)
                if self._state != _READY:
                    return
                data = b""  # the rest of it waits in the decoder
            decoder = self._decoder
            if self._batch is None:
                self._batch = []
            try:
                self._dispatch(decoder.feed(data))
            finally:
                self.flush()
            if decoder.error is not None and self._state != _CLOSED:
                raise decoder.error
        except codec.TooLargeError as e:
            # ZMTP 3.1's ERROR command tells the peer why before we close; a 3.0
            # peer does not know the command, so it only sees the close
            if self.version >= (3, 1):
                self.transport.write(codec.error_command(str(e).encode("ascii", "replace")))
            self._fail(str(e))
        except ZMTPError as e:
            self._fail(str(e))

    def _before_ready(self, data: bytes) -> None:
        """The greeting, then the handshake a frame at a time (a message frame
        before READY is an error, not part of a message)."""
        if self._state == _GREETING:
            data = self._read_greeting(data)
        while self._state == _HANDSHAKE and (frame := self._decoder.frame(data)) is not None:
            data = b""
            self._handshake(*frame)

    def _dispatch(self, items: list[list[bytes] | bytes]) -> None:
        """Hand each run of consecutive messages to the handler in one call and
        answer each command in its place between them."""
        identity = self.identity
        i, count = 0, len(items)
        while i < count and self._state != _CLOSED and identity is not None:
            item = items[i]
            if isinstance(item, bytes):
                self._command(item)
                i += 1
                continue
            end = i + 1
            while end < count and type(items[end]) is list:
                end += 1
            run = items if i == 0 and end == count else items[i:end]
            self._deliver(identity, run)  # type: ignore[arg-type]  # only lists in it
            i = end

    def _deliver(self, identity: bytes, run: list[list[bytes]]) -> None:
        """``messages_received`` for ``run``: a handler error costs only the message
        that raised it (logged), as the same iterator goes on after it; one
        that raised before taking a message would again, so the run ends.

        Closing the connection empties the run, which ends the iteration:
        what follows is dropped, without a check per message."""
        factory = self.factory
        self._run = run
        left = iter(run)
        try:
            while True:
                before = length_hint(left)
                try:
                    factory.handler.messages_received(factory, identity, left)
                    return
                except Exception:
                    log.failure(
                        "{name}: handling a message from {identity} failed",
                        name=factory.name, identity=describe(identity),
                    )
                if length_hint(left) == before:
                    return
        finally:
            self._run = []

    def _read_greeting(self, data: bytes) -> bytes:
        greeting = self._greeting + data
        codec.check_signature(greeting)
        if len(greeting) < codec.GREETING_SIZE:
            self._greeting = greeting
            return b""
        self._greeting = b""
        peer = codec.parse_greeting(greeting[: codec.GREETING_SIZE])
        if peer.mechanism != codec.NULL:
            raise ZMTPError(f"mechanism {peer.mechanism!r} is not supported, only NULL")
        self.version = (peer.major, peer.minor)
        self._state = _HANDSHAKE
        return greeting[codec.GREETING_SIZE :]

    def _handshake(self, flags: int, body: bytes) -> None:
        if not flags & COMMAND:
            raise ZMTPError("a message frame before the handshake finished")
        name, data = codec.parse_command(body)
        if name == b"ERROR":
            raise ZMTPError(f"peer sent ERROR during the handshake: {data[1:]!r}")
        if name != b"READY":
            raise ZMTPError(f"expected READY, got {name!r}")
        properties = codec.parse_properties(data)
        socket_type = properties.get(b"socket-type", b"")
        if socket_type not in self.factory.peer_types:
            reason = b"invalid socket type " + socket_type[:200]
            self.transport.write(codec.error_command(reason))
            raise ZMTPError(reason.decode("ascii", "replace"))
        identity = properties.get(b"identity", b"")
        if len(identity) > 255:
            raise ZMTPError(f"identity of {len(identity)} bytes; ZMTP allows 255")
        if not identity or identity[0] == 0:
            identity = self.factory.generate_identity()
        self.transport.write(codec.ready_command(ROUTER))
        self._state = _READY
        self._stop_handshake_timer()
        self.identity = identity
        log.debug(
            "{name}: ZMTP {major}.{minor} {type} peer {peer} as {identity}",
            name=self.factory.name, major=self.version[0], minor=self.version[1],
            type=socket_type.decode("ascii", "replace"), peer=self.peer,
            identity=describe(identity),
        )
        self.factory._register(self, identity)

    def _command(self, body: bytes) -> None:
        name, data = codec.parse_command(body)
        if name == b"PING":
            _ttl, context = codec.parse_ping(data)
            self.write(codec.pong_command(context))
        elif name == b"ERROR":
            raise ZMTPError(f"peer sent ERROR: {data[1:]!r}")
        # PONG, SUBSCRIBE, CANCEL and unknown commands mean nothing to a ROUTER

    def _stop_handshake_timer(self) -> None:
        if self._handshake_timer is not None and self._handshake_timer.active():
            self._handshake_timer.cancel()
        self._handshake_timer = None

    def _fail(self, reason: str) -> None:
        log.warn(
            "{name}: closing {peer}: {reason}",
            name=self.factory.name, peer=self.peer, reason=reason,
        )
        self.close()
