"""The log starts from a clean stop's snapshot with the index a replay builds, and only
while its segments are as the clean close left them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest_twisted

from mqserver.model import BIND, DECLARE, ENQUEUE, PUT, REMOVE, REQUEUE, QueueOptions, Recovered
from mqserver.storage import log_index
from mqserver.storage.log import LogStore
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
