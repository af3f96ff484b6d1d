# -*- test-case-name: tests.unit.test_emqp_protocol -*-
"""DISCONNECT: drain the eMQP side of the broker, say KBYE to every peer, then stop.

The spec asks a component that gets DISCONNECT to send KBAI (KBYE in the
code) to everyone, stop taking messages and let pending jobs complete.  The
original router unbound and exited at once, losing its buffered requests.
Here: new REQUESTs and SCHEDULEs are refused and READY no longer gives
slots; tracked jobs get ``drain_timeout`` seconds to reply; whatever is
still in flight then goes back to its queue (without using up a retry) and
stays stored; every worker and scheduler gets KBYE; connections are flushed
and closed; and ``on_disconnect`` (the plugin: stop the reactor) runs.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger

from mqserver.protocols.emqp import codec
from mqserver.zmtp.router import UnroutableError, ZMTPRouterFactory

if TYPE_CHECKING:
    from mqserver.protocols.emqp.service import EMQPService

log = Logger()


class Drain:
    def __init__(self, service: EMQPService) -> None:
        self.service = service
        self.finished = False
        self._deadline: Any = None

    def start(self) -> None:
        service = self.service
        log.info("emqp: DISCONNECT received; draining for up to {t} s", t=service.drain_timeout)
        service.scheduler.stop()
        for worker in service.workers.values():
            worker.slots.free = 0
        self._deadline = service.clock.callLater(service.drain_timeout, self.finish)
        self.check()

    def cancel(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()

    def check(self) -> None:
        # untracked requests were settled as they were sent: only tracked ones count
        if not any(worker.in_flight() for worker in self.service.workers.values()):
            self.finish()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        service = self.service
        self.cancel()
        say_goodbye(service)
        d = service.broker.durable()
        d.addBoth(lambda _: close_all(service))
        d.addBoth(self._stopped)

    def _stopped(self, _: Any) -> None:
        log.info("emqp: drained; every peer was sent KBYE")
        if self.service.on_disconnect is not None:
            self.service.on_disconnect()


def say_goodbye(service: EMQPService) -> None:
    """KBYE to every scheduler and worker; workers' jobs go back without using a retry.

    Also what a SIGTERM does once the last eMQP socket stops listening
    (``EMQPService.stop``): the spec's KBAI tells peers the broker is going
    away on purpose, so they reconnect to the next one instead of waiting out
    a heartbeat timeout.
    """
    try:
        for identity in list(service.schedulers):
            _send_quietly(service.frontend, identity, codec.message(codec.KBYE))
        service.schedulers.clear()
        for worker in list(service.workers.values()):
            _send_quietly(service.backend, worker.identity, codec.message(codec.KBYE))
            service.remove_worker(worker, "the broker is shutting down", failed=False)
    except Exception:
        log.failure("emqp: saying goodbye failed; stopping anyway")


def close_all(service: EMQPService) -> Deferred[Any]:
    """Flush and close every connection on the three sockets; fires once all are gone."""
    return DeferredList(
        [router.close_all() for router in (service.frontend, service.backend, service.admin)]
    )


def _send_quietly(router: ZMTPRouterFactory, identity: bytes, frames: list[bytes]) -> None:
    with contextlib.suppress(UnroutableError):
        router.send(identity, frames)
