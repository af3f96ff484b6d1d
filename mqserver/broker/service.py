# -*- test-case-name: tests.unit.test_service -*-
"""The broker as a Twisted service: open storage, recover, run timers, then listen."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqserver.broker.core import Broker

log = Logger()


class BrokerService(MultiService):
    """Parent of the protocol listeners, which start only once the store is open.

    Starting listeners before recovery would let clients see an empty broker
    and publish into queues that recovery then overwrites.
    """

    def __init__(self, broker: Broker, ttl_interval: float = 1.0, tune_gc: bool = False) -> None:
        super().__init__()
        self.broker = broker
        self.ttl_interval = ttl_interval
        self.tune_gc = tune_gc
        self._expiry = LoopingCall(self._expire)
        self._expiry.clock = broker.clock
        self.ready: Deferred[None] = Deferred()
        self.storage_error: str | None = None

    def startService(self) -> None:
        self.running = 1
        d = self._start()
        d.addErrback(self._start_failed)

    @inlineCallbacks
    def _start(self) -> Any:
        recovered = yield self.broker.store.open()
        self.broker.load(recovered)
        log.info(
            "storage open: {queues} queues, {messages} ready messages recovered",
            queues=len(recovered.queues),
            messages=sum(len(q.messages) for q in recovered.queues.values()),
        )
        self._expiry.start(self.ttl_interval, now=False)
        if self.tune_gc:
            # Long-lived broker state would otherwise be rescanned by every
            # full collection; freezing it and raising the young-generation
            # threshold cut produce time by a third with a 1M backlog.
            gc.collect()
            gc.freeze()
            gc.set_threshold(50_000, 50, 100)
        for service in self:
            service.startService()
        self.ready.callback(None)

    def _start_failed(self, failure: Any) -> None:
        self.storage_error = failure.getErrorMessage()
        log.failure("mqserver could not start", failure)
        self.ready.errback(failure)
        stop_with_error(self.broker.clock)

    def _expire(self) -> None:
        try:
            removed = self.broker.expire_due()
            if removed:
                log.debug("expired {n} messages", n=removed)
        except Exception:
            log.failure("TTL sweep failed; it runs again next interval")

    @inlineCallbacks
    def stopService(self) -> Any:
        self.running = 0
        yield DeferredList(
            [d for d in (s.stopService() for s in reversed(list(self))) if d is not None]
        )
        if self._expiry.running:
            self._expiry.stop()
        yield self.broker.durable()
        yield self.broker.store.close()


def stop_with_error(reactor: Any) -> None:
    """Stop ``twistd`` with exit status 1 after a start-up failure.

    twistd has no way to set its exit status, and a broker that cannot open
    its storage or listen must not look like a clean exit to systemd or CI:
    after the reactor has shut down (listeners closed, logs written) the
    process exits with 1.
    """
    if not hasattr(reactor, "addSystemEventTrigger"):
        return

    def exit_1() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    reactor.addSystemEventTrigger("after", "shutdown", exit_1)
    if getattr(reactor, "running", False):
        reactor.stop()
    else:
        reactor.callWhenRunning(reactor.stop)
