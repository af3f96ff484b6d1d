"""``SliceLoop``: a look per interval, a slice per reactor turn, failures logged and survived."""

from __future__ import annotations

from twisted.internet.task import Clock

from mqserver.atrest import SliceLoop


class Work:
    """Slices to do, as a ``SliceLoop`` owner keeps them; failures on demand."""

    def __init__(self) -> None:
        self.found: list[int] = []
        self.pending = 0
        self.done: list[int] = []
        self.fail_find = self.fail_step = False
        self.abandoned = 0

    def find(self) -> bool:
        if self.fail_find:
            raise RuntimeError("find broke")
        if self.pending:
            self.found.append(self.pending)
        return bool(self.pending)

    def step(self) -> bool:
        if self.fail_step:
            raise RuntimeError("step broke")
        self.pending -= 1
        self.done.append(self.pending)
        return self.pending > 0

    def abandon(self) -> None:
        self.abandoned += 1
        self.pending = 0


def loop_of(work: Work, clock: Clock) -> SliceLoop:
    return SliceLoop(clock, work.find, work.step, work.abandon, "things at rest",
                     "doing a thing at rest")


def one_turn(clock: Clock) -> None:
    """Run only the earliest call that is due now, as one reactor turn would
    (``Clock.advance`` would also run the calls it schedules for now)."""
    call = clock.calls[0]
    assert call.getTime() <= clock.seconds()
    clock.calls.pop(0)
    call.called = 1
    call.func(*call.args, **call.kw)


def test_a_look_that_finds_work_runs_one_slice_per_turn_until_done() -> None:
    clock, work = Clock(), Work()
    loop = loop_of(work, clock)
    loop.start(1.0)
    clock.advance(1.0)
    assert work.found == [] and len(clock.getDelayedCalls()) == 1, "nothing due: no slice"
    work.pending = 3
    loop.look()
    assert work.found == [3] and work.done == [], "the look only schedules the first slice"
    one_turn(clock)
    assert work.done == [2], "one slice per turn"
    one_turn(clock)
    one_turn(clock)
    assert work.done == [2, 1, 0]
    assert len(clock.getDelayedCalls()) == 1, "only the next look is due"


def test_a_second_look_while_slices_are_due_schedules_no_second_chain() -> None:
    clock, work = Clock(), Work()
    loop = loop_of(work, clock)
    work.pending = 5
    loop.look()
    loop.look()
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert work.done == [4, 3, 2, 1, 0]


def test_a_failing_look_is_logged_and_the_next_interval_looks_again(logged: list[str]) -> None:
    clock, work = Clock(), Work()
    loop = loop_of(work, clock)
    loop.start(1.0)
    work.fail_find = True
    clock.advance(1.0)
    assert any("looking for things at rest failed; it looks again next interval" in line
               for line in logged)
    work.fail_find, work.pending = False, 1
    clock.advance(1.0)
    clock.advance(0)
    assert work.done == [0]


def test_a_failing_slice_is_logged_and_abandons_what_was_due(logged: list[str]) -> None:
    clock, work = Clock(), Work()
    loop = loop_of(work, clock)
    loop.start(1.0)
    work.pending, work.fail_step = 4, True
    clock.advance(1.0)
    clock.advance(0)
    assert work.abandoned == 1 and work.pending == 0
    assert any("doing a thing at rest failed; it is tried again next interval" in line
               for line in logged)
    assert len(clock.getDelayedCalls()) == 1, "no further slice, the looks go on"
    work.fail_step, work.pending = False, 1
    clock.advance(1.0)
    clock.advance(0)
    assert work.done == [0]


def test_stop_cancels_the_due_slice_and_the_looks_and_zero_never_starts() -> None:
    clock, work = Clock(), Work()
    loop = loop_of(work, clock)
    loop.start(1.0)
    work.pending = 2
    loop.look()
    assert len(clock.getDelayedCalls()) == 2, "the next look and the first slice"
    loop.stop()
    assert clock.getDelayedCalls() == []
    clock.advance(5.0)
    assert work.done == []
    loop.start(0)
    assert clock.getDelayedCalls() == []
