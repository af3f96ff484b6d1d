"""A standby's HTTP answers, and the switch that keeps one port across role changes."""

from __future__ import annotations

import json

from twisted.internet.protocol import Factory, Protocol
from twisted.web.test.requesthelper import DummyRequest

from mqserver.ha.standby import HACollector, SiteSwitch, StandbyResource, ha_registry

STATE = {"status": "standby", "node": "b", "active": {"node": "a", "http": "tcp:8080"},
         "promotions": 2, "demotions": 1}


def answer(path: bytes) -> tuple[int, bytes]:
    request = DummyRequest([])
    request.path = path
    body = StandbyResource(lambda: STATE, ha_registry(HACollector(lambda: STATE))).render_GET(
        request)
    return request.responseCode or 200, body


def test_health_is_503_standby_for_load_balancers() -> None:
    code, body = answer(b"/health")
    assert code == 503 and json.loads(body)["status"] == "standby"


def test_metrics_stay_scrapable_and_say_not_active() -> None:
    code, body = answer(b"/metrics")
    assert code == 200 and b"mqserver_ha_active 0.0" in body
    assert b"mqserver_ha_promotions_total 2.0" in body
    assert b"mqserver_ha_demotions_total 1.0" in body


def test_everything_else_is_503_and_names_the_active_node() -> None:
    code, body = answer(b"/api/queues")
    assert code == 503
    assert "the active node: a (HTTP tcp:8080)" in json.loads(body)["error"]


class Counting(Factory):
    protocol = Protocol

    def __init__(self) -> None:
        self.started = self.stopped = 0

    def startFactory(self) -> None:
        self.started += 1

    def stopFactory(self) -> None:
        self.stopped += 1


def test_switch_builds_with_the_current_site_and_starts_and_stops_them() -> None:
    standby, active = Counting(), Counting()
    switch = SiteSwitch(standby)
    switch.doStart()
    assert switch.buildProtocol(None).factory is standby
    switch.switch(active)
    assert switch.buildProtocol(None).factory is active
    assert (standby.started, standby.stopped, active.started) == (1, 1, 1)
    switch.switch(active)  # no-op
    switch.doStop()
    assert active.stopped == 1
    assert switch.refusal("full") is None


def test_a_fenced_switch_builds_with_the_standby_site_even_when_active() -> None:
    """A woken active's HTTP port: /health must not say 200 while its lease is stale."""
    standby, active, fenced = Counting(), Counting(), [False]
    switch = SiteSwitch(standby, lambda: fenced[0])
    switch.doStart()
    switch.switch(active)
    assert switch.buildProtocol(None).factory is active
    fenced[0] = True
    assert switch.buildProtocol(None).factory is standby
    fenced[0] = False
    assert switch.buildProtocol(None).factory is active


def test_a_fenced_listener_drops_new_connections_unread() -> None:
    from twisted.internet.testing import StringTransport

    from mqserver.ha.standby import Closed, Fenced

    inner, fenced = Counting(), [True]
    factory = Fenced(inner, lambda: fenced[0])
    protocol = factory.buildProtocol(None)
    assert isinstance(protocol, Closed) and factory.refused == 1
    transport = StringTransport()
    protocol.makeConnection(transport)
    assert transport.disconnecting or getattr(transport, "disconnected", False)
    fenced[0] = False
    assert factory.buildProtocol(None).factory is inner
    factory.doStart()
    factory.doStop()
    assert (inner.started, inner.stopped) == (1, 1)
    inner.refusal = lambda reason: b"full"  # what GuardedFactory asks the wrapped factory
    assert factory.refusal("x") == b"full"
