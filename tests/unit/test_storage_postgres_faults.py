"""PostgreSQL going away under a running broker: no confirm for what was not
committed, and nothing missing once the writer's retry reaches it again.

The faults are real: the module's own cluster is restarted in immediate mode
(a crash of the database server: every session is cut) and stopped for a
while (connections refused).  The broker runs on a fake clock, so the
writer's retries happen when the test advances it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest_twisted
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.pgtesting import PostgresCluster
from mqserver.storage.postgres import PostgresStore
from mqserver.testing import RecordingSink


def outcome(d: Any) -> Any:
    """A Deferred that fires with ``[Failure]`` or None, so a test can look at either."""
    return d.addCallbacks(lambda _: None, lambda failure: [failure])


@pytest_twisted.inlineCallbacks
def test_a_database_restart_confirms_nothing_and_the_retry_leaves_no_hole(
    postgres_cluster: PostgresCluster, postgres_dsn: str,
) -> Any:
    clock = Clock()
    store = PostgresStore(postgres_dsn)
    broker = Broker(store, clock)
    broker.load((yield store.open()))
    consumer = broker.consume(broker.connection_opened("test", "peer", RecordingSink()),
                              b"c", b"q", window=10)
    broker.publish_to_queue(b"q", b"m1", b"stored before")
    d = outcome(broker.durable())
    clock.advance(0)
    assert (yield d) is None

    postgres_cluster.restart("immediate")  # every session is cut
    broker.publish_to_queue(b"q", b"m2", b"during the fault")
    broker.publish_to_queue(b"q", b"m3", b"acked during the fault")
    d = outcome(broker.durable())
    clock.advance(0)
    [failure] = yield d
    assert failure.check(psycopg.OperationalError)
    assert broker.writer.failing
    assert broker.ack(consumer, b"m3")  # memory keeps serving

    postgres_cluster.stop("immediate")  # down for a while: connections refused
    broker.publish_to_queue(b"q", b"m4", b"while it is down")
    d = outcome(broker.durable())
    clock.advance(0.5)  # the writer's first retry
    [failure] = yield d
    assert failure.check(psycopg.OperationalError)

    postgres_cluster.start()
    d = outcome(broker.durable())
    clock.advance(1.0)  # the second retry reconnects and commits everything kept
    assert (yield d) is None
    assert not broker.writer.failing and store.reconnects == 1
    yield store.close()

    store = PostgresStore(postgres_dsn)
    recovered = yield store.open()
    yield store.close()
    # m3 was acked: its enqueue and remove went out in order, so it stays gone
    assert [m.id for m in recovered.queues[b"q"].messages] == [b"m1", b"m2", b"m4"]
