"""Group commit: one apply per reactor turn, the next batch waits for the last."""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from mqserver.broker.writer import StoreWriter


class SlowStore:
    durable = True

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.pending: list[Deferred] = []

    def apply(self, ops):
        self.batches.append(list(ops))
        d = Deferred()
        self.pending.append(d)
        return d


def test_ops_of_one_turn_form_one_batch_and_waiters_fire_when_durable():
    clock, store = Clock(), SlowStore()
    writer = StoreWriter(store, clock)
    writer.add(("a",))
    writer.add(("b",))
    done = writer.wait()
    assert store.batches == []
    clock.advance(0)
    assert store.batches == [[("a",), ("b",)]]
    assert not done.called
    store.pending[0].callback(None)
    assert done.called


def test_ops_during_a_slow_apply_group_into_the_next_batch():
    clock, store = Clock(), SlowStore()
    writer = StoreWriter(store, clock)
    writer.add((1,))
    clock.advance(0)
    first = writer.wait()
    for n in range(2, 6):
        writer.add((n,))
        clock.advance(0)
    second = writer.wait()
    assert len(store.batches) == 1
    store.pending[0].callback(None)
    assert first.called and not second.called
    assert store.batches[1] == [(2,), (3,), (4,), (5,)]
    store.pending[1].callback(None)
    assert second.called
    assert writer.wait().called


def test_failed_batch_fails_its_waiters_and_later_batches_go_on():
    clock = Clock()

    class Failing:
        durable = True
        calls = 0

        def apply(self, ops):
            self.calls += 1
            return fail(OSError("disk full")) if self.calls == 1 else succeed(None)

    writer = StoreWriter(Failing(), clock)
    writer.add((1,))
    failed = writer.wait()
    clock.advance(0)
    errors = []
    failed.addErrback(errors.append)
    assert errors and writer.failures == 1 and "disk full" in writer.last_error
    writer.add((2,))
    ok = writer.wait()
    clock.advance(0)
    assert ok.called and writer.last_error is None


def test_big_backlogs_go_out_in_capped_batches_and_waiters_wait_for_all():
    clock, store = Clock(), SlowStore()
    writer = StoreWriter(store, clock, max_batch=3)
    for n in range(7):
        writer.add((n,))
    done = writer.wait()
    clock.advance(0)
    assert [len(b) for b in store.batches] == [3]
    store.pending[0].callback(None)
    assert [len(b) for b in store.batches] == [3, 3] and not done.called
    store.pending[1].callback(None)
    assert [len(b) for b in store.batches] == [3, 3, 1] and not done.called
    store.pending[2].callback(None)
    assert done.called
    assert [op for b in store.batches for op in b] == [(n,) for n in range(7)]
