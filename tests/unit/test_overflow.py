"""Per-queue max-length with an overflow policy, and the server-wide defaults."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.broker.overflow import DROP_HEAD, REJECT_PUBLISH, QueueFullError, check_policy
from mqserver.model import QueueOptions
from mqserver.storage.memory import MemoryStore


@pytest.fixture
def broker() -> Broker:
    return Broker(MemoryStore(), Clock())


def ids(broker: Broker, name: bytes) -> list[bytes]:
    return [m.id for m in broker.queues[name].ready]


def test_reject_publish_refuses_the_publish_and_keeps_the_queue(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=2, overflow=REJECT_PUBLISH))
    broker.publish_to_queue(b"q", b"m1", b"x")
    broker.publish_to_queue(b"q", b"m2", b"x")
    with pytest.raises(QueueFullError, match="'q' is full"):
        broker.publish_to_queue(b"q", b"m3", b"x")
    assert ids(broker, b"q") == [b"m1", b"m2"]
    assert broker.queues[b"q"].refused == 1
    assert broker.queues[b"q"].dead_lettered == 0


def test_reject_publish_makes_room_again_once_a_message_leaves(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=1, overflow=REJECT_PUBLISH))
    broker.publish_to_queue(b"q", b"m1", b"x")
    with pytest.raises(QueueFullError):
        broker.publish_to_queue(b"q", b"m2", b"x")
    assert broker.purge(b"q") == 1
    broker.publish_to_queue(b"q", b"m3", b"x")
    assert ids(broker, b"q") == [b"m3"]


def test_an_event_goes_to_no_queue_when_one_bound_queue_is_full(broker):
    broker.declare_queue(b"full", QueueOptions(max_length=1, overflow=REJECT_PUBLISH))
    broker.reconfigure(b"full", replace=[b"ev"])
    broker.reconfigure(b"other", replace=[b"ev"])
    assert broker.publish_event(b"ev", b"m1", b"x") == 2
    with pytest.raises(QueueFullError):
        broker.publish_event(b"ev", b"m2", b"x")
    assert ids(broker, b"full") == [b"m1"]
    assert ids(broker, b"other") == [b"m1"]


def test_drop_head_dead_letters_the_oldest(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=2, dead_letter=b"dlq", overflow=DROP_HEAD))
    for n in range(4):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    assert ids(broker, b"q") == [b"m2", b"m3"]
    assert ids(broker, b"dlq") == [b"m0", b"m1"]
    assert broker.queues[b"dlq"].ready[0].headers["x-dead-letter-reason"] == "maxlen"


def test_server_defaults_apply_to_queues_without_their_own(broker):
    broker.declare_queue(b"old")
    broker.set_limits(2, REJECT_PUBLISH)
    broker.declare_queue(b"own", QueueOptions(max_length=3, overflow=DROP_HEAD))
    for n in range(4):
        broker.publish_to_queue(b"own", b"m%d" % n, b"x")
    for n in range(2):
        broker.publish_to_queue(b"old", b"m%d" % n, b"x")
        broker.publish_to_queue(b"new", b"m%d" % n, b"x")
    for name in (b"old", b"new"):
        with pytest.raises(QueueFullError):
            broker.publish_to_queue(name, b"late", b"x")
    assert ids(broker, b"own") == [b"m1", b"m2", b"m3"]
    assert broker.rejecting == 2
    broker.set_limits(None, DROP_HEAD)
    assert broker.rejecting == 0
    broker.publish_to_queue(b"new", b"m9", b"x")
    assert ids(broker, b"new") == [b"m0", b"m1", b"m9"]


def test_reject_count_follows_option_changes_and_deletes(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=1, overflow=REJECT_PUBLISH))
    assert broker.rejecting == 1
    broker.reconfigure(b"q", options=QueueOptions(max_length=1))
    assert broker.rejecting == 0
    broker.reconfigure(b"q", options=QueueOptions(max_length=1, overflow=REJECT_PUBLISH))
    broker.delete_queue(b"q")
    assert broker.rejecting == 0


def test_requeues_and_dead_letter_copies_are_never_refused(broker):
    broker.declare_queue(b"q", QueueOptions(max_length=1, overflow=REJECT_PUBLISH))
    broker.declare_queue(b"dlq", QueueOptions(max_length=1, overflow=REJECT_PUBLISH))
    broker.publish_to_queue(b"dlq", b"d0", b"x")
    connection = broker.connection_opened("test", "127.0.0.1:1", _Sink())
    consumer = broker.consume(connection, b"c", b"q")
    broker.publish_to_queue(b"q", b"m1", b"x")
    broker.clock.advance(0)
    broker.publish_to_queue(b"q", b"m2", b"x")
    broker.cancel(consumer)  # m1 comes back although the queue is at its limit
    assert ids(broker, b"q") == [b"m1", b"m2"]
    consumer = broker.consume(connection, b"c", b"q")
    broker.clock.advance(0)
    broker.queues[b"q"].options = QueueOptions(dead_letter=b"dlq")
    broker.dead_letter(consumer, b"m1", b"rejected")
    assert ids(broker, b"dlq") == [b"d0", b"m1"]


def test_check_policy_names_the_choices():
    assert check_policy("reject-publish") == REJECT_PUBLISH
    with pytest.raises(ValueError, match="drop-head, reject-publish"):
        check_policy("drop-tail")


class _Sink:
    def deliver(self, consumer, message) -> None:
        pass

    def queue_changed(self, consumer) -> None:
        pass
