"""A queue's seq -> location index keeps its archived entries as runs, and answers as a dict."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.storage import log_index, log_seq_index, log_snapshot
from mqserver.storage.log_index import LogIndex, loc
from mqserver.storage.log_seq_index import SeqIndex
from mqserver.storage.snapshot_sections import SectionReader

OPS = st.lists(st.tuples(
    st.sampled_from(["put", "put", "put", "put", "burst", "remove", "head", "head", "tail",
                     "move", "move_next", "requeue_old", "archive", "oldest", "delete"]),
    st.integers(0, 60)), max_size=120)


class Model:
    """The index under test beside a plain dict, with a writer's cursor for locations."""

    def __init__(self) -> None:
        self.index = LogIndex()
        self.model: dict[int, int] = {}
        self.seq = 0
        self.segment, self.offset = 1, 0
        self.moved = 0  # the last seq a compaction moved

    def location(self, n: int) -> int:
        """The next frame's location: mostly contiguous, sizes mostly alike."""
        size = 10 if n % 4 else 10 + n % 7
        if n % 11 == 0:
            self.offset += 3  # a commit frame, another queue's
        if n % 23 == 0:
            self.segment, self.offset = self.segment + 1, 0
        location = loc(self.segment, self.offset, size)
        self.offset += size
        return location

    def put(self, seq: int, location: int) -> None:
        self.index.put_message(b"q", seq, location)
        self.model[seq] = location

    def remove(self, seq: int) -> None:
        assert self.index.remove_message(b"q", seq)
        del self.model[seq]

    def by_seq(self) -> SeqIndex | None:
        return self.index.messages.get(b"q")

    def apply(self, op: str, n: int) -> None:
        live = sorted(self.model)
        if op == "put":
            self.seq += 1 + (n % 5 == 0) * n % 3  # gaps: other queues' seqs
            self.put(self.seq, self.location(n))
        elif op == "burst":
            for i in range(n):
                self.seq += 1
                self.put(self.seq, self.location(1 + 4 * i))
        elif op == "requeue_old" and self.seq:
            seq = n * 7 % self.seq + 1
            if seq not in self.model:
                self.put(seq, self.location(n))
        elif op == "archive" and self.by_seq() is not None:
            self.by_seq().archive()
        elif op == "oldest" and self.by_seq() is not None:
            self.by_seq().archive_oldest(1 + n % 9)
        elif op == "delete":
            if n % 4 == 0:
                self.index.delete_queue(b"q")
                self.model.clear()
        elif not live:
            return
        elif op == "remove":
            self.remove(live[n % len(live)])
        elif op == "head":
            for seq in live[:1 + n % 3]:
                self.remove(seq)
        elif op == "tail":
            self.remove(live[-1])
        elif op == "move":
            self.put(live[n % len(live)], self.location(n))
        else:  # compaction: the next live seqs, in order, to contiguous frames
            after = [seq for seq in live if seq > self.moved] or live
            for seq in after[:1 + n % 8]:
                self.put(seq, self.location(4))
                self.moved = seq

    def check(self) -> None:
        by_seq = self.by_seq()
        assert ([] if by_seq is None else list(by_seq.everything())) == sorted(self.model.items())
        for seq in range(self.seq + 2):
            assert self.index.message_location(b"q", seq) == self.model.get(seq)
        assert self.index.live_total == sum(location & 0xFFFFFFFF
                                            for location in self.model.values())
        assert sum(self.index.live.values()) == self.index.live_total
        if by_seq is not None:
            assert by_seq.archived_count() + len(by_seq) == len(self.model)
            for size in (1, 3, 8):  # what a replay packs (``Replay.result``), a chunk at a time
                blocks = list(by_seq.blocks(size))
                assert [(seq, location) for _, _, seqs, locations in blocks
                        for seq, location in zip(seqs, locations, strict=True)] == \
                    sorted(self.model.items())
                assert all(len(seqs) == len(locations) == size
                           for _, _, seqs, locations in blocks[:-1])
                assert [(first, last) for first, last, _, _ in blocks] == \
                    [(min(seqs), max(seqs)) for _, _, seqs, _ in blocks]
            assert all(seq <= by_seq.last for seq, _ in by_seq.archived())
            assert list(by_seq.starts) == sorted(by_seq.starts)
            for segment in {location >> 64 for location in self.model.values()}:
                assert sorted(by_seq.locations_in(segment)) == sorted(
                    location for location in self.model.values() if location >> 64 == segment)


