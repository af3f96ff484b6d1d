# -*- test-case-name: tests.unit.test_durability -*-
"""What a store must give back: the broker's durable state as comparable values.

A durable store promises that, once ``Broker.durable()`` fired, a fresh
store opened on the same files recovers exactly the state the broker held
(docs/storage.md, "The invariant").  This module turns both sides into
plain values that compare with ``==``:

- ``broker_state`` reads a live ``Broker``: every queue with its options,
  bindings and messages.  A message in flight counts as ready at the place
  its seq gives it, which is where a store brings it back (deliveries are
  not storage ops);
- ``recovered_state`` reads the ``Recovered`` a store's ``open`` fires with.

Every ``Message`` field is compared (``KEPT_FIELDS``); a field a store may
drop would have to be named in ``UNKEPT_FIELDS`` and in docs/storage.md.

``RecordingStore`` wraps a store and keeps each batch as the broker's writer
hands it over, with the broker's state at that moment, so a test can replay
the first k batches into a new store (a crash between batches) and compare.
The hypothesis state machine that drives a real broker over a real store is
``mqserver.durability_machine``; ``StoreContract`` runs it on every store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from twisted.internet.defer import Deferred, inlineCallbacks
from zope.interface import implementer

from mqserver.interfaces import IMessageStore
from mqserver.model import ENQUEUE, REQUEUE, Message, QueueOptions, Recovered

UNKEPT_FIELDS: tuple[str, ...] = ()
"""``Message`` fields a store need not keep: none (docs/storage.md lists the same)."""

KEPT_FIELDS = tuple(
    name for name in ("id", "queue", "body", "seq", "event", "headers", "created_at",
                      "expires_at", "retry", "source")
    if name not in UNKEPT_FIELDS
)
"""The ``Message`` fields compared, in this order, in a message's normal form."""
_SEQ = KEPT_FIELDS.index("seq")


class QueueState(NamedTuple):
    options: QueueOptions
    bindings: tuple[bytes, ...]
    # each message as the values of KEPT_FIELDS, in seq order
    messages: tuple[tuple[Any, ...], ...]


class State(NamedTuple):
    """The durable state: queues by name, and the records (empty namespaces left out)."""

    queues: dict[bytes, QueueState]
    records: dict[bytes, dict[bytes, bytes]]


def message_values(message: Message) -> tuple[Any, ...]:
    return tuple(getattr(message, name) for name in KEPT_FIELDS)


def _records(records: dict[bytes, dict[bytes, bytes]]) -> dict[bytes, dict[bytes, bytes]]:
    return {namespace: dict(values) for namespace, values in records.items() if values}


def _queue_state(options: QueueOptions, bindings: Iterable[bytes],
                 messages: Iterable[Message]) -> QueueState:
    ordered = sorted(messages, key=lambda message: message.seq)
    return QueueState(options, tuple(sorted(bindings)), tuple(map(message_values, ordered)))


def broker_state(broker: Any) -> State:
    """What a store must recover from everything ``broker`` did so far."""
    queues = {}
    for name, queue in broker.queues.items():
        messages = list(queue.ready)
        for consumer in queue.consumers:
            messages.extend(consumer.unacked.values())
        queues[name] = _queue_state(queue.options, broker.bindings.events_of(name), messages)
    return State(queues, _records(broker.records))


def recovered_state(recovered: Recovered) -> State:
    """What a store recovered, in the form ``broker_state`` gives."""
    queues = {
        name: _queue_state(rq.options, rq.bindings, rq.messages)
        for name, rq in recovered.queues.items()
    }
    return State(queues, _records(recovered.records))


def difference(expected: State, got: State) -> str:
    """The queues and records that differ, one per line: what a failure should show.

    Of a queue's messages only those on one side alone are listed (or the
    two orders, if both hold the same ones): a queue may hold a thousand.
    """
    lines = []
    for name in sorted(set(expected.queues) | set(got.queues)):
        want, have = expected.queues.get(name), got.queues.get(name)
        if want == have:
            continue
        if want is None or have is None:
            lines.append(f"queue {name!r}:\n  broker: {want}\n  store:  {have}")
            continue
        lines.append(f"queue {name!r}:")
        if want[:2] != have[:2]:
            lines.append(f"  broker: {want[:2]}\n  store:  {have[:2]}")
        broker_only, store_only = _only(want.messages, have.messages), \
            _only(have.messages, want.messages)
        if broker_only or store_only:
            lines.append(f"  messages only the broker holds: {broker_only}\n"
                         f"  messages only the store holds:  {store_only}")
        elif want.messages != have.messages:
            lines.append(f"  another order: broker {[m[_SEQ] for m in want.messages]}, "
                         f"store {[m[_SEQ] for m in have.messages]} (seqs)")
    if expected.records != got.records:
        lines.append(f"records:\n  broker: {expected.records}\n  store:  {got.records}")
    return "\n".join(lines)


