"""The log starts from a clean stop's snapshot with the index a replay builds, and only
while its segments are as the clean close left them."""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from mqserver.model import BIND, DECLARE, ENQUEUE, PUT, REMOVE, REQUEUE, QueueOptions, Recovered
from mqserver.storage import log_index, log_snapshot
from mqserver.storage.log import LogStore
from mqserver.storage.log_index import LogIndex, loc
from mqserver.storage.snapshot_sections import SectionReader, SectionWriter, SnapshotError
from mqserver.testing import message


def index_of(store: LogStore) -> tuple[Any, ...]:
    """The index as plain values: every live location, and the live bytes."""
    index = store._index
    return ({queue: list(by_seq.everything()) for queue, by_seq in index.messages.items()},
            index.declares, index.bindings, index.records,
            {segment: live for segment, live in index.live.items() if live}, index.live_total)


def ops() -> list[list[tuple[Any, ...]]]:
    """Batches over two queues: archived and fresh index entries, removes, a requeue."""
    batches = [[(DECLARE, b"q", QueueOptions(max_length=900)), (BIND, b"q", b"ev"),
                (PUT, b"ns", b"k", b"v")]]
    batches += [[(ENQUEUE, message(seq, queue=b"q" if seq % 3 else b"r"))
                 for seq in range(start, start + 100)] for start in range(1, 600, 100)]
    batches.append([(REMOVE, b"q", seq) for seq in range(1, 200) if seq % 3])
    batches.append([(REQUEUE, message(700, queue=b"r", retry=1), 3)])
    return batches


@pytest_twisted.inlineCallbacks
def open_store(path: Path) -> Any:
    store = LogStore(path, segment_bytes=8192)
    recovered = yield store.open()
    return store, recovered


@pytest_twisted.inlineCallbacks
def test_the_snapshot_gives_the_index_a_replay_builds(tmp_path, logged, monkeypatch):
    monkeypatch.setattr(log_index, "ARCHIVE_AT", 50)  # the index's arrays, not just its dicts
    store, _ = yield open_store(tmp_path)
    for batch in ops():
        yield store.apply(batch)
    yield store.close()
    store, recovered = yield open_store(tmp_path)
    assert not store.from_snapshot
    assert (yield store.close_clean(recovered))
    assert any("clean-shutdown snapshot" in line and "written" in line for line in logged)
    store, from_snapshot = yield open_store(tmp_path)
    assert store.from_snapshot
    assert any("used" in line and "no replay" in line for line in logged)
    snapshot_index = index_of(store)
    yield store.close()
    assert not store.snapshot_path.exists()
    store, replayed = yield open_store(tmp_path)  # a crash after that start: a replay
    try:
        assert not store.from_snapshot
        assert index_of(store) == snapshot_index
        assert [m.seq for m in replayed.queues[b"r"].messages] == \
            [m.seq for m in from_snapshot.queues[b"r"].messages]
        yield store.apply([(REMOVE, b"r", 700), (ENQUEUE, message(701))])
    finally:
        yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_segment_changed_after_the_clean_close_makes_it_stale(tmp_path, logged):
    store, _ = yield open_store(tmp_path)
    for batch in ops()[:3]:
        yield store.apply(batch)
    yield store.close()
    store, recovered = yield open_store(tmp_path)
    assert (yield store.close_clean(recovered))
    newest = sorted(tmp_path.glob("*.seg"))[-1]
    with open(newest, "ab") as f:  # a torn write after the close (an older release's, say)
        f.write(b"\xa5\x5a")
    os.utime(newest)
    store, again = yield open_store(tmp_path)
    try:
        assert not store.from_snapshot
        assert any("segments changed since" in line for line in logged)
        assert sorted(again.queues) == sorted(recovered.queues)
        assert [m.seq for m in again.queues[b"q"].messages] == \
            [m.seq for m in recovered.queues[b"q"].messages]
    finally:
        yield store.close()
    assert not store.snapshot_path.exists()


