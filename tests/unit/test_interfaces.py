"""Every implementation provides the interface it claims (one parametrized test)."""

from __future__ import annotations

import pytest
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock
from twisted.plugin import IPlugin
from zope.interface.verify import verifyObject

from mqserver.broker.core import Broker
from mqserver.interfaces import (
    IBroker,
    ICleanShutdown,
    IClientConnection,
    IDeliverySink,
    IMessageStore,
    IProtocolPlugin,
    IStoragePlugin,
)
from mqserver.plugins import emqp, logstore, memory, mqks, phpmq, sqlite
from mqserver.protocols.emqp.peers import Worker
from mqserver.protocols.emqp.service import EMQPService
from mqserver.protocols.mqks.protocol import MQKSFactory
from mqserver.protocols.phpmq.protocol import PHPMQFactory
from mqserver.storage.log import LogStore
from mqserver.storage.memory import MemoryStore
from mqserver.storage.sqlite import SQLiteStore
from mqserver.testing import RecordingSink
from mqserver.web.consumers import HTTPConsumers


def _mqks_protocol():
    return MQKSFactory(Broker(MemoryStore(), Clock())).buildProtocol(None)


def _phpmq_protocol():
    return PHPMQFactory(Broker(MemoryStore(), Clock())).buildProtocol(None)


def _http_consumer():
    return HTTPConsumers(Broker(MemoryStore(), Clock())).open(b"c", b"q", "127.0.0.1:1")


def _emqp_worker():
    return Worker(EMQPService(Broker(MemoryStore(), Clock())), b"w", [], 0.0)


IMPLEMENTATIONS = [
    (IMessageStore, MemoryStore),
    (IStoragePlugin, lambda: memory),
    (IPlugin, lambda: memory),
    (IMessageStore, lambda: SQLiteStore("unused.sqlite3")),
    (ICleanShutdown, lambda: SQLiteStore("unused.sqlite3")),
    (IStoragePlugin, lambda: sqlite),
    (IPlugin, lambda: sqlite),
    (IMessageStore, lambda: LogStore("unused-log")),
    (ICleanShutdown, lambda: LogStore("unused-log")),
    (IStoragePlugin, lambda: logstore),
    (IPlugin, lambda: logstore),
    (IProtocolPlugin, lambda: mqks),
    (IPlugin, lambda: mqks),
    (IProtocolPlugin, lambda: phpmq),
    (IPlugin, lambda: phpmq),
    (IProtocolPlugin, lambda: emqp),
    (IPlugin, lambda: emqp),
    (IBroker, lambda: Broker(MemoryStore(), Clock())),
    (IDeliverySink, _mqks_protocol),
    (IDeliverySink, _phpmq_protocol),
    (IPushProducer, _phpmq_protocol),
    (IDeliverySink, _emqp_worker),
    (IClientConnection, _emqp_worker),
    (IDeliverySink, RecordingSink),
    (IClientConnection, _mqks_protocol),
    (IClientConnection, _phpmq_protocol),
    (IDeliverySink, _http_consumer),
    (IClientConnection, _http_consumer),
]


@pytest.mark.parametrize(("interface", "make"), IMPLEMENTATIONS)
def test_provides(interface, make):
    assert verifyObject(interface, make())
