"""Public test helpers: the storage contract suite and fakes.

A third-party backend proves itself by subclassing ``StoreContract`` in its
own tests (pytest with pytest-twisted) and implementing ``make_store``::

    class TestMyStore(StoreContract):
        def make_store(self, path):
            return MyStore(path)

``reopen`` defaults to closing the store and making a new one on the same
path, which is what a restart does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, succeed
from zope.interface import implementer
from zope.interface.verify import verifyObject

from mqserver.interfaces import IDeliverySink, IMessageStore
from mqserver.model import (
    BIND,
    DECLARE,
    DELETE,
    DELETE_QUEUE,
    ENQUEUE,
    PUT,
    REMOVE,
    REQUEUE,
    UNBIND,
    Message,
    QueueOptions,
    Recovered,
)
from mqserver.storage.memory import MemoryStore


@implementer(IDeliverySink)
class RecordingSink:
    """An ``IDeliverySink`` that remembers what the broker handed it.

    ``settled_on_send``: what ``deliver`` answers, as a protocol whose
    deliveries need no ack (eMQP's untracked requests) does.
    """

    def __init__(self, settled_on_send: bool = False) -> None:
        self.delivered: list[tuple[Any, Message]] = []
        # (id, retry) as they were at delivery: the broker reuses Message objects
        self.seen: list[tuple[bytes, int]] = []
        self.updates: list[Any] = []
        self.settled_on_send = settled_on_send

    def deliver(self, consumer: Any, message: Message) -> bool:
        self.delivered.append((consumer, message))
        self.seen.append((message.id, message.retry))
        return self.settled_on_send

    def queue_changed(self, consumer: Any) -> None:
        self.updates.append(consumer)

    def bodies(self) -> list[bytes]:
        return [message.body for _, message in self.delivered]


class DurableMemoryStore(MemoryStore):
    """A ``MemoryStore`` that says it is durable and keeps every op it is given,
    in order (``ops``): what a test of the broker's op stream needs."""

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, ...]] = []

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        self.ops.extend(ops)
        return succeed(None)


def message(seq: int, queue: bytes = b"q", body: bytes | None = None, **kw: Any) -> Message:
    """A message as the broker would hand it to a store."""
    return Message(
        kw.pop("id", b"m%d" % seq), queue, body if body is not None else b"body %d" % seq,
        seq, created_at=kw.pop("created_at", 1000.0 + seq), **kw,
    )