@pytest_twisted.inlineCallbacks
def test_no_snapshot_after_a_failed_compaction(tmp_path):
    """Its index may not match the files: the next start replays, which rebuilds it."""
    store, _ = yield open_store(tmp_path)
    yield store.apply(ops()[0])
    store._compaction_failed = True
    assert not (yield store.close_clean(Recovered()))
    assert not store.snapshot_path.exists()


def test_the_index_section_reads_back_its_runs_and_holes(tmp_path):
    """Runs, a hole in one (split at it), runs of one, a removed head and the dict."""
    index = LogIndex()
    for seq in range(1, 301):
        index.put_message(b"q", seq, loc(1, 100 * seq, 100 if seq % 100 else 90))
    index.messages[b"q"].archive()
    for seq in (1, 2, 50, 250):
        assert index.remove_message(b"q", seq)
    index.put_message(b"q", 400, loc(2, 0, 70))
    want = list(index.messages[b"q"].everything())
    section = log_snapshot.encode([(1, 4096, 7)], 401, index)
    again, sizes, next_seq = log_snapshot.decode(SectionReader(section, False), [(1, 4096, 7)])
    by_seq = again.messages[b"q"]
    assert list(by_seq.everything()) == want and not by_seq.holes and next_seq == 401
    assert again.live_total == index.live_total and sizes == {1: 4096}
    assert by_seq.take(3) == loc(1, 300, 100) and by_seq.location(300) == loc(1, 30_000, 90)


def test_an_older_or_damaged_index_section_is_refused():
    old = SectionWriter()
    old.u32(1)  # before FORMAT: the number of segments came first
    for value in (1, 4096, 7, 2):
        old.u64(value)
    with pytest.raises(SnapshotError, match="another format"):
        log_snapshot.decode(SectionReader(b"".join(old.parts), False), [(1, 4096, 7)])

    def section(last: int, starts: list[int], counts: list[int], places: int) -> bytes:
        out = SectionWriter()
        out.u32(log_snapshot.FORMAT)
        out.u32(0)  # segments
        out.u64(1)  # next seq
        out.u32(0)  # live bytes
        out.u32(1)  # queues
        out.blob(b"q")
        out.i64(last)
        out.array(array("q", starts))
        out.array(array("I", counts))
        out.array(array("I", [1] * len(starts)))
        out.array(array("Q", [100] * places))
        for _ in range(3):  # declares, bindings, records
            out.u32(0)
        return b"".join(out.parts)

    index, _, _ = log_snapshot.decode(SectionReader(section(12, [3, 10], [5, 3], 2), False), [])
    assert [seq for seq, _ in index.messages[b"q"].everything()] == [3, 4, 5, 6, 7, 10, 11, 12]
    with pytest.raises(SnapshotError, match="runs past its last seq"):
        log_snapshot.decode(SectionReader(section(11, [3, 10], [5, 3], 2), False), [])
    with pytest.raises(SnapshotError, match="values for 2"):
        log_snapshot.decode(SectionReader(section(12, [3, 10], [5, 3], 3), False), [])


@pytest_twisted.inlineCallbacks
def test_a_snapshot_in_another_index_format_is_refused_and_the_log_replayed(
        tmp_path, logged, monkeypatch):
    store, _ = yield open_store(tmp_path)
    for batch in ops():
        yield store.apply(batch)
    yield store.close()
    store, recovered = yield open_store(tmp_path)
    monkeypatch.setattr(log_snapshot, "FORMAT", log_snapshot.FORMAT - 1)  # an older release's
    assert (yield store.close_clean(recovered))
    monkeypatch.undo()
    store, again = yield open_store(tmp_path)
    try:
        assert not store.from_snapshot
        assert any("another format" in line and "replaying" in line for line in logged)
        assert [m.seq for m in again.queues[b"r"].messages] == \
            [m.seq for m in recovered.queues[b"r"].messages]
    finally:
        yield store.close()
