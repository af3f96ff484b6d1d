# -*- test-case-name: tests.unit.test_plugins -*-
"""Descriptors of the built-in protocols and storage backends.

They are found the same way third-party ones are: ``twisted/plugins/`` re-exports
them and ``twisted.plugin.getPlugins`` collects them.  This module must stay
cheap to import (it is imported by every plugin scan), so each descriptor
imports its implementation only when asked to build it.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

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
        ["mqks-idle-timeout", None, 0.0,
         "MQKS: close a connection after this many seconds without a byte either way "
         "(a consumer waiting on an empty queue counts as idle); 0: never.", float],
    ]

    def __init__(self) -> None:
        # one config['workers'] list per broker, shared by its MQKS listeners
        self._workers: WeakKeyDictionary[Any, list[str]] = WeakKeyDictionary()

    def build_factory(self, broker: Any, config: Any) -> Any:
        from mqserver.limits import Limits
        from mqserver.protocols.mqks.protocol import MQKSFactory

        return MQKSFactory(
            broker,
            max_line=int(config.get("mqks-max-line", 16 * 1024 * 1024)),
            limits=Limits.from_config(config),
            workers=self._workers.setdefault(broker, []),
        )

    extra_endpoint_options: tuple[str, ...] = ()

    def extra_listeners(self, broker: Any, config: Any) -> list[tuple[str, str, Any]]:
        return []


def _phpmq_revision(value: str) -> str:
    """Checks ``--phpmq-revision`` while options are parsed, not when listening starts."""
    if value not in ("auto", "2017", "2018"):
        raise ValueError(f"--phpmq-revision must be auto, 2017 or 2018, not {value!r}")
    return value


_phpmq_revision.coerceDoc = "One of auto, 2017, 2018."  # type: ignore[attr-defined]


@implementer(IPlugin, IProtocolPlugin)
class PHPMQProtocolPlugin:
    name = "phpmq"
    description = "PHPMQ: length-prefixed frames, credit windows, revisions 2017 and 2018"
    default_endpoint = "tcp:9100:interface=127.0.0.1"
    options = [
        ["phpmq-max-content", None, 16 * 1024 * 1024,
         "PHPMQ: largest package content in bytes; a larger one closes the connection.", int],
        ["phpmq-idle-timeout", None, 0.0,
         "PHPMQ: close a connection after this many seconds without a byte either way; "
         "0: never.", float],
        ["phpmq-dead-letter-suffix", None, "",
         "PHPMQ: queues named in 001/002 dead-letter (006, expiry) into NAME+SUFFIX; empty: none."],
        ["phpmq-revision", None, "auto",
         "PHPMQ: 003 form to send: auto (2017 until a client sends a 2018-only frame), "
         "2017 or 2018.", _phpmq_revision],
    ]

    def build_factory(self, broker: Any, config: Any) -> Any:
        from mqserver.limits import Limits
        from mqserver.protocols.phpmq.protocol import PHPMQFactory

        revision = str(config.get("phpmq-revision", "auto"))
        return PHPMQFactory(
            broker,
            max_content=int(config.get("phpmq-max-content", 16 * 1024 * 1024)),
            dead_letter_suffix=str(config.get("phpmq-dead-letter-suffix", "")).encode("utf-8"),
            revision=None if revision == "auto" else int(_phpmq_revision(revision)),
            limits=Limits.from_config(config),
        )

    extra_endpoint_options: tuple[str, ...] = ()

    def extra_listeners(self, broker: Any, config: Any) -> list[tuple[str, str, Any]]:
        return []


@implementer(IPlugin, IProtocolPlugin)
class EMQPProtocolPlugin:
    """eMQP: the endpoint of ``--protocol=emqp`` is the frontend (clients, schedulers);
    the backend (workers) and admin sockets come from ``extra_listeners``."""

    name = "emqp"
    description = "eMQP (EventMQ) over ZMTP 3: ZeroMQ DEALER clients, workers and schedulers"
    default_endpoint = "tcp:47291:interface=127.0.0.1"
    options = [
        ["emqp-backend", None, "tcp:47290:interface=127.0.0.1",
         "eMQP: endpoint of the backend socket workers connect to."],
        ["emqp-admin", None, "tcp:47293:interface=127.0.0.1",
         "eMQP: endpoint of the admin socket (STATUS, ROUTER_SHOW_*, DISCONNECT)."],
        ["emqp-max-message", None, 64 * 1024 * 1024,
         "eMQP: largest ZMTP message in bytes; a larger one closes the connection.", int],
        ["emqp-max-frames", None, 64,
         "eMQP: most ZMTP frames in one message; more close the connection (after a "
         "ZMTP ERROR command to 3.1 peers).", int],
        ["emqp-heartbeat", None, 3.0, "eMQP: seconds between HEARTBEATs to workers "
         "and schedulers.", float],
        ["emqp-peer-timeout", None, 5.0,
         "eMQP: seconds of silence after which a worker or scheduler is dropped.", float],
        ["emqp-drain-timeout", None, 10.0,
         "eMQP: after DISCONNECT, seconds to wait for tracked jobs before stopping.", float],
        ["emqp-dead-letter", None, "",
         "eMQP: queue that requests out of retries go to; empty: they are dropped."],
    ]
    extra_endpoint_options = ("emqp-backend", "emqp-admin")

    def build_factory(self, broker: Any, config: Any) -> Any:
        from mqserver.protocols.emqp.protocol import service_for

        return service_for(broker, config).frontend

    def extra_listeners(self, broker: Any, config: Any) -> list[tuple[str, str, Any]]:
        from mqserver.protocols.emqp.protocol import extra_listeners

        return extra_listeners(broker, config)


@implementer(IPlugin, IStoragePlugin)
class MemoryStoragePlugin:
    name = "memory"
    description = "in-process memory only; nothing survives a restart"
    options: list[list[Any]] = []

    def build_store(self, config: Any, reactor: Any) -> Any:
        from mqserver.storage.memory import MemoryStore

        return MemoryStore()


def _sqlite_sync(value: str) -> str:
    """Checks ``--sqlite-sync`` while options are parsed."""
    if value not in ("full", "normal"):
        raise ValueError(f"{value!r} is not full or normal")
    return value


_sqlite_sync.coerceDoc = "One of full, normal."  # type: ignore[attr-defined]


def _fsync_policy(value: str) -> str:
    """Checks ``--fsync`` while options are parsed (always, never, interval:MS)."""
    policy, _, ms = value.partition(":")
    if value not in ("always", "never") and not (
        policy == "interval" and ms.isdigit() and int(ms) > 0
    ):
        raise ValueError(f"{value!r} is not always, never or interval:MS")
    return value


_fsync_policy.coerceDoc = "always, never or interval:MS."  # type: ignore[attr-defined]


def _log_checkpoint(value: str) -> str:
    """Checks ``--log-checkpoint`` while options are parsed (MIB:SECONDS or off)."""
    from mqserver.storage.log_checkpoint import parse

    parse(value)
    return value


_log_checkpoint.coerceDoc = "MIB:SECONDS or off."  # type: ignore[attr-defined]


@implementer(IPlugin, IStoragePlugin)
class SQLiteStoragePlugin:
    name = "sqlite"
    description = "one SQLite file in --data-dir (WAL, one transaction per batch)"
    options = [
        ["sqlite-sync", None, "full",
         "SQLite: PRAGMA synchronous. full: a confirmed batch survives a power cut; "
         "normal: it survives a crash of the process, a power cut may lose the last ones.",
         _sqlite_sync],
    ]

    def build_store(self, config: Any, reactor: Any) -> Any:
        import os

        from mqserver.storage.sqlite import FILENAME, SQLiteStore

        path = os.path.join(config.get("data-dir", "data"), FILENAME)
        return SQLiteStore(path, reactor, sync=str(config.get("sqlite-sync", "full")))


@implementer(IPlugin, IStoragePlugin)
class LogStoragePlugin:
    name = "log"
    description = "append-only segment files in --data-dir/log (CRC-checked, compacted)"
    options = [
        ["fsync", None, "interval:50",
         "log: always (a confirmed batch is on disk, one fsync per batch), interval:MS "
         "(written to the OS at once, fsynced every MS ms) or never.", _fsync_policy],
        ["log-segment-mb", None, 64, "log: segment file size in MiB before a new one starts.",
         int],
        ["log-checkpoint", None, "64:5",
         "log: write the index at a durable position after MIB written or SECONDS after a "
         "write (MIB:SECONDS; off: never), so a restart after a crash walks only the "
         "records after it.", _log_checkpoint],
    ]

    def build_store(self, config: Any, reactor: Any) -> Any:
        import os

        from mqserver.storage.log import LogStore
        from mqserver.storage.log_rest import LOOKS_PER_PACK

        return LogStore(
            os.path.join(config.get("data-dir", "data"), "log"),
            reactor,
            fsync=str(config.get("fsync", "interval:50")),
            segment_bytes=int(config.get("log-segment-mb", 64)) * 1024 * 1024,
            # a backlog at rest: its index goes to runs (and a checkpoint
            # follows) sooner than the broker packs it
            index_at_rest=float(config.get("pack-at-rest", 1.0)) / LOOKS_PER_PACK,
            checkpoint=str(config.get("log-checkpoint", "64:5")),
        )


@implementer(IPlugin, IStoragePlugin)
class PostgresStoragePlugin:
    name = "postgres"
    description = ("a PostgreSQL database (--postgres-dsn; one transaction per batch; "
                   "needs mqserver[postgres])")
    options = [
        ["postgres-dsn", None, "",
         "postgres: libpq connection string or URI, e.g. 'host=db dbname=mq user=mq' or "
         "postgresql://mq@db/mq; empty: libpq's defaults and PG* environment variables."],
        ["postgres-lock-wait", None, 10.0,
         "postgres: seconds to wait at start for the store's lock, which another mqserver "
         "on the same database and schema holds while it runs.", float],
    ]

    def build_store(self, config: Any, reactor: Any) -> Any:
        try:
            from mqserver.storage.postgres import PostgresStore
        except ImportError as e:
            raise SystemExit(
                f"--storage=postgres needs psycopg 3: pip install 'mqserver[postgres]' ({e})"
            ) from e
        return PostgresStore(str(config.get("postgres-dsn", "")), reactor,
                             lock_wait=float(config.get("postgres-lock-wait", 10.0)))


mqks = MQKSProtocolPlugin()
phpmq = PHPMQProtocolPlugin()
emqp = EMQPProtocolPlugin()
memory = MemoryStoragePlugin()
sqlite = SQLiteStoragePlugin()
logstore = LogStoragePlugin()
postgres = PostgresStoragePlugin()
