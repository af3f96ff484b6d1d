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


@implementer(IDeliverySink)
class RecordingSink:
    """An ``IDeliverySink`` that remembers what the broker handed it."""

    def __init__(self) -> None:
        self.delivered: list[tuple[Any, Message]] = []
        # (id, retry) as they were at delivery: the broker reuses Message objects
        self.seen: list[tuple[bytes, int]] = []
        self.updates: list[Any] = []

    def deliver(self, consumer: Any, message: Message) -> None:
        self.delivered.append((consumer, message))
        self.seen.append((message.id, message.retry))

    def queue_changed(self, consumer: Any) -> None:
        self.updates.append(consumer)

    def bodies(self) -> list[bytes]:
        return [message.body for _, message in self.delivered]


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
            headers={"k": "v", "ü": "ß"}, expires_at=5000.5, retry=2, source="mqks",
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
            delete_when_unused=5.0, dead_letter=b"dlq", max_length=10, default_ttl=60.0
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
    def test_apply_after_close_fails(self) -> Any:
        store = self.make_store(self.path)
        yield store.open()
        yield store.close()
        with pytest.raises(Exception):  # noqa: B017 - any failure will do
            yield store.apply([(DECLARE, b"q", QueueOptions())])
