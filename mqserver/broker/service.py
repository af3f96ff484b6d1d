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
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from mqserver.broker.core import Broker
from mqserver.broker.saving import durable_state
from mqserver.interfaces import ICleanShutdown, IClientConnection, IFlowControlled
from mqserver.packed import check_thd

log = Logger()


class BrokerService(MultiService):
    """Parent of the protocol listeners, which start only once the store is open.

    Starting listeners before recovery would let clients see an empty broker
    and publish into queues that recovery then overwrites.
    """

    def __init__(self, broker: Broker, ttl_interval: float = 1.0, tune_gc: bool = False,
                 pack_at_rest: float = 1.0) -> None:
        super().__init__()
        self.broker = broker
        self.ttl_interval = ttl_interval
        # seconds between looks for ready backlogs at rest (mqserver.broker.resting)
        self.pack_at_rest = pack_at_rest
        self.tune_gc = tune_gc
        self._expiry = LoopingCall(self._expire)
        self._expiry.clock = broker.clock
        self.ready: Deferred[None] = Deferred()
        self.storage_error: str | None = None
        # how long a shutdown waits for closed connections to go (their
        # output flushed) before the reactor drops what is left
        self.close_timeout = 5.0
        # a failed start stops the process (exit 1), except under mqserver.ha,
        # whose node goes back to standby instead (it watches ``ready``)
        self.exit_on_start_failure = True
        # mqserver.ha: the listeners also wait for this (a previous active's lease)
        self.listen_after: Deferred[None] | None = None
        # the store's open, when ``makeService`` started it already (``tap.opens_early``)
        self.opening: Deferred[Any] | None = None

    def startService(self) -> None:
        self.running = 1
        d = self._start()
        d.addErrback(self._start_failed)

    @inlineCallbacks
    def _start(self) -> Any:
        opening, self.opening = self.opening, None
        if opening is None:
            opening = self.broker.store.open()
        recovered = yield opening
        self.broker.load(recovered)
        log.info(
            "storage open: {queues} queues, {messages} ready messages recovered",
            queues=len(recovered.queues),
            messages=sum(len(q.messages) for q in recovered.queues.values()),
        )
        self._expiry.start(self.ttl_interval, now=False)
        self.broker.resting.start(self.pack_at_rest)
        self.broker.flow.start()
        if self.tune_gc:
            # Long-lived broker state would otherwise be rescanned by every
            # full collection; freezing it and raising the young-generation
            # threshold cut produce time by a third with a 1M backlog.  What
            # the imports, the open and the load made since makeService froze
            # the rest is state (modules, the recovered chunks, queues): only
            # the youngest are looked at for garbage before it is frozen.  (A
            # full collection here found 0 to 16 objects for 5-25 ms on the
            # way to listening, now that a snapshot's open is that short.)
            gc.collect(0)
            gc.freeze()
            gc.set_threshold(50_000, 50, 100)
        if self.listen_after is not None:
            yield self.listen_after
        for service in self:
            service.startService()
        self.ready.callback(None)
        self._check_recovered()

    def _check_recovered(self) -> None:
        """Read and check the chunks recovered unread, in a thread, now that the
        broker serves (``mqserver.storage.pending_chunk``: a snapshot's, a log
        replay's, a SQLite replay's, whose rows the store's own thread reads
        while this one waits), front chunks first: a queue's
        reads then find its chunks checked (a delivery before that checks the
        chunk it reaches), and a damaged one is reported at once, not when it
        would have been read."""
        chunks = self.broker.unchecked_chunks()
        reactor = self.broker.clock
        if not chunks or not hasattr(reactor, "getThreadPool"):
            return  # each queue checks its own at its first read
        d = deferToThreadPool(reactor, reactor.getThreadPool(), check_thd, chunks)
        d.addCallback(lambda _: self.broker.settle_recovered())
        d.addErrback(lambda f: log.failure("checking the recovered chunks failed", f))

    def _start_failed(self, failure: Any) -> None:
        self.storage_error = failure.getErrorMessage()
        log.failure("mqserver could not start", failure)
        self.ready.errback(failure)
        if self.exit_on_start_failure:
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
        """Graceful stop (SIGTERM, SIGINT), in an order that answers what it can.

        1. Every listener stops accepting (the journal keeps recording); eMQP
           says KBYE to its peers as its last socket stops; connections stop
           reading.
        2. Storage is flushed, so confirms whose changes are now durable are
           answered while their connections are still open.
        3. Every client connection is closed, its output flushed first; its
           consumers are cancelled and unacked messages go back to their
           queues (they are stored as ready already: a delivery is no op).
        4. Storage is flushed again, the journal sealed, the store closed:
           with a snapshot of the broker's state (``ICleanShutdown``) when
           the store provides it and holds every op, so the next start
           reads that instead of replaying.

        A failing store does not block the stop: what it could not store is
        logged, and was never confirmed to anyone.
        """
        self.running = 0
        log.info("stopping: no new connections; storage is flushed before {n} connections close",
                 n=len(self.broker.connections))
        journal = yield self._stop_serving()
        yield self._flush()
        yield self._close_connections()
        yield self._flush()
        for service in journal:
            yield service.stopService()
        writer = self.broker.writer
        if writer is not None:
            writer.stop()
        store = self.broker.store
        clean = ICleanShutdown(store, None)
        if clean is not None and writer is not None and writer.settled \
                and not self.broker.withheld:
            saved = yield clean.close_clean(durable_state(self.broker))
        else:
            if self.broker.withheld:
                log.warn("no clean-shutdown snapshot: {n} messages were withheld (recovered, "
                         "they cannot be read), and the next start replays the store",
                         n=self.broker.withheld)
            saved = False
            yield store.close()
        log.info("stopped: store closed with {ready} messages ready{how}",
                 ready=self.broker.ready_count(),
                 how=" and a clean-shutdown snapshot" if saved else "")

    @inlineCallbacks
    def _stop_serving(self) -> Any:
        """Listeners and child services, timers, reading: what a stop and an abandon share.

        The journal keeps running (it records the closing connections);
        fires with the services the caller stops last, the journal's.
        """
        journal = [s for s in self if s is self.broker.journal]
        yield DeferredList([
            d for d in (s.stopService() for s in reversed(list(self)) if s not in journal)
            if d is not None
        ])
        if self._expiry.running:
            self._expiry.stop()
        self.broker.resting.stop()
        self.broker.flow.stop()
        self._stop_reading()
        return journal

    @inlineCallbacks
    def abandon(self, reason: str) -> Any:
        """Stop serving at once, storing and confirming nothing more (``mqserver.ha``).

        For an active node whose store lost the database session that held
        its claim: another node may be active already, so unlike
        ``stopService`` nothing is flushed (a batch could not commit anyway)
        and no waiting confirm will ever succeed.  The writer stops first, so
        the requeues of closing connections store nothing; listeners stop,
        every client is closed (told ``reason``), the journal is sealed and
        the store closed.  The broker and its state are then garbage.
        """
        self.running = 0
        if self.broker.writer is not None:
            self.broker.writer.stop()
        journal = yield self._stop_serving()
        yield self._close_connections(reason)
        for service in journal:
            yield service.stopService()
        yield self.broker.store.close()

    @inlineCallbacks
    def _flush(self) -> Any:
        try:
            yield self.broker.durable()
        except Exception as e:
            writer = self.broker.writer
            log.error("stopping with storage failing: {n} changes were not stored ({e})",
                      n=len(writer.ops) if writer is not None else 0, e=e)

    def _stop_reading(self) -> None:
        """Read nothing more from clients: a request sent from now on is not taken.

        Through ``IFlowControlled`` (the memory alarm's hook, which MQKS and
        PHPMQ connections provide); a client whose request is not read gets
        no answer, so it never takes it as done.  eMQP's sockets are closed
        by then, and HTTP stopped accepting.
        """
        for connection in self.broker.connections.values():
            client = IFlowControlled(connection.sink, None)
            if client is not None:
                client.pause_reading()

    def _close_connections(self, reason: str = "the server is shutting down") -> Deferred[None]:
        """Close every client connection that can be closed; fires once all are gone."""
        closing = []
        for connection in list(self.broker.connections.values()):
            client = IClientConnection(connection.sink, None)
            if client is None:
                continue
            closing.append(connection)
            try:
                client.close(reason)
            except Exception:
                log.failure("closing connection {id} failed", id=connection.id)
        done: Deferred[None] = Deferred()
        deadline = self.broker.clock.seconds() + self.close_timeout

        def check() -> None:
            left = [c for c in closing if c.id in self.broker.connections]
            if not left:
                done.callback(None)
            elif self.broker.clock.seconds() >= deadline:
                log.warn("{n} connections did not close within {t} s; stopping anyway",
                         n=len(left), t=self.close_timeout)
                done.callback(None)
            else:
                self.broker.clock.callLater(0.05, check)

        check()
        return done


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
