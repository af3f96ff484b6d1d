"""A log index at rest goes to its arrays a slice per reactor turn; a busy one stays a dict."""

from __future__ import annotations

from twisted.internet.task import Clock

from mqserver.storage.log_index import LogIndex, SeqIndex, loc
from mqserver.storage.log_rest import IndexAtRest


def _index(count: int, queue: bytes = b"q") -> LogIndex:
    index = LogIndex()
    for seq in range(1, count + 1):
        index.put_message(queue, seq, loc(1, 16 * seq, 16))
    return index


def _rest(clock: Clock, index: LogIndex, busy: list[bool] | None = None) -> IndexAtRest:
    busy = busy if busy is not None else []
    at_rest = IndexAtRest(clock, lambda: index, lambda: bool(busy))
    at_rest.least, at_rest.quiet, at_rest.slice = 10, 3, 4
    return at_rest


def test_an_index_at_rest_moves_to_the_arrays_a_slice_at_a_time():
    clock = Clock()
    index = _index(30)
    everything = list(index.messages[b"q"].everything())
    live = index.live_total
    at_rest = _rest(clock, index)
    at_rest.look()
    assert not clock.getDelayedCalls(), "the first look only marks it"
    at_rest.look()
    by_seq = index.messages[b"q"]
    assert len(by_seq) == 30, "moved from the next reactor turn, not in the look"
    assert at_rest.move_slice() and len(by_seq) == 26 and [seq for seq, _ in by_seq.archived()] == [1, 2, 3, 4]
    while at_rest.move_slice():
        pass
    assert not by_seq and [seq for seq, _ in by_seq.archived()] == list(range(1, 31))
    assert list(by_seq.everything()) == everything and index.live_total == live
    assert index.remove_message(b"q", 1) and index.message_location(b"q", 2) == loc(1, 32, 16)


def test_it_says_when_every_queue_at_rest_is_moved():
    index, told = _index(30), []
    at_rest = IndexAtRest(Clock(), lambda: index, lambda: False, lambda: told.append(True))
    at_rest.least, at_rest.quiet, at_rest.slice = 10, 3, 4
    at_rest.look()
    at_rest.look()
    while at_rest.move_slice():
        assert not told
    assert told == [True]


def test_the_looping_call_moves_it_and_a_busy_index_stays():
    clock = Clock()
    index = _index(30)
    at_rest = _rest(clock, index)
    at_rest.start(1.0)
    for seq in range(31, 51, 4):  # 4 entries an interval: more than ``quiet``
        for n in range(seq, seq + 4):
            index.put_message(b"q", n, loc(1, 16 * n, 16))
        clock.advance(1.0)
    assert len(index.messages[b"q"]) == 50
    clock.advance(1.0)
    assert not index.messages[b"q"] and index.messages[b"q"].archived_count() == 50
    at_rest.stop()
    assert not clock.getDelayedCalls()


def test_a_compaction_or_a_close_keeps_it_out_of_the_way():
    clock = Clock()
    index = _index(30)
    busy = [True]
    at_rest = _rest(clock, index, busy)
    at_rest.look()
    at_rest.look()
    clock.advance(0)
    assert len(index.messages[b"q"]) == 30
    busy.clear()
    at_rest.look()
    clock.advance(0)
    assert not index.messages[b"q"]


def test_a_queue_deleted_while_moving_is_dropped():
    clock = Clock()
    index = _index(30)
    at_rest = _rest(clock, index)
    at_rest.look()
    at_rest.look()
    index.delete_queue(b"q")
    assert not at_rest.move_slice()
    assert index.live_total == 0


def test_entries_below_the_archived_ones_take_the_merging_archive():
    by_seq = SeqIndex()
    for seq in (10, 11, 12, 13):
        by_seq[seq] = loc(1, seq, 1)
    by_seq.archive_oldest(2)
    assert [seq for seq, _ in by_seq.archived()] == [10, 11] and by_seq.last == 11
    by_seq.put_old(5, loc(2, 5, 1))  # a requeue into an old seq: into the dict
    by_seq[14] = loc(1, 14, 1)
    by_seq.archive_oldest(2)  # 12, 13 first in line, but 5 came in after them
    by_seq.archive_oldest(2)
    assert [seq for seq, _ in by_seq.everything()] == [5, 10, 11, 12, 13, 14]
    assert not by_seq and by_seq.last == 14


def test_a_failing_look_is_logged_and_looks_again(monkeypatch):
    clock = Clock()
    failures = []
    monkeypatch.setattr("mqserver.atrest.log.failure",
                        lambda text, *a, **k: failures.append(text))
    indexes = [None]
    at_rest = IndexAtRest(clock, lambda: indexes[0], lambda: False)
    at_rest.start(1.0)
    clock.advance(1.0)
    assert failures and "next interval" in failures[0]
    indexes[0] = _index(30)
    at_rest.least, at_rest.quiet = 10, 3
    clock.advance(1.0)
    clock.advance(1.0)
    assert not indexes[0].messages[b"q"]
