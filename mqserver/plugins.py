# -*- test-case-name: tests.unit.test_plugins -*-
"""Descriptors of the built-in protocols and storage backends.

They are found the same way third-party ones are: ``twisted/plugins/`` re-exports
them and ``twisted.plugin.getPlugins`` collects them.  This module must stay
cheap to import (it is imported by every plugin scan), so each descriptor
imports its implementation only when asked to build it.
"""

from __future__ import annotations

from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from mqserver.interfaces import IProtocolPlugin, IStoragePlugin


@implementer(IPlugin, IProtocolPlugin)
class MQKSProtocolPlugin:
    name = "mqks"
    description = "MQKS: one text line per request, event fan-out, masks, manual ack"
    default_endpoint = "tcp:25000:interface=127.0.0.1"
    options = [
        ["mqks-max-line", None, 16 * 1024 * 1024,
         "MQKS: longest request line in bytes; longer ones get an error and a disconnect.", int],
    ]

    def build_factory(self, broker: Any, config: Any) -> Any:
        from mqserver.protocols.mqks.protocol import MQKSFactory

        return MQKSFactory(broker, max_line=int(config.get("mqks-max-line", 16 * 1024 * 1024)))


@implementer(IPlugin, IStoragePlugin)
class MemoryStoragePlugin:
    name = "memory"
    description = "in-process memory only; nothing survives a restart"
    options: list[list[Any]] = []

    def build_store(self, config: Any, reactor: Any) -> Any:
        from mqserver.storage.memory import MemoryStore

        return MemoryStore()


mqks = MQKSProtocolPlugin()
memory = MemoryStoragePlugin()
