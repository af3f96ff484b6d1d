# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""What the frontend, backend and admin handlers share.

All three sockets belong to one ``EMQPService``: the first to start starts
its timers and the last to stop stops them (the service counts), and a peer
is only known once it speaks, so connects and disconnects need no action
unless a handler says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqserver.protocols.emqp.service import EMQPService
    from mqserver.zmtp.router import ZMTPRouterFactory


class EndpointHandler:
    """Base of the three ``RouterHandler``s of an ``EMQPService``."""

    message_received: Callable[[ZMTPRouterFactory, bytes, list[bytes]], None]
    """Handles one message: each handler has its own."""

    def __init__(self, service: EMQPService) -> None:
        self.service = service

    def messages_received(
        self, router: ZMTPRouterFactory, identity: bytes, messages: Iterator[list[bytes]]
    ) -> None:
        """RouterHandler: the run (``handle_run``), then what it made ready is
        dispatched at once (``broker.pump_now``) instead of at the next turn,
        so a worker's READYs get their requests in the write that ends the chunk."""
        broker = self.service.broker
        broker.hold_pump()
        try:
            self.handle_run(router, identity, messages)
        finally:
            broker.pump_now()

    def handle_run(
        self, router: ZMTPRouterFactory, identity: bytes, messages: Iterator[list[bytes]]
    ) -> None:
        """One message at a time (frontend and backend take their common ones faster)."""
        for frames in messages:
            self.message_received(router, identity, frames)

    def router_started(self, router: ZMTPRouterFactory) -> None:
        self.service.start()

    def router_stopped(self, router: ZMTPRouterFactory) -> None:
        self.service.stop()

    def peer_connected(self, router: ZMTPRouterFactory, identity: bytes) -> None:
        """A peer is registered by what it sends (INFORM, REQUEST), not by connecting."""

    def peer_disconnected(self, router: ZMTPRouterFactory, identity: bytes) -> None:
        """Kept until its heartbeats stop: libzmq reconnects with the same identity."""
