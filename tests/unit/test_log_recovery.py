"""The log's crash replay (``log_recovery``): the inline walk rebuilds what the careful one does,
and the store says how long its replay took."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

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
    QueueOptions,
    Recovered,
)
from mqserver.storage import log_index
from mqserver.storage import log_records as records
from mqserver.storage.log import LogStore
from mqserver.storage.log_recovery import RecoveryResult, Replay
from mqserver.testing import message


def every_kind() -> list[list[tuple[Any, ...]]]:
    """Batches with each op the broker stores: plain and full messages, removes of
    new and old seqs, requeues to the same and to a new seq, options, bindings,
    records, a queue deleted and declared again."""
    full = {"event": b"e.a", "headers": {"k": "v"}, "source": "mqks", "expires_at": 2000.0}
    batches: list[list[tuple[Any, ...]]] = [
        [(DECLARE, b"q", QueueOptions(max_length=50)), (BIND, b"q", b"e.a"),
         (DECLARE, b"gone", QueueOptions())],
        [(ENQUEUE, message(n)) for n in range(1, 21)],
        [(ENQUEUE, message(n, queue=b"gone", **full)) for n in range(21, 26)],
        [(REMOVE, b"q", 1), (REMOVE, b"q", 2), (ENQUEUE, message(26, **full)),
         (REMOVE, b"q", 26), (PUT, b"ns", b"k", b"v1"), (PUT, b"ns", b"k2", b"v")],
    ]
    requeued = message(27, id=b"m3", retry=1)
    batches += [
        [(REQUEUE, requeued, 3), (REQUEUE, message(4, retry=2), 4), (UNBIND, b"q", b"e.a"),
         (DELETE, b"ns", b"k2"), (PUT, b"ns", b"k", b"v2")],
        [(DELETE_QUEUE, b"gone"), (DECLARE, b"gone", QueueOptions(default_ttl=5.0)),
         (ENQUEUE, message(28, queue=b"gone")), (REMOVE, b"q", 27)],
        [(ENQUEUE, message(n)) for n in range(29, 60)],
        [(REMOVE, b"q", n) for n in range(5, 40, 3)],
    ]
    return batches


@pytest_twisted.inlineCallbacks
def write(path: Path, batches: list[list[tuple[Any, ...]]]) -> Any:
    store = LogStore(path, segment_bytes=2048)  # several segments, batches across them
    yield store.open()
    for ops in batches:
        yield store.apply(ops)
    yield store.close()


def replayed(path: Path, inline: bool) -> tuple[Replay, Recovered]:
    """The log at ``path`` replayed segment by segment: with the inline walk, or
    with the careful walk from each segment's first record."""
    replay = Replay()
    result = RecoveryResult(Recovered(), replay.index, {}, 1)
    kept = {}
    for segment in sorted(path.glob("*.seg")):
        number, data = int(segment.stem), segment.read_bytes()
        if inline:
            replay.segment(number, data, result)
        else:
            pending: list[tuple[Any, ...]] = []
            replay._careful(number, data, records.HEADER_SIZE, records.HEADER_SIZE, pending,
                            result)
            assert pending == []
        kept[number] = data
    assert result.notes == [] and result.skipped == 0
    return replay, replay.result(kept, result.notes)


def state(replay: Replay) -> tuple[Any, ...]:
    index = replay.index
    return ({queue: list(by_seq.everything()) for queue, by_seq in index.messages.items()},
            {segment: size for segment, size in index.live.items() if size}, index.live_total,
            index.declares, index.bindings, index.records, replay.options, replay.records,
            replay.next_seq)


@pytest.mark.parametrize("archive_at", [4, log_index.ARCHIVE_AT])
@pytest_twisted.inlineCallbacks
def test_the_inline_walk_rebuilds_what_the_careful_walk_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive_at: int) -> Any:
    # with 4, each queue's index keeps most entries in its arrays (SeqIndex):
    # the inline puts and removes take its archived paths too
    monkeypatch.setattr(log_index, "ARCHIVE_AT", archive_at)
    yield write(tmp_path, every_kind())
    assert len(list(tmp_path.glob("*.seg"))) > 2
    fast, fast_recovered = replayed(tmp_path, inline=True)
    careful, careful_recovered = replayed(tmp_path, inline=False)
    assert state(fast) == state(careful)
    assert fast_recovered == careful_recovered
    q = fast_recovered.queues[b"q"].messages
    assert [m.seq for m in q][:3] == [4, 6, 7] and q[0].retry == 2
    assert fast_recovered.queues[b"gone"].options == QueueOptions(default_ttl=5.0)
    assert [m.seq for m in fast_recovered.queues[b"gone"].messages] == [28]
    assert fast_recovered.records == {b"ns": {b"k": b"v2"}}
    assert fast.next_seq == 60


@pytest_twisted.inlineCallbacks
def test_a_replay_logs_what_it_recovered_and_how_long_it_took(tmp_path: Path,
                                                              logged: list[str]) -> Any:
    yield write(tmp_path, every_kind())
    store = LogStore(tmp_path, segment_bytes=2048)
    recovered = yield store.open()
    yield store.close()
    count = sum(len(rq.messages) for rq in recovered.queues.values())
    pattern = re.compile(rf"log {re.escape(str(tmp_path))}: 2 queues, {count} messages "
                         r"recovered in \d+\.\d{3} s \(replay\)$")
    assert any(pattern.search(line) for line in logged), logged
