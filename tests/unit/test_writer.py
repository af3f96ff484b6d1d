"""Group commit: one apply per reactor turn, the next batch waits for the last."""

from __future__ import annotations

from itertools import pairwise

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


class Flaky:
    """Fails ``apply`` while ``broken`` is set; records every batch it was given."""

    durable = True

    def __init__(self) -> None:
        self.broken = False
        self.batches: list[list] = []
        self.stored: list = []

    def apply(self, ops):
        self.batches.append(list(ops))
        if self.broken:
            return fail(OSError(28, "No space left on device"))
        self.stored.extend(ops)
        return succeed(None)


def test_failed_batch_fails_its_waiters_and_is_retried_first_after_a_delay():
    clock, store = Clock(), Flaky()
    writer = StoreWriter(store, clock, retry_delay=0.5, max_retry_delay=5.0)
    store.broken = True
    writer.add((1,))
    failed = writer.wait()
    clock.advance(0)
    errors = []
    failed.addErrback(errors.append)
    assert errors and "No space left" in errors[0].getErrorMessage()
    assert writer.failing and writer.failures == 1 and "No space left" in writer.last_error
    # while failing, new ops wait for the retry instead of hammering the disk
    writer.add((2,))
    later = writer.wait()
    clock.advance(0)
    assert len(store.batches) == 1 and not later.called
    store.broken = False
    clock.advance(0.5)
    assert store.batches[-1] == [(1,), (2,)]
    assert store.stored == [(1,), (2,)]
    assert later.called and later.result is None
    assert not writer.failing and writer.last_error is None


def test_retries_back_off_to_the_cap_and_every_waiter_in_between_fails():
    clock, store = Clock(), Flaky()
    writer = StoreWriter(store, clock, retry_delay=0.5, max_retry_delay=2.0)
    store.broken = True
    writer.add((1,))
    clock.advance(0)
    times = []
    for _ in range(4):
        waiter = writer.wait()
        errors = []
        waiter.addErrback(errors.append)
        before = len(store.batches)
        while len(store.batches) == before:
            clock.advance(0.25)
        times.append(clock.seconds())
        assert errors, "a waiter of a failed retry gets the failure"
    assert [b - a for a, b in pairwise(times)] == [1.0, 2.0, 2.0]
    assert store.stored == [] and writer.ops == [(1,)]


def test_stop_cancels_the_retry():
    clock, store = Clock(), Flaky()
    writer = StoreWriter(store, clock)
    store.broken = True
    writer.add((1,))
    clock.advance(0)
    writer.stop()
    clock.advance(60)
    assert len(store.batches) == 1 and not clock.getDelayedCalls()


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


def test_the_batch_cap_never_separates_an_op_from_the_one_it_is_glued_to():
    clock, store = Clock(), SlowStore()
    writer = StoreWriter(store, clock, max_batch=3)
    writer.add((0,))
    for n in (1, 3, 5):
        writer.add((n,))
        writer.add_with_previous((n + 1,))
    done = writer.wait()
    clock.advance(0)
    store.pending[0].callback(None)
    store.pending[1].callback(None)
    assert store.batches == [[(0,), (1,), (2,)], [(3,), (4,), (5,), (6,)]]
    assert done.called and not writer._glued


def test_glued_ops_stay_glued_when_their_batch_fails_and_is_sent_again():
    clock, store = Clock(), SlowStore()
    writer = StoreWriter(store, clock, max_batch=1)
    writer.add(("a",))
    writer.add_with_previous(("b",))
    writer.add(("c",))
    clock.advance(0)
    store.pending[0].errback(OSError("disk full"))
    clock.advance(writer.retry_delay)
    assert store.batches == [[("a",), ("b",)], [("a",), ("b",)]]
    store.pending[1].callback(None)
    store.pending[2].callback(None)
    assert store.batches[2] == [("c",)] and not writer._glued


def test_a_stopped_writer_sends_no_batch_and_schedules_no_retry():
    clock, store = Clock(), Flaky()
    writer = StoreWriter(store, clock)
    store.broken = True
    writer.add((1,))
    clock.advance(0)
    writer.add((2,))
    writer.stop()  # also while a flush is scheduled
    clock.advance(60)
    writer.add((3,))
    clock.advance(60)
    assert len(store.batches) == 1 and not clock.getDelayedCalls()
