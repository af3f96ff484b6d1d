"""Overflow refusals and the memory alarm as MQKS and PHPMQ clients see them (StringTransport)."""

from __future__ import annotations

import re

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mqserver.broker.core import Broker
from mqserver.model import QueueOptions
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.protocols.phpmq import codec
from mqserver.storage.memory import MemoryStore

FULL = QueueOptions(max_length=1, overflow="reject-publish")


class Gauge:
    """A memory measurement the test sets."""

    value = 0

    def __call__(self) -> int:
        return self.value


def mqks() -> tuple[Broker, Clock, object, StringTransport]:
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    protocol = MQKSFactory(broker).buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
    protocol.makeConnection(transport)
    return broker, clock, protocol, transport


def alarm_on(broker: Broker, clock: Clock) -> Gauge:
    gauge = Gauge()
    broker.flow.measure = gauge
    broker.flow.configure(1000, interval=1.0)
    broker.flow.start()
    return gauge


def test_mqks_publish_to_a_full_queue_gets_an_error_reply():
    broker, clock, protocol, transport = mqks()
    broker.declare_queue(b"q", FULL)
    broker.reconfigure(b"q", replace=[b"ev"])
    protocol.dataReceived(b"m1 publish ev one\nm2 publish --confirm ev two\nm3 ping x\n")
    clock.advance(0)
    lines = transport.value().splitlines()
    assert re.fullmatch(rb"m2 error \d{20}[0-9a-zA-Z]{4}", lines[0])
    assert lines[1:] == [b"m3 ok x"]
    assert [m.body for m in broker.queues[b"q"].ready] == [b"one"]


def test_mqks_publisher_stops_being_read_during_the_memory_alarm():
    broker, clock, protocol, transport = mqks()
    gauge = alarm_on(broker, clock)
    protocol.dataReceived(b"m1 publish ev one\n")
    gauge.value = 1000
    clock.advance(1)
    assert transport.producerState == "paused"
    gauge.value = 10
    clock.advance(1)
    assert transport.producerState == "producing"


def test_mqks_consumer_keeps_being_read_during_the_memory_alarm():
    broker, clock, protocol, transport = mqks()
    gauge = alarm_on(broker, clock)
    protocol.dataReceived(b"c1 consume q --manual-ack\n")
    gauge.value = 1000
    clock.advance(1)
    assert broker.flow.active and transport.producerState == "producing"


def test_phpmq_publish_to_a_full_queue_is_dropped_and_the_connection_stays(phpmq):
    h = phpmq()
    h.broker.declare_queue(b"q", FULL)
    client = h.connect()
    client.publish(b"q", b"one", b"two", b"three")
    assert h.ready(b"q") == [b"one"]
    assert h.broker.queues[b"q"].refused == 2
    assert client.transport.connected
    client.send(codec.consume(b"q", 5))
    assert client.bodies() == [b"one"]


def test_phpmq_publisher_stops_being_read_during_the_memory_alarm(phpmq):
    h = phpmq()
    gauge = alarm_on(h.broker, h.clock)
    client = h.connect()
    client.publish(b"q", b"one")
    gauge.value = 5000
    h.clock.advance(1)
    assert client.transport.producerState == "paused"
    gauge.value = 0
    h.clock.advance(1)
    assert client.transport.producerState == "producing"


def test_mqks_consume_sets_max_length_and_overflow_and_keeps_them_when_omitted():
    broker, clock, protocol, transport = mqks()
    protocol.dataReceived(b"c1 consume q --max-length=2 --overflow=reject-publish\n")
    assert broker.queues[b"q"].options == QueueOptions(max_length=2, overflow="reject-publish")
    protocol.dataReceived(b"c2 consume q --manual-ack\n")  # no flags: the limits stay
    assert broker.queues[b"q"].options.max_length == 2
    assert broker.queues[b"q"].reject
    protocol.dataReceived(b"c3 consume q --max-length=0\nc4 consume q --overflow=drop-tail\n")
    clock.advance(0)
    assert [line.split(b" ")[:2] for line in transport.value().splitlines()] == [
        [b"c3", b"error"], [b"c4", b"error"],
    ]
