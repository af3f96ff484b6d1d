# -*- test-case-name: tests.unit.test_ha_standby -*-
"""What a node's HTTP ports serve while it is not active, and the switch between sites.

A standby's ``/health`` answers 503 ``{"status": "standby"}`` so a load
balancer that checks it routes only to the active node; ``/metrics`` answers
200 with the node's ``mqserver_ha_*`` metrics (``HACollector``, also
registered on the active broker's ``/metrics``) so Prometheus scrapes every
node; anything else is 503 and names the active node if the lease row does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from twisted.internet.protocol import Factory, Protocol
from twisted.web.resource import Resource
from twisted.web.server import Site


class HACollector:
    """``mqserver_ha_*``: whether this node is active, and how often it changed role."""

    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        yield GaugeMetricFamily("mqserver_ha_active", "1 while this node is the active one.",
                                value=int(state["status"] == "active"))
        yield CounterMetricFamily("mqserver_ha_promotions", "Times this node became active.",
                                  value=state["promotions"])
        yield CounterMetricFamily("mqserver_ha_demotions",
                                  "Times this node lost the active role.",
                                  value=state["demotions"])


def ha_registry(collector: HACollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return registry


class StandbyResource(Resource):
    """Every path of a node that is not serving; ``state()`` says why and who is active."""

    isLeaf = True

    def __init__(self, state: Callable[[], dict[str, Any]], registry: CollectorRegistry) -> None:
        super().__init__()
        self._state = state
        self._registry = registry

    def render_GET(self, request: Any) -> bytes:
        state = self._state()
        if request.path == b"/metrics":
            request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
            return generate_latest(self._registry)
        request.setResponseCode(503)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        if request.path == b"/health":
            return json.dumps(state).encode()
        active = state.get("active") or {}
        return json.dumps({
            "error": f"this node is {state['status']}: it serves nothing until it is active; "
                     f"the active node: {active.get('node')} (HTTP {active.get('http')})",
            "status": 503,
        }).encode()

    render_HEAD = render_GET

    def render_POST(self, request: Any) -> bytes:
        return self.render_GET(request)

    render_PUT = render_DELETE = render_POST


def standby_site(state: Callable[[], dict[str, Any]], registry: CollectorRegistry) -> Site:
    site = Site(StandbyResource(state, registry))
    site.noisy = False
    return site


class SiteSwitch(Factory):
    """Builds each new connection with the current site: standby's or the active broker's.

    The listening port stays open across role changes (a load balancer's
    check keeps its address); connections made before a switch keep the
    site they got.  While ``fenced()`` says so, a new connection gets the
    standby site whatever the current one is: an active woken from a stop
    accepts the connections that waited before its lease timer can demote
    it, and its ``/health`` must not answer 200 to them (as ``Fenced`` does
    for the protocol listeners).
    """

    noisy = False

    def __init__(self, site: Any, fenced: Callable[[], bool] | None = None) -> None:
        self.current = self.standby = site
        self._fenced = fenced

    def switch(self, site: Any) -> None:
        if site is self.current:
            return
        old, self.current = self.current, site
        site.doStart()
        old.doStop()

    def startFactory(self) -> None:
        self.current.doStart()

    def stopFactory(self) -> None:
        self.current.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        if self._fenced is not None and self._fenced():
            return self.standby.buildProtocol(addr)
        return self.current.buildProtocol(addr)

    def refusal(self, reason: str) -> Any:
        """The current site's answer to a connection over the limits (``GuardedFactory``)."""
        refusal = getattr(self.current, "refusal", None)
        return refusal(reason) if refusal is not None else None


class Fenced(Factory):
    """A protocol listener's factory that refuses connections while ``fenced()`` says so.

    For the moment after a stopped or hung active wakes up: the reactor
    handles the I/O that waited before the lease timer that ends the role,
    so a new connection would reach a node whose claim may be gone.  It is
    closed at once instead, unread (``Closed``).
    """

    noisy = False

    def __init__(self, wrapped: Any, fenced: Callable[[], bool]) -> None:
        self.wrapped = wrapped
        self._fenced = fenced
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        # GuardedFactory asks for ``refusal``; the protocols' own attributes too
        return getattr(self.wrapped, name)

    def doStart(self) -> None:
        self.wrapped.doStart()

    def doStop(self) -> None:
        self.wrapped.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        if self._fenced():
            self.refused += 1
            return Closed()
        return self.wrapped.buildProtocol(addr)


class Closed(Protocol):
    """A connection ``Fenced`` refuses: dropped as soon as it is made, nothing read."""

    def connectionMade(self) -> None:
        self.transport.abortConnection()
