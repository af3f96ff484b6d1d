"""Moving ready messages between queues: what moves, what it keeps, and crashes mid-move."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mqserver.broker.core import Broker
from mqserver.broker.moving import CHUNK, QUEUE_DELETED, TARGET_FULL, MoveError, MoveResult
from mqserver.journal.schema import TERMINAL_EVENTS
from mqserver.journal.writer import Journal
from mqserver.model import ENQUEUE, REMOVE, QueueOptions
from mqserver.storage.log import LogStore
from mqserver.storage.memory import MemoryStore
from mqserver.storage.sqlite import SQLiteStore
from mqserver.testing import DurableMemoryStore, RecordingSink


def dead_letters(broker: Broker, count: int, source: bytes = b"orders",
                 target: bytes = b"orders.dead") -> None:
    """``count`` messages in ``target``, each dead-lettered from ``source`` after a reject."""
    broker.declare_queue(source, QueueOptions(dead_letter=target))
    broker.declare_queue(target)
    conn = broker.connection_opened("mqks", "127.0.0.1:1", RecordingSink())
    consumer = broker.consume(conn, b"worker", source)
    for i in range(count):
        broker.publish_to_queue(source, b"m%d" % i, b"body %d" % i, headers={"kind": "k"})
    broker.clock.advance(0)
    for i in range(count):
        assert broker.dead_letter(consumer, b"m%d" % i, b"bad")
    broker.cancel(consumer)


def move(broker: Broker, *args: Any, **kwargs: Any) -> MoveResult:
    """``broker.move`` run to its end: the reactor turns it takes, then its result."""
    moving = broker.move(*args, **kwargs)
    while not moving.called:
        broker.clock.advance(0)
    out: list[Any] = []
    moving.addBoth(out.append)
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


def ids(queue: Any) -> list[bytes]:
    return [m.id for m in queue.ready]


def test_a_dead_letter_queue_replays_into_its_source_keeping_ids_bodies_and_headers():
    broker = Broker(MemoryStore(), Clock())
    dead_letters(broker, 5)
    dead = broker.queues[b"orders.dead"]
    before = list(dead.ready)
    assert all(m.headers["x-dead-letter-reason"] == "bad" for m in before)
    result = move(broker, b"orders.dead", b"orders")
    assert (result.moved, result.left, result.stopped) == (5, 0, None)
    moved = list(broker.queues[b"orders"].ready)
    assert [m.id for m in moved] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [m.body for m in moved] == [m.body for m in before]
    assert all(m.headers == {"kind": "k"} for m in moved)
    assert all(m.retry == 0 and m.queue == b"orders" for m in moved)
    assert [m.created_at for m in moved] == [m.created_at for m in before]
    seqs = [m.seq for m in moved]
    assert seqs == sorted(seqs) and seqs[0] > max(m.seq for m in before)
    assert (dead.moved, broker.queues[b"orders"].enqueued) == (5, 10)


def test_the_first_n_move_and_the_rest_stay_in_order():
    broker = Broker(MemoryStore(), Clock())
    dead_letters(broker, 5)
    result = move(broker, b"orders.dead", b"orders", limit=2)
    assert (result.moved, result.left) == (2, 3)
    assert ids(broker.queues[b"orders"]) == [b"m0", b"m1"]
    assert ids(broker.queues[b"orders.dead"]) == [b"m2", b"m3", b"m4"]
    assert move(broker, b"orders.dead", b"orders", limit=10).moved == 3


def test_dead_letter_headers_can_be_kept():
    broker = Broker(MemoryStore(), Clock())
    dead_letters(broker, 1)
    move(broker, b"orders.dead", b"orders", keep_dead_letter_headers=True)
    assert broker.queues[b"orders"].ready[0].headers == {
        "kind": "k", "x-dead-letter-reason": "bad", "x-dead-letter-queue": "orders"}


@pytest.mark.parametrize(("source", "target", "error"), [
    (b"nope", b"b", "no queue 'nope'"),
    (b"a", b"nope", "no queue 'nope'"),
    (b"a", b"a", "onto itself"),
])
def test_a_move_needs_two_distinct_existing_queues(source, target, error):
    broker = Broker(MemoryStore(), Clock())
    broker.declare_queue(b"a")
    broker.declare_queue(b"b")
    with pytest.raises(MoveError, match=error):
        move(broker, source, target)
    assert b"nope" not in broker.queues


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_a_move_stops_at_the_targets_max_length_and_drops_nothing(overflow):
    broker = Broker(MemoryStore(), Clock())
    broker.declare_queue(b"small", QueueOptions(max_length=3, overflow=overflow))
    broker.publish_to_queue(b"small", b"old", b"x")
    for i in range(4):
        broker.publish_to_queue(b"src", b"m%d" % i, b"x")
    result = move(broker, b"src", b"small")
    assert (result.moved, result.left, result.stopped) == (2, 2, TARGET_FULL)
    assert ids(broker.queues[b"small"]) == [b"old", b"m0", b"m1"]
    assert broker.queues[b"small"].dead_lettered == 0
    assert move(broker, b"src", b"small").moved == 0


def test_moved_messages_reach_the_targets_consumer_and_keep_their_expiry():
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    broker.declare_queue(b"to")
    broker.publish_to_queue(b"from", b"t", b"x", ttl=5.0)
    broker.publish_to_queue(b"from", b"p", b"y")
    sink = RecordingSink()
    broker.consume(broker.connection_opened("mqks", "p", sink), b"c", b"to", window=1)
    move(broker, b"from", b"to")
    assert broker.queues[b"from"].ttl_ready == 0
    clock.advance(0)
    assert sink.bodies() == [b"x"]  # window 1: "p" waits
    assert broker.queues[b"to"].ready[0].id == b"p"
    broker.publish_to_queue(b"from", b"e", b"z", ttl=1.0)
    move(broker, b"from", b"to")
    clock.advance(2)
    assert broker.expire_due() == 1
    assert ids(broker.queues[b"to"]) == [b"p"]


def test_a_packed_backlog_moves_whole_and_in_order():
    broker = Broker(MemoryStore(), Clock())
    broker.pack_ready_after = 10
    broker.declare_queue(b"to")
    for i in range(3000):
        broker.publish_to_queue(b"from", b"%d" % i, b"b%d" % i)
    assert type(broker.queues[b"from"].ready).__name__ == "PackedReady"
    assert move(broker, b"from", b"to").moved == 3000
    to = broker.queues[b"to"]
    assert type(to.ready).__name__ == "PackedReady"
    assert ids(to) == [b"%d" % i for i in range(3000)]
    assert [m.body for m in to.ready][-1] == b"b2999"


def test_the_journal_says_each_copy_left_the_source_and_arrived_in_the_target(tmp_path):
    clock = Clock()
    clock.advance(1_795_000_000)
    broker = Broker(MemoryStore(), clock)
    journal = Journal(str(tmp_path / "j"), clock, node="n1")
    broker.journal = journal
    journal.startService()
    dead_letters(broker, 2)
    move(broker, b"orders.dead", b"orders", limit=1)
    journal.stopService()
    lines = [json.loads(line) for path in sorted((tmp_path / "j").glob("date=*/*.jsonl"))
             for line in path.read_text().splitlines()]
    tail = [(r["event"], r["queue"], r["message_id"], r["delivery_count"], r.get("reason"),
             r.get("headers")) for r in lines[-2:]]
    assert tail == [
        ("moved", "orders.dead", "m0", 0, "moved", None),
        ("published", "orders", "m0", 0, "moved", {"kind": "k"}),
    ]
    balance: dict[str, int] = {}
    for r in lines:
        if r["event"] == "published":
            balance[r["queue"]] = balance.get(r["queue"], 0) + 1
        elif r["event"] in TERMINAL_EVENTS:
            balance[r["queue"]] = balance.get(r["queue"], 0) - 1
    assert balance == {"orders": 1, "orders.dead": 1}
    assert balance == {name.decode(): len(q.ready) for name, q in broker.queues.items()}


def test_a_large_move_goes_a_chunk_per_turn_and_leaves_later_arrivals_in_the_source():
    broker = Broker(MemoryStore(), Clock())
    broker.declare_queue(b"to")
    for i in range(2 * CHUNK + 5):
        broker.publish_to_queue(b"from", b"%d" % i, b"x")
    moving = broker.move(b"from", b"to")
    # the first chunk at once, the next one at the next reactor turn
    assert len(broker.queues[b"to"].ready) == CHUNK and not moving.called
    [step] = broker.clock.getDelayedCalls()
    assert step.getTime() == broker.clock.seconds()
    broker.publish_to_queue(b"from", b"late", b"x")  # after the move started: stays
    broker.clock.advance(0)
    result = moving.result
    assert (result.moved, result.left, result.stopped) == (2 * CHUNK + 5, 1, None)
    assert ids(broker.queues[b"from"]) == [b"late"]
    assert ids(broker.queues[b"to"])[-1] == b"%d" % (2 * CHUNK + 4)


def test_what_consumers_take_during_a_move_is_not_replaced_by_later_messages():
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    broker.declare_queue(b"to")
    for i in range(CHUNK + 10):
        broker.publish_to_queue(b"from", b"%d" % i, b"x")
    moving = broker.move(b"from", b"to")
    consumer = broker.consume(broker.connection_opened("mqks", "p", RecordingSink()), b"c",
                              b"from", window=4)
    broker.pump_now()  # takes four of the ten the first chunk left
    broker.publish_to_queue(b"from", b"late", b"x")
    clock.advance(0)
    assert (moving.result.moved, moving.result.left) == (CHUNK + 6, 1)
    assert ids(broker.queues[b"from"]) == [b"late"] and len(consumer.unacked) == 4


@pytest.mark.parametrize("which", [b"from", b"to"])
def test_a_queue_deleted_during_a_move_stops_it(which):
    broker = Broker(MemoryStore(), Clock())
    broker.declare_queue(b"to")
    for i in range(CHUNK + 10):
        broker.publish_to_queue(b"from", b"%d" % i, b"x")
    moving = broker.move(b"from", b"to")
    broker.delete_queue(which)
    broker.clock.advance(0)
    assert (moving.result.moved, moving.result.stopped) == (CHUNK, QUEUE_DELETED)


def test_a_target_that_fills_during_a_move_stops_it():
    broker = Broker(MemoryStore(), Clock())
    broker.declare_queue(b"to", QueueOptions(max_length=CHUNK + 3))
    for i in range(2 * CHUNK):
        broker.publish_to_queue(b"from", b"%d" % i, b"x")
    result = move(broker, b"from", b"to")
    assert (result.moved, result.left, result.stopped) == (CHUNK + 3, CHUNK - 3, TARGET_FULL)


def test_a_caller_that_goes_away_leaves_the_move_to_finish():
    broker = Broker(MemoryStore(), Clock())
    broker.declare_queue(b"to")
    for i in range(CHUNK + 1):
        broker.publish_to_queue(b"from", b"%d" % i, b"x")
    moving = broker.move(b"from", b"to")
    moving.addErrback(lambda failure: None)
    moving.cancel()
    broker.clock.advance(0)
    assert len(broker.queues[b"to"].ready) == CHUNK + 1


class RecordingStore(DurableMemoryStore):
    """Keeps every batch the broker's writer applied."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[Any, ...]]] = []

    def apply(self, ops: list[tuple[Any, ...]]) -> Any:
        self.batches.append(list(ops))
        return super().apply(ops)


