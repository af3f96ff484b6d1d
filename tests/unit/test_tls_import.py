"""Which listeners let a server start without pyOpenSSL (the process-wide part
runs in a fresh interpreter: tests/unit/test_tap.py)."""

from __future__ import annotations

import pytest

from mqserver.tls_import import leave_out_tls, plain


@pytest.mark.parametrize("description", [
    "tcp:25000:interface=127.0.0.1", "TCP:0", "tcp6:port=0:interface=\\:\\:1",
    "unix:/run/mqserver.sock", "systemd:domain=INET:index=0", "8080",
])
def test_plain_endpoints(description):
    assert plain(description)


@pytest.mark.parametrize("description", [
    "ssl:0:privateKey=key.pem", "le:/srv/acme:tcp:443", "onion:80", "", "tcpx:1",
])
def test_tls_or_unknown_endpoints(description):
    assert not plain(description)


def test_plain_listeners_leave_openssl_out_before_the_reactor_looks():
    modules: dict[str, object] = {}
    assert leave_out_tls(["tcp:1", "unix:/s"], modules)
    assert modules == {"OpenSSL": None}


@pytest.mark.parametrize(("descriptions", "modules"), [
    (["tcp:1", "ssl:2:privateKey=k"], {}),
    (None, {}),  # a protocol plugin's extra listeners are not named
    (["tcp:1"], {"twisted.internet.tcp": object()}),  # the reactor looked already
    (["tcp:1"], {"OpenSSL": object()}),
])
def test_otherwise_nothing_changes(descriptions, modules):
    before = dict(modules)
    assert not leave_out_tls(descriptions, modules)
    assert modules == before
