# -*- test-case-name: tests.unit.test_connlimits -*-
"""Connection limits (total and per IP) and idle timeouts, for every listener.

``makeService`` wraps each listener's factory in a ``GuardedFactory``; all of
them share one ``ConnectionLimits``, so ``--max-connections`` counts MQKS,
PHPMQ, eMQP and HTTP connections together.  ``--max-connections-per-ip``
counts remote IPs only: loopback and Unix-socket clients are this host's own
processes (``per_ip_key``), unless ``--limit-loopback-per-ip``.  A connection over a limit is
closed as soon as it is made and the refusal is logged; a protocol that can
say why first gives its factory a ``refusal(reason) -> bytes`` method (MQKS
answers with an error line).

An idle timeout closes a connection that neither sent nor was sent a byte
for that many seconds: a consumer that is being delivered to is busy, one
waiting on an empty queue is idle.  The timer uses the reactor given, so
``task.Clock`` drives it in tests.  Protocols with heartbeats of their own
(eMQP) and HTTP (twisted.web has its own timeout) get none.
"""

from __future__ import annotations

from collections import Counter
from ipaddress import ip_address
from typing import Any

from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, TimeoutMixin, WrappingFactory
from twisted.python.failure import Failure

log = Logger()

DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_MAX_PER_IP = 1_000


REFUSAL_REASONS = ("max_connections", "max_connections_per_ip")
"""The ``reason`` labels of ``mqserver_connections_refused_total``."""


def per_ip_key(address: Any, loopback: bool = False) -> str | None:
    """The IP a connection from ``address`` counts against, or None if it counts against none.

    A Unix-socket client has no IP.  A loopback client (127.0.0.0/8, ::1)
    is a process of this host, which ``--max-connections`` already bounds:
    the per-IP limit is there so one remote host cannot take every slot,
    and counting a host's whole local fleet (a PHP-FPM pool, a worker
    farm) as one IP would refuse it from its thousand-and-first process.
    ``loopback`` (``--limit-loopback-per-ip``) counts loopback clients too.
    """
    host = getattr(address, "host", None)
    if not isinstance(host, str):
        return None
    try:
        ip = ip_address(host.partition("%")[0])  # an IPv6 zone is no part of the address
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    if not loopback and (ip.is_loopback or (mapped is not None and mapped.is_loopback)):
        return None
    return host


class ConnectionLimits:
    """Open connections, in total and by peer IP, across every listener."""

    def __init__(self, total: int = DEFAULT_MAX_CONNECTIONS,
                 per_ip: int = DEFAULT_MAX_PER_IP, loopback_per_ip: bool = False) -> None:
        self.max_total = total
        self.max_per_ip = per_ip
        self.loopback_per_ip = loopback_per_ip
        self.total = 0
        self.by_host: Counter[str] = Counter()
        self.refused_by: Counter[str] = Counter()

    @property
    def refused(self) -> int:
        """Connections refused for any reason."""
        return self.refused_by.total()

    def admit(self, host: str | None) -> str | None:
        """Count a new connection from the IP ``host`` (None: one that counts against no
        IP, see ``per_ip_key``), or return why it is refused (then it is not counted)."""
        if self.max_total and self.total >= self.max_total:
            self.refused_by["max_connections"] += 1
            return f"{self.total} connections open (--max-connections {self.max_total})"
        if host is not None:
            if self.max_per_ip and self.by_host[host] >= self.max_per_ip:
                self.refused_by["max_connections_per_ip"] += 1
                return (f"{self.by_host[host]} connections open from {host} "
                        f"(--max-connections-per-ip {self.max_per_ip})")
            self.by_host[host] += 1
        self.total += 1
        return None

    def release(self, host: str | None) -> None:
        self.total -= 1
        if host is not None:
            self.by_host[host] -= 1
            if not self.by_host[host]:
                del self.by_host[host]


class _Refused(Protocol):
    """What an over-the-limit connection gets: the protocol's refusal, if any, then a close."""

    def __init__(self, message: bytes | None) -> None:
        self.message = message

    def connectionMade(self) -> None:
        if self.message:
            self.transport.write(self.message)
        self.transport.loseConnection()


class GuardedProtocol(ProtocolWrapper, TimeoutMixin):
    """Counts itself out of the limits when it goes, and times out when idle."""

    factory: GuardedFactory
    host = "?"
    ip: str | None = None  # what it counts against in the per-IP limit (``per_ip_key``)

    def makeConnection(self, transport: Any) -> None:
        self.callLater = self.factory.clock.callLater
        self.setTimeout(self.factory.idle_timeout)
        # a broker's writes are small answers and deliveries, already joined
        # per received chunk: none should wait for the peer's delayed ACK
        set_no_delay = getattr(transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        super().makeConnection(transport)

    def dataReceived(self, data: bytes) -> None:
        self.resetTimeout()
        super().dataReceived(data)

    def write(self, data: bytes) -> None:
        self.resetTimeout()
        super().write(data)

    def writeSequence(self, data: Any) -> None:
        self.resetTimeout()
        super().writeSequence(data)

    def timeoutConnection(self) -> None:
        log.info("{label} connection from {host} closed: idle for {timeout} s",
                 label=self.factory.label, host=self.host, timeout=self.factory.idle_timeout)
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()  # a client that reads nothing would hold a plain close open
        else:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure) -> None:
        self.setTimeout(None)
        self.factory.limits.release(self.ip)
        super().connectionLost(reason)


class GuardedFactory(WrappingFactory):
    """One listener's factory behind the shared limits, with its idle timeout (None: off)."""

    protocol = GuardedProtocol

    def __init__(self, wrapped: Any, limits: ConnectionLimits, label: str, clock: Any,
                 idle_timeout: float | None = None) -> None:
        super().__init__(wrapped)
        self.limits = limits
        self.label = label
        self.clock = clock
        self.idle_timeout = idle_timeout or None

    def buildProtocol(self, addr: Any) -> Any:
        host = str(getattr(addr, "host", addr))
        ip = per_ip_key(addr, self.limits.loopback_per_ip)
        reason = self.limits.admit(ip)
        if reason is not None:
            log.warn("{label} connection from {host} refused: {reason}",
                     label=self.label, host=host, reason=reason)
            refusal = getattr(self.wrappedFactory, "refusal", None)
            refused = _Refused(refusal(reason) if refusal is not None else None)
            refused.factory = self
            return refused
        try:
            protocol = super().buildProtocol(addr)
        except BaseException:
            self.limits.release(ip)
            raise
        if protocol is None:
            self.limits.release(ip)
            return None
        protocol.host, protocol.ip = host, ip
        return protocol
