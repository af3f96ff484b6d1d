"""Shared fixtures: a broker on a fake clock for unit tests, PostgreSQL servers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.pgtesting import PostgresCluster, find_bindir
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker(clock: Clock) -> Broker:
    return Broker(MemoryStore(), clock)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of the test module's own (``mqserver.pgtesting``)."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, postgres): install Debian's "
                    "postgresql package (`make postgres-setup`; .ci/run does) or set "
                    "MQSERVER_PG_BINDIR")
    cluster = PostgresCluster.create(bindir)
    yield cluster
    cluster.destroy()


@pytest.fixture
def postgres_dsn(postgres_cluster: PostgresCluster) -> str:
    """A new, empty database on the module's cluster: its DSN."""
    return postgres_cluster.create_database(f"test_{next(_databases)}")


_databases = itertools.count(1)
