"""Connection limits and idle timeouts on the listeners' factories (StringTransport, Clock)."""

from __future__ import annotations

import re

import pytest
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqserver.broker.core import Broker
from mqserver.connlimits import ConnectionLimits, GuardedFactory, per_ip_key
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.storage.memory import MemoryStore


def connect(factory: GuardedFactory, host: str = "10.0.0.1", port: int = 4000):
    address = IPv4Address("TCP", host, port)
    protocol = factory.buildProtocol(address)
    transport = StringTransport(peerAddress=address)
    protocol.makeConnection(transport)
    return protocol, transport


class Echo(Protocol):
    def dataReceived(self, data: bytes) -> None:
        self.transport.write(data)


def echo_factory(limits: ConnectionLimits, clock: Clock, idle: float | None = None):
    return GuardedFactory(Factory.forProtocol(Echo), limits, "echo", clock, idle)


def test_total_and_per_ip_limits_are_shared_by_every_listener():
    limits = ConnectionLimits(total=3, per_ip=2)
    clock = Clock()
    first, second = echo_factory(limits, clock), echo_factory(limits, clock)
    a = connect(first, "10.0.0.1")
    connect(second, "10.0.0.1")
    _, refused = connect(first, "10.0.0.1")  # third from one IP
    assert refused.disconnecting and refused.value() == b""
    connect(second, "10.0.0.2")
    _, refused = connect(first, "10.0.0.3")  # fourth in all
    assert refused.disconnecting
    assert (limits.total, limits.refused) == (3, 2)
    a[0].connectionLost(Failure(ConnectionError("gone")))
    assert limits.total == 2 and limits.by_host["10.0.0.1"] == 1
    _, transport = connect(first, "10.0.0.3")
    assert not transport.disconnecting


@pytest.mark.parametrize(("address", "key", "strict"), [
    (IPv4Address("TCP", "10.0.0.1", 4000), "10.0.0.1", "10.0.0.1"),
    (IPv4Address("TCP", "127.0.0.1", 4000), None, "127.0.0.1"),
    (IPv4Address("TCP", "127.8.9.10", 4000), None, "127.8.9.10"),
    (IPv6Address("TCP", "::1", 4000), None, "::1"),
    (IPv6Address("TCP", "::ffff:127.0.0.1", 4000), None, "::ffff:127.0.0.1"),
    (IPv6Address("TCP", "fe80::1%eth0", 4000), "fe80::1%eth0", "fe80::1%eth0"),
    (IPv6Address("TCP", "2001:db8::1", 4000), "2001:db8::1", "2001:db8::1"),
    (UNIXAddress(b"/run/mqserver.sock"), None, None),
    (None, None, None),
])
def test_loopback_and_unix_clients_count_against_no_ip(address, key, strict):
    """``strict``: with --limit-loopback-per-ip, which still leaves Unix sockets out."""
    assert per_ip_key(address) == key
    assert per_ip_key(address, loopback=True) == strict


def test_loopback_clients_are_bounded_by_the_total_only():
    """A local fleet (a PHP-FPM pool) is not one IP's worth of connections; unless
    --limit-loopback-per-ip."""
    clock = Clock()
    factory = echo_factory(ConnectionLimits(total=5, per_ip=2), clock)
    opened = [connect(factory, "127.0.0.1", port)[1] for port in range(5)]
    assert not any(t.disconnecting for t in opened)
    assert connect(factory, "127.0.0.1", 99)[1].disconnecting  # the sixth in all
    assert factory.limits.refused_by == {"max_connections": 1}
    strict = echo_factory(ConnectionLimits(total=5, per_ip=2, loopback_per_ip=True), clock)
    opened = [connect(strict, "127.0.0.1", port)[1] for port in range(3)]
    assert [t.disconnecting for t in opened] == [False, False, True]
    assert strict.limits.refused_by == {"max_connections_per_ip": 1}


def test_an_exempt_connection_is_released_from_the_total_only():
    limits = ConnectionLimits(total=2, per_ip=1)
    factory = echo_factory(limits, Clock())
    local, _ = connect(factory, "127.0.0.1")
    remote, _ = connect(factory, "10.0.0.1")
    assert (limits.total, dict(limits.by_host)) == (2, {"10.0.0.1": 1})
    local.connectionLost(Failure(ConnectionError("gone")))
    remote.connectionLost(Failure(ConnectionError("gone")))
    assert (limits.total, dict(limits.by_host)) == (0, {})


def test_zero_means_no_limit():
    limits = ConnectionLimits(total=0, per_ip=0)
    factory = echo_factory(limits, Clock())
    for port in range(50):
        assert not connect(factory, port=port)[1].disconnecting


def test_mqks_over_the_limit_gets_an_error_line_then_the_close():
    clock = Clock()
    factory = GuardedFactory(MQKSFactory(Broker(MemoryStore(), clock)),
                             ConnectionLimits(total=1), "mqks", clock)
    protocol, transport = connect(factory)
    protocol.dataReceived(b"p ping x\n")
    clock.advance(0)
    assert transport.value() == b"p ok x\n"
    _, refused = connect(factory)
    assert re.fullmatch(rb"None error \d{20}[0-9a-zA-Z]{4}\n", refused.value())
    assert refused.disconnecting


def test_idle_connections_are_closed_and_traffic_either_way_keeps_them_open():
    clock = Clock()
    factory = echo_factory(ConnectionLimits(), clock, idle=10)
    protocol, transport = connect(factory)
    clock.advance(9)
    protocol.dataReceived(b"hello")  # read and written: the timer starts again
    clock.advance(9)
    protocol.write(b"a delivery")  # written only: still busy
    clock.advance(9)
    assert not transport.disconnecting
    clock.advance(1)
    assert transport.disconnecting


def test_no_idle_timeout_by_default():
    clock = Clock()
    factory = echo_factory(ConnectionLimits(), clock)
    _, transport = connect(factory)
    assert not clock.getDelayedCalls()
    clock.advance(10**6)
    assert not transport.disconnecting


class TCPLikeTransport(StringTransport):
    """A transport with ITCPTransport's Nagle switch."""

    no_delay = False

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


def test_accepted_tcp_connections_do_not_wait_for_delayed_acks():
    factory = echo_factory(ConnectionLimits(), Clock())
    protocol = factory.buildProtocol(IPv4Address("TCP", "10.0.0.1", 4000))
    transport = TCPLikeTransport()
    protocol.makeConnection(transport)
    assert transport.no_delay is True
    protocol.dataReceived(b"ping")
    assert transport.value() == b"ping"
