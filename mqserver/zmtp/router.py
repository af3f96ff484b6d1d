# -*- test-case-name: tests.unit.test_zmtp_router -*-
"""A ZeroMQ ROUTER socket as a Twisted ``Factory``.

Each TCP connection runs the ZMTP 3 greeting and NULL handshake, then hands
whole multipart messages to a handler, prefixed (as a ROUTER does) by the
peer's identity.  ``send`` routes by identity and raises ``UnroutableError`` for
an identity that is not connected, which is libzmq's ``ROUTER_MANDATORY``:
the application learns at once that a worker has gone and can re-route.

Deliberate choices, each because a broker wants it:

- Our greeting goes out in ``connectionMade``: libzmq sends 10 bytes and
  waits for ours before sending the rest.
- Our READY goes out after the peer's, so a peer of the wrong socket type
  gets an ERROR command instead (libzmq sends READY without waiting, so
  this never stalls it, with 3.0 or 3.1).
- An empty identity, or one starting with a zero byte (reserved by 3.1 for
  generated ones), gets a generated 5-byte ``00 xx xx xx xx`` identity.
- A second connection with an identity already in use takes it over and the
  old connection is closed (``ROUTER_HANDOVER``): a peer that reconnects
  before we noticed its old half-open connection is reachable at once.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from mqserver.zmtp import codec
from mqserver.zmtp.codec import describe
from mqserver.zmtp.connection import ZMTPConnection

log = Logger()

PEER_TYPES = frozenset((b"DEALER", b"REQ", b"ROUTER"))
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024
DEFAULT_MAX_FRAMES = 64
"""Frames in one multipart message; eMQP's longest (SCHEDULE) has 9 after the identity."""


class UnroutableError(Exception):
    """No connected peer has this identity (ZMQ's EHOSTUNREACH)."""

    def __init__(self, identity: bytes) -> None:
        super().__init__(f"no peer with identity {identity!r}")
        self.identity = identity


class RouterHandler(Protocol):
    """What a ``ZMTPRouterFactory`` calls; every call is on the reactor thread."""

    def router_started(self, router: ZMTPRouterFactory) -> None: ...

    def router_stopped(self, router: ZMTPRouterFactory) -> None: ...

    def peer_connected(self, router: ZMTPRouterFactory, identity: bytes) -> None: ...

    def messages_received(
        self, router: ZMTPRouterFactory, identity: bytes, messages: Iterator[list[bytes]]
    ) -> None:
        """Handle each message of a run (consecutive messages of one chunk, in
        order; a command between two messages splits runs).  If handling one
        raises, the connection logs it and calls again with the same
        iterator, so the rest of the run is still handled."""

    def peer_disconnected(self, router: ZMTPRouterFactory, identity: bytes) -> None: ...


class ZMTPRouterFactory(Factory):
    """The ROUTER socket: every connection of one listening endpoint."""

    def __init__(
        self,
        handler: RouterHandler,
        name: str = "zmtp",
        max_message_size: int = DEFAULT_MAX_MESSAGE,
        peer_types: frozenset[bytes] = PEER_TYPES,
        clock: Any = None,
        handshake_timeout: float = 30.0,
        max_frames: int = DEFAULT_MAX_FRAMES,
    ) -> None:
        self.handler = handler
        self.max_frames = max_frames
        self.clock = clock
        self.handshake_timeout = handshake_timeout
        self.name = name
        self.max_message_size = max_message_size
        self.peer_types = peer_types
        self.peers: dict[bytes, ZMTPConnection] = {}
        self.connections: set[ZMTPConnection] = set()
        # called (connection, paused) when a peer's transport fills up or drains;
        # the application decides what a slow peer means (see ZMTPConnection)
        self.on_flow: Callable[[ZMTPConnection, bool], None] | None = None
        self._next_id = struct.unpack(">I", os.urandom(4))[0]

    def buildProtocol(self, addr: Any) -> ZMTPConnection:
        connection = ZMTPConnection(self)
        connection.factory = self
        return connection

    def startFactory(self) -> None:
        self.handler.router_started(self)

    def stopFactory(self) -> None:
        self.handler.router_stopped(self)

    # -- routing ------------------------------------------------------------

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        """Send a multipart message to the peer ``identity`` or raise ``UnroutableError``."""
        self.send_encoded(identity, codec.encode_message(frames))

    def send_encoded(self, identity: bytes, data: bytes) -> None:
        """``send`` for a message already encoded (``codec.encode_message``)."""
        connection = self.peers.get(identity)
        if connection is None:
            raise UnroutableError(identity)
        connection.write(data)

    def generate_identity(self) -> bytes:
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        return b"\x00" + struct.pack(">I", self._next_id)

    def _register(self, connection: ZMTPConnection, identity: bytes) -> None:
        old = self.peers.get(identity)
        if old is not None and old is not connection:
            log.info(
                "{name}: peer {peer} took over identity {identity} from {old}",
                name=self.name, peer=connection.peer, identity=describe(identity),
                old=old.peer,
            )
            old.identity = None
            old.close()
        self.peers[identity] = connection
        self.handler.peer_connected(self, identity)

    def _unregister(self, connection: ZMTPConnection) -> None:
        self.connections.discard(connection)
        identity = connection.identity
        if identity is not None and self.peers.get(identity) is connection:
            del self.peers[identity]
            self.handler.peer_disconnected(self, identity)

    def close_all(self) -> Deferred[Any]:
        """Flush and close every connection; fires when all are gone."""
        waits = [connection.close() for connection in list(self.connections)]
        return DeferredList(waits) if waits else succeed(None)
