# -*- test-case-name: tests.unit.test_ha_standby -*-
"""What a node's HTTP ports serve while it is not active, and the switch between sites.

A standby's ``/health`` answers 503 ``{"status": "standby"}`` so a load
balancer that checks it routes only to the active node; ``/metrics`` answers
200 with ``mqserver_ha_active 0`` so Prometheus still scrapes it; anything
else is 503 and names the active node if the lease row does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.protocol import Factory
from twisted.web.resource import Resource
from twisted.web.server import Site


class StandbyResource(Resource):
    """Every path of a node that is not serving; ``state()`` says why and who is active."""

    isLeaf = True

    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        super().__init__()
        self._state = state

    def render_GET(self, request: Any) -> bytes:
        state = self._state()
        if request.path == b"/metrics":
            request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
            return (b"# HELP mqserver_ha_active 1 while this node is the active one.\n"
                    b"# TYPE mqserver_ha_active gauge\nmqserver_ha_active 0\n")
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


def standby_site(state: Callable[[], dict[str, Any]]) -> Site:
    site = Site(StandbyResource(state))
    site.noisy = False
    return site


class SiteSwitch(Factory):
    """Builds each new connection with the current site: standby's or the active broker's.

    The listening port stays open across role changes (a load balancer's
    check keeps its address); connections made before a switch keep the
    site they got.
    """

    noisy = False

    def __init__(self, site: Any) -> None:
        self.current = site

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
        return self.current.buildProtocol(addr)

    def refusal(self, reason: str) -> Any:
        """The current site's answer to a connection over the limits (``GuardedFactory``)."""
        refusal = getattr(self.current, "refusal", None)
        return refusal(reason) if refusal is not None else None