def test_the_ops_of_each_moved_message_share_a_batch_whatever_the_batch_cap():
    clock = Clock()
    store = RecordingStore()
    broker = Broker(store, clock)
    broker.writer.max_batch = 3
    for i in range(7):
        broker.publish_to_queue(b"from", b"%d" % i, b"x")
    broker.declare_queue(b"to")
    clock.advance(0)
    store.batches.clear()
    broker.publish_to_queue(b"other", b"o", b"x")  # the move starts mid-batch
    move(broker, b"from", b"to")
    done = broker.durable()
    for _ in range(20):
        clock.advance(0)
    assert done.called
    for batch in store.batches:
        enqueued = {op[1].id for op in batch if op[0] == ENQUEUE and op[1].queue == b"to"}
        removed = {op[2] for op in batch if op[0] == REMOVE}
        assert len(enqueued) == len(removed)
    assert len(store.batches) > 2  # the cap did split the move


def store_maker(kind: str, request: Any) -> Any:
    """``make(path)``: a new store of ``kind`` keeping its data at ``path`` (PostgreSQL:
    a database per path on the module's cluster, skipped without its binaries)."""
    if kind == "sqlite":
        return lambda path: SQLiteStore(path / "mq.sqlite3")
    if kind == "log":
        return LogStore
    from mqserver.storage.postgres import PostgresStore

    cluster = request.getfixturevalue("postgres_cluster")
    databases: dict[Path, str] = {}

    def make(path: Path) -> PostgresStore:
        if path not in databases:
            databases[path] = cluster.create_database(f"move_{len(databases)}")
        return PostgresStore(databases[path])

    return make


