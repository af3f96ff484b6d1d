"""Unit-test fixtures shared by more than one module (test modules cannot import each other)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent, globalLogPublisher

from mqserver.broker.core import Broker
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.protocol import PHPMQFactory
from mqserver.storage.memory import MemoryStore


class PHPMQHarness:
    """A broker on a fake clock with a PHPMQ factory; ``connect()`` gives clients."""

    def __init__(self, **options) -> None:
        self.clock = Clock()
        self.broker = Broker(MemoryStore(), self.clock)
        self.factory = PHPMQFactory(self.broker, **options)

    def connect(self) -> PHPMQClient:
        protocol = self.factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        protocol.makeConnection(transport)
        return PHPMQClient(self, protocol, transport)

    def ready(self, queue: bytes) -> list[bytes]:
        return [m.body for m in self.broker.queues[queue].ready]


class PHPMQClient:
    """One connection over StringTransport: send frames, read what was dispatched."""

    def __init__(self, harness: PHPMQHarness, protocol, transport: StringTransport) -> None:
        self.harness, self.protocol, self.transport = harness, protocol, transport

    def send(self, *frames: bytes) -> None:
        self.protocol.dataReceived(b"".join(frames))
        self.harness.clock.advance(0)

    def publish(self, queue: bytes, *bodies: bytes) -> None:
        self.send(*(codec.publish(queue, body) for body in bodies))

    def frames(self) -> list[codec.Frame]:
        self.harness.clock.advance(0)
        out = codec.decode(self.transport.value())
        self.transport.clear()
        return out

    def bodies(self) -> list[bytes]:
        return [f.packages[codec.CONTENT] for f in self.frames()]

    def ids(self) -> list[bytes]:
        return [f.packages[codec.MESSAGE_ID] for f in self.frames()]

    def close(self) -> None:
        self.protocol.connectionLost()

    def close_reason(self, data: bytes) -> str:
        """Send ``data``, which must make the server close this connection: its log line."""
        with capturedLogs() as events:
            self.protocol.dataReceived(data)
        assert self.transport.disconnecting
        [line] = [formatEvent(e) for e in events if "closed by the server" in formatEvent(e)]
        return line


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """Every line logged while the test runs, formatted."""
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


@pytest.fixture(scope="session")
def phpmq() -> type[PHPMQHarness]:
    """``phpmq(**PHPMQFactory options)`` makes a harness (session scope: it is only a class)."""
    return PHPMQHarness