def _with(names: dict[str, tuple[Any, int]], run: Any) -> None:
    """Run ``run`` with module constants set small (hypothesis and monkeypatch's
    function-scoped fixture do not mix)."""
    saved = {name: getattr(module, name) for name, (module, _) in names.items()}
    try:
        for name, (module, value) in names.items():
            setattr(module, name, value)
        run()
    finally:
        for name, (module, _) in names.items():
            setattr(module, name, saved[name])


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(2, 12), st.integers(1, 6), st.integers(0, 6))
def test_the_runs_answer_as_a_plain_dict_would(ops, archive_at, holes, split_runs):
    """Puts (gaps, varied sizes, new segments), bursts, requeues into old seqs,
    moves (anywhere, and compaction's in-order ones), removes anywhere and at
    the head, archiving at any point, and deletes, against a dict."""
    def run() -> None:
        model = Model()
        for op, n in ops:
            model.apply(op, n)
            assert not model.index.remove_message(b"q", model.seq + 1)
            model.check()
        # the clean-shutdown snapshot's section (``log_snapshot``) gives it back
        section = log_snapshot.encode([], model.seq + 1, model.index)
        model.index, _, _ = log_snapshot.decode(SectionReader(section, False), [])
        model.check()
        for seq in sorted(model.model):
            model.remove(seq)
            model.check()

    _with({"ARCHIVE_AT": (log_index, archive_at), "HOLES": (log_seq_index, holes),
           "SPLIT_RUNS": (log_seq_index, split_runs)}, run)


def _burst(by_seq: SeqIndex, first: int, count: int, offset: int, size: int = 110) -> int:
    for seq in range(first, first + count):
        by_seq[seq] = loc(3, offset, size)
        offset += size
    return offset


def test_a_backlog_of_bursts_is_a_run_per_batch():
    """W1's backlog: batches of same-size frames, each followed by its commit record."""
    by_seq, offset = SeqIndex(), 16
    for batch in range(200):
        offset = _burst(by_seq, 1 + 500 * batch, 500, offset) + 20
        if batch % 50 == 49:
            by_seq.archive_oldest(7000)
    by_seq.archive()
    assert len(by_seq.starts) == 200 and by_seq.archived_count() == 100_000
    assert by_seq.location(777) == loc(3, 16 + 500 * 110 + 20 + 276 * 110, 110)
    for seq in range(1, 60_001):  # FIFO acks
        assert by_seq.take(seq) == loc(3, 16 + (seq - 1) // 500 * 20 + (seq - 1) * 110, 110)
    assert by_seq.first == 120 and by_seq.archived_count() == 40_000


def test_fifo_removes_of_many_runs_drop_their_head():
    """Frames that never follow each other are runs of one; acked, they go."""
    by_seq = SeqIndex()
    for seq in range(1, 20_001):
        by_seq[seq] = loc(1, seq * 10, 9)
    by_seq.archive()
    assert len(by_seq.starts) == 20_000
    for seq in range(1, 19_991):
        assert by_seq.take(seq) == loc(1, seq * 10, 9)
    assert len(by_seq.starts) < 10_000, "the removed head was dropped"
    assert [seq for seq, _ in by_seq.everything()] == list(range(19_991, 20_001))


def test_holes_are_passed_by_the_head_or_split_the_runs(monkeypatch):
    monkeypatch.setattr(log_seq_index, "HOLES", 100)
    by_seq = SeqIndex()
    _burst(by_seq, 1, 10_000, 0)
    by_seq.archive()
    for seq in range(3, 500, 2):  # holes ahead of the head
        by_seq.take(seq)
    assert len(by_seq.holes) == 249 and len(by_seq.starts) == 1, "an eighth: kept"
    for seq in (1, 2, 4):
        by_seq.take(seq)
    assert min(by_seq.holes) == 7 and by_seq.starts[by_seq.first] == 6, "passed by the head"
    for seq in range(600, 10_000, 2):  # now more than an eighth
        by_seq.take(seq)
    assert len(by_seq.starts) > 1000 and len(by_seq.holes) < 1000, "split at the holes"
    assert [seq for seq, _ in by_seq.everything()] == \
        [*range(6, 500, 2), *range(500, 600), *range(601, 10_000, 2), 10_000]
    assert by_seq.location(601) == loc(3, 600 * 110, 110)


def test_compaction_moving_a_run_in_order_keeps_it_one_run():
    by_seq = SeqIndex()
    _burst(by_seq, 1, 1000, 0)
    _burst(by_seq, 1001, 1000, 200_000)
    by_seq.archive()
    for seq in range(1, 1001):  # the head segment's records, copied to segment 7
        assert by_seq.put_old(seq, loc(7, 50 + 110 * seq, 110)) == loc(3, 110 * (seq - 1), 110)
    runs = zip(by_seq.starts[by_seq.first:], by_seq.counts[by_seq.first:], strict=True)
    assert not by_seq and [run for run in runs if run[1]] == [(1, 1000), (1001, 1000)]
    assert by_seq.location(500) == loc(7, 50 + 110 * 500, 110)