@pytest.mark.parametrize("kind", ["sqlite", "log", "postgres"])
@pytest_twisted.inlineCallbacks
def test_a_crash_after_any_batch_of_a_move_leaves_each_message_in_one_queue(kind, tmp_path,
                                                                             request):
    """Every prefix of the move's batches, applied to a real store and recovered.

    A store applies a batch atomically (the contract's business), so a crash
    leaves some prefix of the batches: each must recover every message exactly
    once, in one queue or the other.
    """
    clock = Clock()
    recorder = RecordingStore()
    broker = Broker(recorder, clock)
    broker.writer.max_batch = 4
    for i in range(9):
        broker.publish_to_queue(b"from", b"%d" % i, b"body %d" % i)
    broker.publish_to_queue(b"to", b"first", b"x")
    clock.advance(0)
    setup = [op for batch in recorder.batches for op in batch]
    recorder.batches.clear()
    broker.publish_to_queue(b"other", b"o", b"x")  # the move starts mid-batch
    move(broker, b"from", b"to", limit=7)
    for _ in range(20):
        clock.advance(0)
    batches = recorder.batches
    assert len(batches) >= 4
    make = store_maker(kind, request)
    everything = {b"%d" % i for i in range(9)} | {b"first"}
    for prefix in range(len(batches) + 1):
        path: Path = tmp_path / f"prefix-{prefix}"
        store = make(path)
        yield store.open()
        yield store.apply(setup)
        for batch in batches[:prefix]:
            yield store.apply(batch)
        yield store.close()
        store = make(path)
        recovered = yield store.open()
        yield store.close()
        where = [(m.id, name) for name, rq in recovered.queues.items() for m in rq.messages
                 if name != b"other"]
        found = [message_id for message_id, _ in where]
        assert sorted(found) == sorted(everything), (prefix, where)
        moved = [m.id for m in recovered.queues[b"to"].messages]
        assert moved[1:] == [b"%d" % i for i in range(len(moved) - 1)]  # a prefix, in order
    assert [m.id for m in recovered.queues[b"from"].messages] == [b"7", b"8"]
