"""Out of the box nothing listens beyond this host: every default endpoint binds 127.0.0.1.

Checked three ways, so that a new plugin or option cannot slip through:
every protocol plugin's ``default_endpoint``, every option whose default is
an endpoint string (eMQP's backend and admin sockets, ``--http``), and the
sockets a server started with no arguments really opens.  Exposing a
listener is always an explicit ``interface=`` in an endpoint string.
"""

from __future__ import annotations

import pytest
from twisted.internet import endpoints
from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock
from twisted.plugin import getPlugins

from mqserver import tap
from mqserver.interfaces import IProtocolPlugin

ENDPOINT_TYPES = ("tcp:", "tcp6:", "ssl:", "unix:")


def _interface(description: str) -> str:
    """The address ``description`` would bind, by listening on a memory reactor."""
    reactor = MemoryReactorClock()
    endpoints.serverFromString(reactor, description).listen(Factory())
    [(_port, _factory, _backlog, interface)] = reactor.tcpServers
    return interface


def _endpoint_defaults() -> dict[str, str]:
    defaults = tap.Options().defaults
    return {
        name: value for name, value in defaults.items()
        if isinstance(value, str) and value.startswith(ENDPOINT_TYPES)
    }


PLUGINS = sorted(getPlugins(IProtocolPlugin), key=lambda plugin: plugin.name)


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_every_protocol_plugins_default_endpoint_binds_loopback(plugin):
    assert _interface(plugin.default_endpoint) == "127.0.0.1"


def test_every_endpoint_option_defaults_to_loopback():
    defaults = _endpoint_defaults()
    assert {"http", "emqp-backend", "emqp-admin"} <= set(defaults)
    assert {name: _interface(value) for name, value in defaults.items()} == {
        name: "127.0.0.1" for name in defaults
    }


def test_a_server_started_without_arguments_opens_only_loopback_sockets():
    options = tap.Options()
    options.parseOptions(["--storage=memory", "--no-gc-tuning"])
    reactor = MemoryReactorClock()
    service = tap.makeService(options, reactor=reactor)
    service.startService()
    try:
        # mqks, phpmq, emqp (frontend, backend, admin) and http at least
        assert len(reactor.tcpServers) >= 6
        assert {interface for _, _, _, interface in reactor.tcpServers} == {"127.0.0.1"}
    finally:
        service.stopService()
