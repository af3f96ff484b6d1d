"""The durable state's normal form, the recording store, and the machine biting.

The machine itself runs against every store through
``StoreContract.test_recovers_exactly_what_the_broker_held``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.durability import (
    KEPT_FIELDS,
    RecordingStore,
    broker_state,
    check_recovered,
    difference,
    message_values,
    recovered_state,
    replay,
    snapshot_op,
)
from mqserver.durability_machine import verify_store
from mqserver.model import (
    BIND,
    DECLARE,
    ENQUEUE,
    REQUEUE,
    Message,
    QueueOptions,
    Recovered,
    RecoveredQueue,
)
from mqserver.storage.sqlite import SQLiteStore
from mqserver.testing import DurableMemoryStore, RecordingSink, message


def test_every_message_field_is_compared():
    assert set(KEPT_FIELDS) == set(Message.__slots__)


def test_in_flight_messages_count_as_ready_at_their_seq():
    clock = Clock()
    broker = Broker(DurableMemoryStore(), clock)
    broker.reconfigure(b"q", add=[b"e"], options=QueueOptions(max_length=9))
    for n in range(3):
        broker.publish_event(b"e", b"m%d" % n, b"body")
    connection = broker.connection_opened("test", "peer", RecordingSink())
    broker.consume(connection, b"c", b"q", window=2)
    clock.advance(0)
    broker.put_record(b"ns", b"k", b"v")
    broker.put_record(b"empty", b"k", b"v")
    broker.delete_record(b"empty", b"k")
    state = broker_state(broker)
    queue = state.queues[b"q"]
    assert [m[0] for m in queue.messages] == [b"m0", b"m1", b"m2"]
    assert queue.bindings == (b"e",) and queue.options == QueueOptions(max_length=9)
    assert state.records == {b"ns": {b"k": b"v"}}
    recovered = Recovered({b"q": RecoveredQueue(
        b"q", QueueOptions(max_length=9), {b"e"},
        [message for message in sorted(broker.queues[b"q"].ready, key=lambda m: m.seq)]
        + list(connection.consumers[b"c"].unacked.values()),
    )}, next_seq=4, records={b"ns": {b"k": b"v"}, b"empty": {}})
    assert recovered_state(recovered) == state


def test_check_recovered_names_what_differs_and_checks_next_seq():
    expected = recovered_state(Recovered({b"q": RecoveredQueue(b"q", messages=[message(1)])}))
    wrong = Recovered({b"q": RecoveredQueue(b"q", messages=[message(1, retry=1)])}, next_seq=2)
    with pytest.raises(AssertionError, match="queue b'q'"):
        check_recovered(wrong, expected, 2, "here")
    same = Recovered({b"q": RecoveredQueue(b"q", messages=[message(1)])}, next_seq=1)
    with pytest.raises(AssertionError, match="next_seq 1 <= seq 1"):
        check_recovered(same, expected, 2, "here")
    same.next_seq = 3
    with pytest.raises(AssertionError, match="past the broker's 2"):
        check_recovered(same, expected, 2, "here")
    same.next_seq = 2
    check_recovered(same, expected, 2, "here")


def test_a_difference_lists_only_the_messages_that_differ():
    one, two, three = (message(n) for n in (1, 2, 3))
    broker = recovered_state(Recovered({b"q": RecoveredQueue(b"q", messages=[one, two])}))
    store = recovered_state(Recovered({b"q": RecoveredQueue(b"q", messages=[one, two, three])}))
    assert difference(broker, store) == (
        "queue b'q':\n  messages only the broker holds: []\n"
        f"  messages only the store holds:  [{message_values(three)}]"
    )


def test_a_snapshot_keeps_a_message_as_it_was():
    live = message(1, headers={"k": "v"})
    op = snapshot_op((REQUEUE, live, 1))
    live.seq, live.retry = 7, 3
    live.headers["k"] = "changed"
    assert op[1] == message(1, headers={"k": "v"}) and op[2] == 1
    assert snapshot_op((BIND, b"q", b"e")) == (BIND, b"q", b"e")


@pytest_twisted.inlineCallbacks
def test_a_recorded_batch_replays_to_the_state_it_was_made_in(tmp_path: Path) -> Any:
    batches: list[Any] = []
    store = RecordingStore(SQLiteStore(tmp_path / "live" / "db"), batches)
    clock = Clock()
    broker = Broker(store, clock)
    store.broker = broker
    broker.load((yield store.open()))
    broker.publish_to_queue(b"q", b"a", b"1")
    clock.advance(0)
    yield broker.durable()
    broker.publish_to_queue(b"q", b"b", b"2")
    broker.purge(b"q")
    clock.advance(0)
    yield broker.durable()
    yield store.close()
    assert [op[0] for op in batches[0].ops] == [DECLARE, ENQUEUE]
    assert [m[0] for m in batches[0].state.queues[b"q"].messages] == [b"a"]
    assert batches[1].state.queues[b"q"].messages == ()
    yield replay(lambda path: SQLiteStore(path / "db"), tmp_path / "replay", batches, [1, 2])


@pytest_twisted.inlineCallbacks
def test_a_batch_the_writer_cut_stands_for_no_state(tmp_path: Path) -> Any:
    batches: list[Any] = []
    store = RecordingStore(SQLiteStore(tmp_path / "live" / "db"), batches)
    clock = Clock()
    broker = Broker(store, clock)
    broker.writer.max_batch = 2
    store.broker = broker
    broker.load((yield store.open()))
    broker.publish_to_queue_run(b"q", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    clock.advance(0)
    yield broker.durable()
    yield store.close()
    assert [len(batch.ops) for batch in batches] == [2, 2]
    assert batches[0].state is None and batches[1].state is not None
    yield replay(lambda path: SQLiteStore(path / "db"), tmp_path / "replay", batches, [1, 2])


class ForgetsBindings(SQLiteStore):
    """A store that drops BIND ops: the machine must notice."""

    def apply(self, ops: list[tuple[Any, ...]]) -> Any:
        return super().apply([op for op in ops if op[0] != BIND])


@pytest_twisted.inlineCallbacks
def test_the_machine_catches_a_store_that_loses_state(tmp_path: Path) -> Any:
    with pytest.raises(AssertionError, match="the store recovered another state"):
        yield verify_store(lambda path: ForgetsBindings(path / "db"), tmp_path, max_examples=2)