class StoreContract:
    """What every ``IMessageStore`` must do.

    Subclasses define ``make_store(self, path: Path) -> IMessageStore``: a new,
    unopened store keeping its data at ``path``.
    """

    make_store: Any

    @pytest_twisted.inlineCallbacks
    def reopen(self, store: IMessageStore, path: Path) -> Any:
        yield store.close()
        return self.make_store(path)

    @pytest.fixture(autouse=True)
    def _store_path(self, tmp_path: Path) -> None:
        self.path = tmp_path / "store"

    @pytest_twisted.inlineCallbacks
    def roundtrip(self, *batches: list[tuple[Any, ...]]) -> Any:
        """Open a fresh store, apply the batches, restart it, return what it recovers."""
        store = self.make_store(self.path)
        yield store.open()
        for ops in batches:
            yield store.apply(ops)
        store = yield self.reopen(store, self.path)
        recovered = yield store.open()
        yield store.close()
        return recovered

    def test_provides_interface(self) -> None:
        store = self.make_store(self.path)
        assert verifyObject(IMessageStore, store)
        assert isinstance(store.durable, bool)

    @pytest_twisted.inlineCallbacks
    def test_empty(self) -> Any:
        store = self.make_store(self.path)
        recovered = yield store.open()
        yield store.close()
        assert isinstance(recovered, Recovered)
        assert recovered.queues == {}
        assert recovered.next_seq >= 1

    @pytest_twisted.inlineCallbacks
    def test_messages_survive_in_order_with_every_field(self) -> Any:
        full = message(
            3, body=bytes(range(256)), id=b"\xff\x00id", event=b"user.created",
            # a lone surrogate: JSON lets an HTTP client send one ("\ud800")
            headers={"k": "v", "ü": "ß", "odd": "\ud800x"}, expires_at=5000.5, retry=2,
            source="mqks",
        )
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1)), (ENQUEUE, message(2))],
            [(ENQUEUE, full)],
        )
        got = recovered.queues[b"q"].messages
        assert got == [message(1), message(2), full]
        assert recovered.next_seq > 3

    @pytest_twisted.inlineCallbacks
    def test_remove(self) -> Any:
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions())]
            + [(ENQUEUE, message(n)) for n in range(1, 6)],
            [(REMOVE, b"q", 2), (REMOVE, b"q", 4), (REMOVE, b"q", 99)],
        )
        assert [m.seq for m in recovered.queues[b"q"].messages] == [1, 3, 5]

    @pytest_twisted.inlineCallbacks
    def test_requeue_moves_and_counts(self) -> Any:
        moved = message(10, id=b"m1", body=b"body 1", created_at=1001.0, retry=1, expires_at=9.0)
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions())] + [(ENQUEUE, message(n)) for n in (1, 2, 3)],
            [(REQUEUE, moved, 1)],
        )
        got = recovered.queues[b"q"].messages
        assert [(m.id, m.seq, m.retry) for m in got] == [
            (b"m2", 2, 0), (b"m3", 3, 0), (b"m1", 10, 1),
        ]
        assert got[-1].expires_at == 9.0
        assert recovered.next_seq > 10

    @pytest_twisted.inlineCallbacks
    def test_requeue_in_place_keeps_order(self) -> Any:
        again = message(1, retry=1)
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1)), (ENQUEUE, message(2))],
            [(REQUEUE, again, 1)],
        )
        assert [(m.seq, m.retry) for m in recovered.queues[b"q"].messages] == [(1, 1), (2, 0)]

    @pytest_twisted.inlineCallbacks
    def test_options_and_bindings(self) -> Any:
        options = QueueOptions(
            delete_when_unused=5.0, dead_letter=b"dlq", max_length=10, default_ttl=60.0,
            overflow="reject-publish",
        )
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions()), (BIND, b"q", b"e1"), (BIND, b"q", b"a.*.c")],
            [(DECLARE, b"q", options), (BIND, b"q", b"e2"), (UNBIND, b"q", b"e1")],
        )
        queue = recovered.queues[b"q"]
        assert queue.options == options
        assert queue.bindings == {b"a.*.c", b"e2"}
        assert queue.messages == []

    @pytest_twisted.inlineCallbacks
    def test_delete_queue_drops_everything(self) -> Any:
        recovered = yield self.roundtrip(
            [
                (DECLARE, b"q", QueueOptions()), (BIND, b"q", b"e"), (ENQUEUE, message(1)),
                (DECLARE, b"other", QueueOptions()), (ENQUEUE, message(2, queue=b"other")),
            ],
            [(DELETE_QUEUE, b"q")],
        )
        assert set(recovered.queues) == {b"other"}
        assert [m.seq for m in recovered.queues[b"other"].messages] == [2]

    @pytest_twisted.inlineCallbacks
    def test_batch_applies_in_order(self) -> Any:
        recovered = yield self.roundtrip(
            [
                (DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1)), (REMOVE, b"q", 1),
                (DELETE_QUEUE, b"q"), (DECLARE, b"q", QueueOptions()), (ENQUEUE, message(2)),
            ]
        )
        assert [m.seq for m in recovered.queues[b"q"].messages] == [2]

    @pytest_twisted.inlineCallbacks
    def test_many_messages_and_large_bodies(self) -> Any:
        big = message(5000, body=b"x" * (1024 * 1024))
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions())] + [(ENQUEUE, message(n)) for n in range(1, 2001)],
            [(ENQUEUE, big)],
        )
        got = recovered.queues[b"q"].messages
        assert [m.seq for m in got] == [*range(1, 2001), 5000]
        assert got[-1].body == big.body

    @pytest_twisted.inlineCallbacks
    def test_records_put_replace_delete(self) -> Any:
        recovered = yield self.roundtrip(
            [(PUT, b"schedules", b"a", b"\x00one"), (PUT, b"schedules", b"b", b"two"),
             (PUT, b"other", b"k", b"v")],
            [(PUT, b"schedules", b"a", b"ONE"), (DELETE, b"schedules", b"b"),
             (DELETE, b"other", b"k"), (DELETE, b"none", b"x")],
        )
        assert recovered.records == {b"schedules": {b"a": b"ONE"}}

    @pytest_twisted.inlineCallbacks
    def test_next_seq_survives_a_drain(self) -> Any:
        recovered = yield self.roundtrip(
            [(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(7))], [(REMOVE, b"q", 7)]
        )
        assert recovered.queues[b"q"].messages == []
        assert recovered.next_seq >= 8

    @pytest_twisted.inlineCallbacks
    def test_reopen_twice_and_keep_writing(self) -> Any:
        store = self.make_store(self.path)
        yield store.open()
        yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])
        store = yield self.reopen(store, self.path)
        yield store.open()
        yield store.apply([(ENQUEUE, message(2)), (REMOVE, b"q", 1)])
        store = yield self.reopen(store, self.path)
        recovered = yield store.open()
        yield store.close()
        assert [m.seq for m in recovered.queues[b"q"].messages] == [2]

    @pytest_twisted.inlineCallbacks
    def test_broker_state_survives_restart(self) -> Any:
        """The whole chain: broker ops -> writer -> store -> recovery -> broker.

        Messages in flight at the "crash" come back ready, without a retry
        bump: the broker sends no op for a delivery, so nothing can be lost
        by crashing between delivery and ack.
        """
        from twisted.internet.task import Clock

        from mqserver.broker.core import Broker

        store = self.make_store(self.path)
        if not store.durable:
            pytest.skip("a store that is not durable is sent no ops")
        clock = Clock()
        broker = Broker(store, clock)
        broker.load((yield store.open()))
        broker.reconfigure(
            b"q", replace=[b"ev", b"a.*"],
            options=QueueOptions(dead_letter=b"dlq", default_ttl=3600.0, max_length=100),
        )
        for n in range(10):
            broker.publish_event(b"ev", b"m%d" % n, b"body %d" % n, headers={"n": str(n)})
        broker.put_record(b"schedules", b"s1", b"every minute")
        connection = broker.connection_opened("test", "peer", RecordingSink())
        consumer = broker.consume(connection, b"c", b"q", window=4)
        clock.advance(0)
        assert broker.ack(consumer, b"m0") and broker.reject(consumer, b"m1")
        clock.advance(0)
        done = broker.durable()
        clock.advance(0)
        yield done
        store = yield self.reopen(store, self.path)
        again = Broker(store, Clock())
        recovered = yield store.open()
        again.load(recovered)
        yield store.close()
        queue = again.queues[b"q"]
        assert [(m.id, m.retry) for m in queue.ready] == [
            *((b"m%d" % n, 0) for n in range(2, 10)), (b"m1", 1),
        ]
        assert all(m.expires_at == m.created_at + 3600.0 for m in queue.ready)
        assert queue.ready[0].headers == {"n": "2"} and queue.ready[0].event == b"ev"
        assert queue.options == QueueOptions(dead_letter=b"dlq", default_ttl=3600.0, max_length=100)
        assert again.bindings.events_of(b"q") == {b"ev", b"a.*"}
        assert again.records == {b"schedules": {b"s1": b"every minute"}}
        assert recovered.next_seq > max(m.seq for m in queue.ready)

    @pytest_twisted.inlineCallbacks
    def test_random_batches_match_the_memory_reference(self) -> Any:
        """Seeded random op sequences (every kind) against ``MemoryStore``, across restarts."""
        import random

        from mqserver.storage.memory import MemoryStore

        rng = random.Random(4)
        reference = MemoryStore()
        yield reference.open()
        store = self.make_store(self.path)
        yield store.open()
        model = _OpModel(rng)
        for round_ in range(4):
            for _ in range(40):
                ops = model.batch()
                yield reference.apply(ops)
                yield store.apply(ops)
            store = yield self.reopen(store, self.path)
            got = yield store.open()
            expected = yield reference.open()
            assert _state(got) == _state(expected), f"round {round_}"
        yield store.close()

    # passing takes seconds; a failure is shrunk for up to five minutes (pytest-timeout)
    @pytest.mark.timeout(900)
    @pytest_twisted.inlineCallbacks
    def test_recovers_exactly_what_the_broker_held(self, tmp_path: Path) -> Any:
        """The durability invariant under arbitrary broker work (docs/storage.md).

        ``mqserver.durability_machine`` drives a real broker over stores made
        by ``make_store``: at each restart and at the end a fresh store on the
        same files must recover exactly the broker's state, and the first k
        batches alone the state batch k was made in.  Examples per store:
        ``MQSERVER_DURABILITY_EXAMPLES``.
        """
        from mqserver.durability_machine import verify_store

        if not self.make_store(self.path).durable:
            pytest.skip("a store that is not durable is sent no ops")
        yield verify_store(self.make_store, tmp_path / "durability")

    @pytest_twisted.inlineCallbacks
    def test_apply_after_close_fails(self) -> Any:
        store = self.make_store(self.path)
        yield store.open()
        yield store.close()
        with pytest.raises(Exception):  # noqa: B017 - any failure will do
            yield store.apply([(DECLARE, b"q", QueueOptions())])


