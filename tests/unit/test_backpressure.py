"""Slow consumers: deliveries pause on a full transport or a full turn, and resume (StringTransport)."""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.broker.core import Broker
from mqserver.protocols.backpressure import OUTPUT_HIGH_WATER
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.protocols.phpmq import codec as phpmq_codec
from mqserver.storage.memory import MemoryStore

BODY = b"x" * 10_000


class FullTransport(StringTransport):
    """Records each write; with ``full`` set, a write fills it as a slow client's would
    (a real transport calls ``pauseProducing`` once its buffer passes ``bufferSize``)."""

    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        self.writes: list[int] = []
        self.full = False

    def write(self, data: bytes) -> None:
        super().write(data)
        self.writes.append(len(data))
        if self.full and self.producer is not None:
            self.producer.pauseProducing()


def mqks_consumer() -> tuple[Broker, Clock, object, FullTransport]:
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    protocol = MQKSFactory(broker).buildProtocol(None)
    transport = FullTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b"c1 consume q ev\n")
    clock.advance(0)
    transport.clear()
    transport.writes.clear()
    return broker, clock, protocol, transport


def publish(broker: Broker, count: int) -> None:
    for n in range(count):
        broker.publish_to_queue(b"q", b"m%d" % n, BODY)


def test_one_turn_buffers_at_most_the_high_water_mark():
    broker, clock, _protocol, transport = mqks_consumer()
    publish(broker, 100)
    clock.advance(0)  # every turn: dispatch until the mark, flush, resume, dispatch...
    assert transport.value().count(b"\n") == 100
    line = max(len(x) + 1 for x in transport.value().splitlines())
    assert len(transport.writes) == 4  # 100 lines of 10 kB: four turns of at most 27
    assert max(transport.writes) <= OUTPUT_HIGH_WATER + line


def test_a_full_transport_pauses_delivery_until_it_drains():
    broker, clock, protocol, transport = mqks_consumer()
    transport.full = True
    publish(broker, 100)
    clock.advance(0)
    assert len(transport.writes) == 1  # the first flush filled it: nothing more
    sent = transport.value().count(b"\n")
    assert len(broker.queues[b"q"].ready) == 100 - sent
    transport.full = False
    protocol.resumeProducing()  # drained
    clock.advance(0)
    assert transport.value().count(b"\n") == 100


def test_a_paused_transport_gets_nothing_at_all():
    broker, clock, protocol, transport = mqks_consumer()
    protocol.pauseProducing()
    publish(broker, 3)
    clock.advance(0)
    assert transport.value() == b"" and len(broker.queues[b"q"].ready) == 3
    protocol.resumeProducing()
    clock.advance(0)
    assert transport.value().count(b"\n") == 3


def test_phpmq_dispatches_are_bounded_per_turn_too(phpmq):
    h = phpmq()
    client = h.connect()
    client.send(phpmq_codec.consume(b"q", 1000))
    for n in range(60):
        h.broker.publish_to_queue(b"q", b"m%d" % n, BODY)
    writes: list[int] = []
    write = client.transport.write
    client.transport.write = lambda data: writes.append(len(data)) or write(data)
    h.clock.advance(0)
    assert len(client.frames()) == 60
    frame = len(phpmq_codec.dispatch(b"q", BODY, b"m10"))
    assert len(writes) > 1 and max(writes) <= OUTPUT_HIGH_WATER + frame
