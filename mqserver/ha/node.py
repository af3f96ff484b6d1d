# -*- test-case-name: tests.unit.test_ha_node -*-
"""An active/standby node (``--ha``): standby until it holds the claim, then active.

States and why:

- **standby**: the HTTP ports answer as ``mqserver.ha.standby`` says; no
  protocol listens; every ``--ha-poll`` seconds the ``Claimant`` tries to
  take the claim (and terminates an active whose lease ran out).
- **promoting**: the claim is ours.  A fresh store runs on the session that
  holds it, a fresh broker recovers the state, and only then do the protocol
  listeners open (``BrokerService`` starts them after recovery) and the HTTP
  ports switch to the broker's site.
- **active** until the claim is lost: the store's session ended (every batch
  fails from then on, so nothing more is confirmed) or the lease says so.
  The node then **demotes** in-process: HTTP back to standby at once,
  writer stopped, listeners closed, every client disconnected, the store
  closed, the broker dropped (``gc.unfreeze`` so frozen start-up state can
  go too); then it is a standby again and competes like any other.  A
  process exit would do the same with a restart's delay and a supervisor's
  help; in-process it is one code path for every cause (hung process woken
  up, database restart, network cut) and testable without systemd.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Callable
from typing import Any

from twisted.application.service import MultiService
from twisted.internet import endpoints
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import Logger

from mqserver.ha.claim import Claimant, Claimed, HASettings, Lease
from mqserver.ha.standby import Fenced, HACollector, SiteSwitch, ha_registry, standby_site

log = Logger()


class HANode(MultiService):
    """One node of an active/standby group; see the module docstring.

    ``build_active(store)`` returns ``(BrokerService, sites)``: the broker
    over the store with its protocol listeners as children, and the HTTP
    sites (one per ``switches`` entry, in order) that serve it.
    """

    def __init__(self, dsn: str, settings: HASettings, reactor: Any,
                 build_store: Callable[[], Any],
                 build_active: Callable[[Any], tuple[Any, list[Any]]],
                 claimant: Any = None, lease: Callable[..., Any] = Lease) -> None:
        super().__init__()
        self.dsn = dsn
        self.settings = settings
        self.reactor = reactor
        self._build_store = build_store
        self._build_active = build_active
        self.claimant = claimant or Claimant(dsn, settings, reactor)
        self._new_lease = lease
        self.switches: list[SiteSwitch] = []
        self.collector = HACollector(self.health)
        self._standby = standby_site(self.health, ha_registry(self.collector))
        self._poll = LoopingCall(self._attempt)
        self._poll.clock = reactor
        self._attempting = False
        self.state = "standby"
        self.active: Any = None
        self.lease: Any = None
        self._lost_while_promoting: str | None = None
        self.promotions = 0
        self.demotions = 0
        self.last_error: str | None = None

    def switch(self) -> SiteSwitch:
        """A factory for one HTTP listener: the standby site now, the broker's when active."""
        switch = SiteSwitch(self._standby, self.fenced)
        self.switches.append(switch)
        return switch

    def fenced(self) -> bool:
        """Whether a new client connection must be refused: not active, or the lease is stale."""
        return self.state != "active" or self.lease is None or self.lease.stale()

    def health(self) -> dict[str, Any]:
        """``/health`` while not active, or active with a stale lease (``fenced``)."""
        status = "fenced" if self.state == "active" and self.fenced() else self.state
        return {"status": status, "node": self.settings.node,
                "active": self.claimant.last_seen, "promotions": self.promotions,
                "demotions": self.demotions, "last_error": self.last_error}

    # -- standby ------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        log.info("node {node}: standby, trying for the claim every {poll} s",
                 node=self.settings.node, poll=self.settings.poll)
        self._poll.start(self.settings.poll, now=True)

    def _attempt(self) -> None:
        if self.state != "standby" or self._attempting:
            return
        self._attempting = True
        d = self.claimant.attempt()
        d.addCallbacks(self._attempted, self._attempt_failed)

    def _attempt_failed(self, failure: Any) -> None:
        self._attempting = False
        error = failure.getErrorMessage()
        if error != self.last_error:
            log.warn("node {node}: cannot reach the database to compete for the claim: {e}",
                     node=self.settings.node, e=error)
        self.last_error = error

    def _attempted(self, claimed: Claimed | None) -> None:
        self._attempting = False
        if claimed is None:
            return
        if not self.running:
            claimed.conn.close()
            return
        self._promote(claimed)

    # -- active -------------------------------------------------------------

    def _promote(self, claimed: Claimed) -> None:
        self.state = "promoting"
        self._lost_while_promoting = None
        conn = claimed.conn
        log.info("node {node}: holds the claim (backend {pid}); recovering; previous active "
                 "{previous}, whose lease ran {handover:.2f} s more: serving after that",
                 node=self.settings.node, pid=conn.info.backend_pid, previous=claimed.previous,
                 handover=claimed.handover)
        self.lease = self._new_lease(self.dsn, self.settings, self.reactor, self._lost)
        self.lease.start(conn.info.backend_pid, claimed.key)
        store = self._build_store()
        store.adopt(conn)
        store.session_lost = self._lost
        service, sites = self._build_active(store)
        service.exit_on_start_failure = False
        # recovery only reads, and the old active cannot commit any more:
        # only the listeners wait for what is left of its lease
        service.listen_after = deferLater(self.reactor, claimed.handover, lambda: None)
        self.active = service
        service.startService()
        service.ready.addCallbacks(self._serving, self._promotion_failed, callbackArgs=(sites,))

    def _serving(self, _: None, sites: list[Any]) -> None:
        if self.state == "stopping":
            return
        if self._lost_while_promoting is not None:
            self._demote(self._lost_while_promoting)
            return
        for switch, site in zip(self.switches, sites, strict=True):
            registry = getattr(getattr(site, "api", None), "registry", None)
            if registry is not None:  # the broker's /metrics gets mqserver_ha_* too
                registry.register(self.collector)
            switch.switch(site)
        self.state = "active"
        self.promotions += 1
        self.last_error = None
        log.info("node {node}: ACTIVE, serving", node=self.settings.node)

    def _promotion_failed(self, failure: Any) -> None:
        self._demote(f"recovery failed: {failure.getErrorMessage()}")

    def _lost(self, reason: str) -> None:
        if self.state == "promoting":
            self._lost_while_promoting = reason
        elif self.state == "active":
            self._demote(reason)

    @inlineCallbacks
    def _demote(self, reason: str) -> Any:
        """Stop serving at once and go back to standby (see the module docstring)."""
        self.state = "demoting"
        self.last_error = reason
        log.error("node {node}: no longer active ({reason}): closing every client and "
                  "dropping the broker's state; back to standby", node=self.settings.node,
                  reason=reason)
        for switch in self.switches:
            switch.switch(self._standby)
        active, self.active = self.active, None
        lease, self.lease = self.lease, None
        try:
            if lease is not None:
                yield lease.stop()
            if active is not None:
                yield active.abandon(f"this node is no longer active: {reason}")
        except Exception:
            log.failure("node {node}: demotion", node=self.settings.node)
        if hasattr(gc, "unfreeze"):
            gc.unfreeze()
        self.demotions += 1
        if self.running:
            self.state = "standby"

    @inlineCallbacks
    def stopService(self) -> Any:
        """Stop as a standalone server would: an active flushes and closes gracefully."""
        if self._poll.running:
            self._poll.stop()
        state, self.state = self.state, "stopping"
        active, self.active = self.active, None
        if active is not None and state in ("active", "promoting"):
            try:
                yield active.ready
            except Exception:
                log.info("node {node}: stopped while promoting", node=self.settings.node)
            else:
                yield active.stopService()
        if self.lease is not None:
            yield self.lease.stop(release=state == "active")
        yield self.claimant.close()
        yield super().stopService()


def build_node(config: Any, reactor: Any, limits: Any) -> HANode:
    """``twistd mqserver --ha``: the node, with its HTTP listeners as children."""
    from mqserver.connlimits import GuardedFactory
    from mqserver.tap import _STORAGE, Listener, build_broker_service, http_endpoints, http_sites

    settings = HASettings(
        node=config["ha-node"] or f"{socket.gethostname()}:{os.getpid()}",
        http=config["http"] if not config["no-http"] else "",
        lease=config["ha-lease"], renew=config["ha-renew"], poll=config["ha-poll"],
    )

    def build_active(store: Any) -> tuple[Any, list[Any]]:
        service = build_broker_service(config, reactor, store, limits,
                                       wrap=lambda factory: Fenced(factory, node.fenced))
        return service, [site for _, _, site in http_sites(config, service.broker)]

    node = HANode(str(config.get("postgres-dsn", "")), settings, reactor,
                  lambda: _STORAGE["postgres"].build_store(config, reactor), build_active)
    for label, description in http_endpoints(config):
        endpoint = endpoints.serverFromString(reactor, description)
        Listener(label, endpoint, GuardedFactory(node.switch(), limits, label, reactor),
                 reactor).setServiceParent(node)
    return node
