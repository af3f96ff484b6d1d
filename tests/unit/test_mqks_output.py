"""MQKS output: deliveries another connection's chunk made are sent in the same reactor turn."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

from mqserver.broker.core import Broker
from mqserver.protocols.mqks.output import send_now
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.storage.memory import MemoryStore


class SocketLike(StringTransport):
    """A transport with the reactor's ``doWrite``: what it buffered moves to ``sent``."""

    disconnecting = False

    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        self.sent = b""
        self.send_calls = 0

    def doWrite(self) -> None:
        self.send_calls += 1
        self.sent += self.value()
        self.clear()


def connect(factory: MQKSFactory) -> tuple[Any, SocketLike]:
    protocol = factory.buildProtocol(None)
    transport = SocketLike()
    protocol.makeConnection(transport)
    return protocol, transport


def pair() -> tuple[Clock, Any, SocketLike, Any, SocketLike]:
    """A clock, then a consumer and a producer connection of one broker, with their sockets."""
    clock = Clock()
    factory = MQKSFactory(Broker(MemoryStore(), clock))
    return clock, *connect(factory), *connect(factory)


def test_a_delivery_made_by_another_connections_publish_is_sent_at_once():
    clock, consumer, consumer_socket, producer, producer_socket = pair()
    consumer.dataReceived(b"c1 consume q ev\n")
    clock.advance(0)
    producer.dataReceived(b"m1 publish ev hello\n")
    # no reactor turn in between: the delivery is on the wire already
    assert consumer_socket.sent == b"c1 ok m1 event=ev hello\n"
    assert consumer_socket.send_calls == 1
    # the publisher's own answers keep the reactor's write pass
    producer.dataReceived(b"p1 ping x\n")
    assert producer_socket.value() == b"p1 ok x\n"
    assert producer_socket.send_calls == 0


def test_a_consumers_own_acks_leave_its_next_deliveries_to_the_write_pass():
    clock, consumer, consumer_socket, producer, _ = pair()
    producer.dataReceived(b"r rebind q ev\nm1 publish ev one\nm2 publish ev two\n")
    consumer.dataReceived(b"c1 consume q --manual-ack\n")
    clock.advance(0)
    consumer_socket.clear()
    consumer.dataReceived(b"a ack c1 m1\n")
    assert consumer_socket.send_calls == 0


def test_send_now_leaves_a_closing_connection_to_the_reactor():
    transport = SocketLike()
    transport.write(b"bye\n")
    transport.disconnecting = True
    send_now(transport)
    assert transport.send_calls == 0
    assert transport.value() == b"bye\n"


def test_send_now_without_do_write_only_buffers():
    transport = StringTransport()
    transport.write(b"x\n")
    send_now(transport)
    assert transport.value() == b"x\n"


def test_send_now_reaches_the_socket_through_a_protocol_wrapper():
    """connlimits wraps every connection in a ``ProtocolWrapper``."""
    transport = SocketLike()
    wrapper = ProtocolWrapper(WrappingFactory(None), Protocol())
    wrapper.makeConnection(transport)
    wrapper.write(b"through\n")
    send_now(wrapper)
    assert transport.sent == b"through\n"