def _state(recovered: Recovered) -> Any:
    queues = {
        name: (q.options, sorted(q.bindings), [m.as_tuple() for m in q.messages])
        for name, q in recovered.queues.items()
    }
    return queues, {ns: kv for ns, kv in recovered.records.items() if kv}


class _OpModel:
    """Makes plausible random batches: every op kind, against queues that exist."""

    def __init__(self, rng: Any) -> None:
        self.rng = rng
        self.seq = 1
        self.queues: dict[bytes, dict[int, Message]] = {}
        self.bound: dict[bytes, set[bytes]] = {}

    def batch(self) -> list[tuple[Any, ...]]:
        rng, ops = self.rng, []
        for _ in range(rng.randint(1, 12)):
            roll = rng.random()
            names = sorted(self.queues)
            if not names or roll < 0.06:
                name = b"q%d" % rng.randint(0, 5)
                options = QueueOptions(
                    dead_letter=rng.choice([None, b"dlq"]),
                    default_ttl=rng.choice([None, 30.0]),
                    delete_when_unused=rng.choice([None, 0.0, 2.5]),
                    overflow=rng.choice([None, "drop-head", "reject-publish"]),
                )
                self.queues.setdefault(name, {})
                self.bound.setdefault(name, set())
                ops.append((DECLARE, name, options))
                continue
            name = rng.choice(names)
            messages = self.queues[name]
            if roll < 0.45:
                body = rng.randbytes(rng.choice([0, 5, 60, 700]))
                msg = message(self.seq, queue=name, body=body, id=b"id%d" % rng.randint(0, 50),
                              headers=rng.choice([None, {"k": f"v{self.seq}"}]),
                              expires_at=rng.choice([None, 5000.0 + self.seq]),
                              event=rng.choice([None, b"ev.a"]), source=rng.choice([None, "x"]))
                self.seq += 1
                messages[msg.seq] = msg
                ops.append((ENQUEUE, msg))
            elif roll < 0.7 and messages:
                seq = rng.choice(sorted(messages))
                del messages[seq]
                ops.append((REMOVE, name, seq))
            elif roll < 0.8 and messages:
                old = rng.choice(sorted(messages))
                msg = messages.pop(old)
                moved = message(old if rng.random() < 0.5 else self.seq, queue=name,
                                body=msg.body, id=msg.id, retry=msg.retry + 1)
                self.seq = max(self.seq, moved.seq + 1)
                messages[moved.seq] = moved
                ops.append((REQUEUE, moved, old))
            elif roll < 0.86:
                event = b"e%d" % rng.randint(0, 4)
                bound = self.bound[name]
                if event in bound and rng.random() < 0.5:
                    bound.discard(event)
                    ops.append((UNBIND, name, event))
                else:
                    bound.add(event)
                    ops.append((BIND, name, event))
            elif roll < 0.95:
                key = b"k%d" % rng.randint(0, 6)
                if rng.random() < 0.7:
                    ops.append((PUT, b"ns%d" % rng.randint(0, 1), key, rng.randbytes(8)))
                else:
                    ops.append((DELETE, b"ns%d" % rng.randint(0, 1), key))
            else:
                del self.queues[name]
                del self.bound[name]
                ops.append((DELETE_QUEUE, name))
        return ops