def _only(these: tuple[Any, ...], others: tuple[Any, ...]) -> list[Any]:
    rest = list(others)
    only = []
    for item in these:
        if item in rest:
            rest.remove(item)
        else:
            only.append(item)
    return only


def check_recovered(recovered: Recovered, expected: State, broker_next_seq: int,
                    when: str) -> None:
    """Raise ``AssertionError`` unless ``recovered`` is exactly ``expected``.

    ``next_seq`` must be past every recovered seq (a restarted broker never
    reuses one) and not past the broker's own (the store saw no seq it did
    not hand out).
    """
    got = recovered_state(recovered)
    if got != expected:
        raise AssertionError(f"{when}: the store recovered another state\n"
                             + difference(expected, got))
    check_expiries(recovered, when)
    seqs = [message[_SEQ]
            for queue in got.queues.values() for message in queue.messages]
    if seqs and recovered.next_seq <= max(seqs):
        raise AssertionError(f"{when}: next_seq {recovered.next_seq} <= seq {max(seqs)}")
    if recovered.next_seq > broker_next_seq:
        raise AssertionError(f"{when}: next_seq {recovered.next_seq} is past the broker's "
                             f"{broker_next_seq}")


def check_expiries(recovered: Recovered, when: str) -> None:
    """Raise ``AssertionError`` unless each recovered chunk tells its first expiry:
    the TTL sweep looks at nothing else (``PackedReady.take_expired``), and a
    chunk a store decodes later tells none, so one with a TTL must not be one."""
    for name, rq in recovered.queues.items():
        for chunk in getattr(rq.messages, "chunks", ()):
            first = min((m.expires_at for m in chunk.unpack() if m.expires_at is not None),
                        default=math.inf)
            if chunk.first_expiry != first:
                raise AssertionError(f"{when}: a chunk of queue {name!r} says its first "
                                     f"message expires at {chunk.first_expiry}, not {first}")


def snapshot_op(op: tuple[Any, ...]) -> tuple[Any, ...]:
    """An op as it is now: ENQUEUE and REQUEUE carry a live ``Message`` the broker
    keeps changing, so it is copied (headers too)."""
    if op[0] in (ENQUEUE, REQUEUE):
        message = op[1]
        values = list(message.as_tuple())
        if message.headers is not None:
            values[5] = dict(message.headers)
        return (op[0], Message(*values), *op[2:])
    return op


class Batch(NamedTuple):
    ops: list[tuple[Any, ...]]
    # the broker's state and next seq when the writer handed the batch over;
    # None when the writer cut its ops (``max_batch``): the state then is
    # that of ops still waiting, not of this batch
    state: State | None
    next_seq: int


@implementer(IMessageStore)
class RecordingStore:
    """A store that passes everything to ``inner`` and keeps each batch with the
    broker's state at the moment it was handed over (``batches``).

    Set ``broker`` once the broker exists.  The writer hands over every op
    added so far (unless it cut them at ``max_batch``), so the state then is
    exactly what batches 1..k stand for.
    """

    def __init__(self, inner: IMessageStore, batches: list[Batch]) -> None:
        self.inner = inner
        self.durable = inner.durable
        self.batches = batches
        self.broker: Any = None

    def open(self) -> Deferred[Recovered]:
        return self.inner.open()

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        broker = self.broker
        whole = not broker.writer.ops  # what it did not hand over waits there
        self.batches.append(Batch([snapshot_op(op) for op in ops],
                                  broker_state(broker) if whole else None, broker._seq))
        return self.inner.apply(ops)

    def close(self) -> Deferred[None]:
        return self.inner.close()


@inlineCallbacks
def replay(make_store: Callable[[Path], IMessageStore], path: Path, batches: list[Batch],
           points: Iterable[int]) -> Any:
    """A crash after batch k, for each k of ``points``: the first k batches go into a
    new store at ``path``, which is reopened and must recover the state batch k was
    made in (points after a batch the writer cut are skipped: nothing stands for
    their state).  The store is reopened at each point and written on from there."""
    store = make_store(path)
    yield store.open()
    done = 0
    for point in sorted(k for k in set(points) if batches[k - 1].state is not None):
        for batch in batches[done:point]:
            yield store.apply(batch.ops)
        done = point
        yield store.close()
        store = make_store(path)
        recovered = yield store.open()
        batch = batches[point - 1]
        assert batch.state is not None
        check_recovered(recovered, batch.state, batch.next_seq,
                        f"after a crash following batch {point} of {len(batches)}")
    yield store.close()
