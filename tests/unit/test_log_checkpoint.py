"""The log's checkpoint: a crash restart from it and the records after it recovers
exactly what a full replay does, and anything doubtful replays the whole log."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock
from twisted.internet.threads import blockingCallFromThread, deferToThread

from mqserver.durability import check_expiries, recovered_state
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
)
from mqserver.packed import Backlog
from mqserver.storage import log_checkpoint, log_index
from mqserver.storage import log_records as records
from mqserver.storage.log import LogStore
from mqserver.storage.log_checkpoint import CheckpointError, capture, decode, encode, parse
from mqserver.testing import message

QUEUES = st.sampled_from([b"q", b"q", b"r"])
SEQS = st.integers(1, 60)
BODIES = st.sampled_from([b"", b"body", b"x" * 300])
TTLS = st.sampled_from([None, None, None, 9e9])
OPS = st.one_of(
    st.builds(lambda q, s, b, t: (ENQUEUE, message(s, queue=q, body=b, expires_at=t)), QUEUES,
              SEQS, BODIES, TTLS),
    st.builds(lambda q, s, b: (ENQUEUE, message(s, queue=q, body=b)), QUEUES, SEQS, BODIES),
    st.builds(lambda q, s: (REMOVE, q, s), QUEUES, SEQS),
    st.builds(lambda q, s: (REMOVE, q, s), QUEUES, SEQS),
    st.builds(lambda q, s, old, t: (REQUEUE, message(s, queue=q, retry=1, expires_at=t), old),
              QUEUES, SEQS, SEQS, TTLS),
    st.builds(lambda q, n: (DECLARE, q, QueueOptions(max_length=n)), QUEUES, st.integers(1, 9)),
    st.builds(lambda q, e: (BIND, q, e), QUEUES, st.sampled_from([b"a", b"b.*"])),
    st.builds(lambda q, e: (UNBIND, q, e), QUEUES, st.sampled_from([b"a", b"b.*"])),
    st.builds(lambda q: (DELETE_QUEUE, q), QUEUES),
    st.builds(lambda k, v: (PUT, b"ns", k, v), st.sampled_from([b"k", b"l"]),
              st.binary(max_size=9)),
    st.builds(lambda k: (DELETE, b"ns", k), st.sampled_from([b"k", b"l"])),
)
STEPS = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.lists(OPS, min_size=1, max_size=12)),
    st.tuples(st.just("batch"), st.lists(OPS, min_size=1, max_size=12)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("compact")),
), max_size=20)


def make(path: Path, **kwargs: Any) -> LogStore:
    """A store with small segments (rolls, compaction) and no checkpoint of its own."""
    return LogStore(path, segment_bytes=1024, slice_bytes=256, checkpoint="off", **kwargs)


def index_of(store: LogStore) -> tuple[Any, ...]:
    """The index as plain values (copies: a compaction may go on moving it): every
    live location, and the live bytes.  A queue's empty ``SeqIndex`` or bindings,
    a namespace's empty records, are the same as none (a replay makes them only
    if it sees their records)."""
    index = store._index
    messages = {queue: list(by_seq.everything()) for queue, by_seq in index.messages.items()}
    return ({queue: entries for queue, entries in messages.items() if entries},
            dict(index.declares),
            {name: dict(events) for name, events in index.bindings.items() if events},
            {name: dict(keys) for name, keys in index.records.items() if keys},
            {segment: live for segment, live in index.live.items() if live}, index.live_total,
            index.ttl_seq)


@inlineCallbacks
def check_against_a_full_replay(path: Path, used: bool, compacted_past: bool = False) -> Any:
    """Open the crashed log at ``path`` from its checkpoint, and a copy of it without
    the checkpoint (a full replay): both must recover the same state and index.
    With ``compacted_past``, the checkpoint may go unused for the one reason a
    store that writes no checkpoint of its own gives: compaction deleted
    records after its position (``Checkpointer.dropped`` writes a new one)."""
    full = path.with_name(path.name + "-full")
    shutil.copytree(path, full)
    (full / log_checkpoint.FILENAME).unlink(missing_ok=True)
    store, from_checkpoint = make(path), make(full)
    # each as its open left it (a compaction may start at once: it moves the
    # index and deletes segments once its first file operation is done)
    recovered = yield store.open()
    seen = index_of(store), dict(store._segments)
    replayed = yield from_checkpoint.open()
    try:
        notes = store.recovery.notes
        if compacted_past and used and store.recovery.checkpoint is None:
            assert "deleted by compaction, still holds live records" in notes[0][1], notes
        else:
            assert (store.recovery.checkpoint is not None) == used, notes
        assert from_checkpoint.recovery.checkpoint is None
        assert recovered_state(recovered) == recovered_state(replayed)
        check_expiries(recovered, "from the checkpoint")
        assert recovered.next_seq == replayed.next_seq
        assert seen == (index_of(from_checkpoint), from_checkpoint._segments)
    finally:
        yield store.close()
        yield from_checkpoint.close()
    return store.recovery


@inlineCallbacks
def run_steps(path: Path, steps: list[tuple[Any, ...]]) -> Any:
    store = make(path)
    yield store.open()
    written = False
    for step in steps:
        if step[0] == "batch":
            yield store.apply(step[1])
        elif step[0] == "checkpoint":
            written = (yield store.checkpoints.now()) or written
        else:
            yield store.compaction_idle()
    yield store.close()  # a crash: no snapshot
    yield check_against_a_full_replay(path, written, compacted_past=True)


def declared(steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``steps`` as a broker stores them: an op on a queue comes after its DECLARE
    (``declare_queue``), a deleted queue's next op after a new one."""
    known: set[bytes] = set()
    out: list[tuple[Any, ...]] = []
    for step in steps:
        if step[0] != "batch":
            out.append(step)
            continue
        ops = []
        for op in step[1]:
            queue = op[1].queue if op[0] in (ENQUEUE, REQUEUE) else op[1]
            if op[0] == DELETE_QUEUE:
                known.discard(queue)
            elif op[0] == DECLARE:
                known.add(queue)
            elif op[0] not in (PUT, DELETE) and queue not in known:
                ops.append((DECLARE, queue, QueueOptions()))
                known.add(queue)
            ops.append(op)
        out.append(("batch", ops))
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("archive_at", [4, log_index.ARCHIVE_AT])
@pytest_twisted.inlineCallbacks
def test_a_checkpoint_and_its_tail_recover_what_a_full_replay_does(tmp_path, monkeypatch,
                                                                    archive_at):
    """Random batches (every op kind, small segments: rolls and compaction; each
    queue declared as a broker declares it) with checkpoints between them; with
    ``ARCHIVE_AT`` 4 the index holds runs and holes.  Chunks of 4 messages: a
    replay's decoded later unless one has a TTL (``check_expiries``).
    More examples: ``MQSERVER_CHECKPOINT_EXAMPLES`` (40 by default)."""
    from twisted.internet import reactor

    monkeypatch.setattr(log_index, "ARCHIVE_AT", archive_at)
    monkeypatch.setattr(Backlog, "chunk_size", 4)
    counter = itertools.count()

    @settings(max_examples=int(os.environ.get("MQSERVER_CHECKPOINT_EXAMPLES", 40)), deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    @given(STEPS)
    def check(steps: list[tuple[Any, ...]]) -> None:
        blockingCallFromThread(reactor, run_steps, tmp_path / f"e{next(counter)}",
                               declared(steps))

    yield deferToThread(check)


def fill(n: int, start: int = 1) -> list[list[tuple[Any, ...]]]:
    return [[(ENQUEUE, message(seq, body=b"x" * 100)) for seq in range(first, first + 10)]
            for first in range(start, start + n, 10)]


@pytest_twisted.inlineCallbacks
def crashed(path: Path, before: list[list[tuple[Any, ...]]],
            after: list[list[tuple[Any, ...]]], **kwargs: Any) -> Any:
    """A log with ``before`` written, a checkpoint, then ``after``; closed as a crash leaves it."""
    store = make(path, **kwargs)
    yield store.open()
    for ops in before:
        yield store.apply(ops)
    assert (yield store.checkpoints.now())
    for ops in after:
        yield store.apply(ops)
    yield store.compaction_idle()
    yield store.close()
    return store


SETUP = [[(DECLARE, b"q", QueueOptions(max_length=500)), (BIND, b"q", b"e"),
          (PUT, b"ns", b"k", b"v")]]


@pytest_twisted.inlineCallbacks
def test_compaction_after_the_checkpoint_deletes_heads_its_tail_repoints(tmp_path, logged):
    """The heads the checkpoint's index points into go, their live records (the
    DECLARE, the BIND, the PUT, unacked messages) copied after its position."""
    acks = [[(REMOVE, b"q", seq) for seq in range(1, 200) if seq % 7]]
    store = yield crashed(tmp_path, SETUP + fill(200), acks + fill(100, 201))
    assert store.segments_deleted and store.records_copied
    recovery = yield check_against_a_full_replay(tmp_path, True)
    assert min(recovery.segments) > 1  # the first heads are gone
    assert any("log checkpoint" in line and "used: from segment" in line for line in logged)


@pytest_twisted.inlineCallbacks
def test_a_checkpoint_in_an_older_segment_walks_the_later_ones_whole(tmp_path):
    yield crashed(tmp_path, SETUP + fill(20), fill(200, 21))
    recovery = yield check_against_a_full_replay(tmp_path, True)
    assert recovery.checkpoint[0] < max(recovery.segments) - 2


@pytest_twisted.inlineCallbacks
def test_a_torn_tail_after_the_position_is_cut_as_in_a_replay(tmp_path):
    yield crashed(tmp_path, SETUP + fill(20), fill(30, 21))
    newest = max(tmp_path.glob("*.seg"))
    with open(newest, "ab") as f:
        f.write(records.frame(b"\x01" * 40)[:20])
    yield check_against_a_full_replay(tmp_path, True)


def damage_checkpoint(path: Path) -> None:
    data = bytearray((path / log_checkpoint.FILENAME).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / log_checkpoint.FILENAME).write_bytes(bytes(data))


def truncate_position(path: Path) -> None:
    point = decode((path / log_checkpoint.FILENAME).read_bytes())
    os.truncate(path / f"{point.segment:020d}.seg", point.offset - 1)


def grow_sealed(path: Path) -> None:
    with open(sorted(path.glob("*.seg"))[1], "ab") as f:
        f.write(b"\0")


def lose_middle(path: Path) -> None:
    sorted(path.glob("*.seg"))[1].unlink()


def lose_head(path: Path) -> None:
    """As a compaction that deleted the head without copying its live records."""
    sorted(path.glob("*.seg"))[0].unlink()


def lose_after(path: Path) -> None:
    point = decode((path / log_checkpoint.FILENAME).read_bytes())
    (path / f"{point.segment + 1:020d}.seg").unlink()


def other_version(path: Path) -> None:
    data = bytearray((path / log_checkpoint.FILENAME).read_bytes())
    data[8] += 1
    (path / log_checkpoint.FILENAME).write_bytes(bytes(data))


def cut_checkpoint(path: Path) -> None:
    data = (path / log_checkpoint.FILENAME).read_bytes()
    (path / log_checkpoint.FILENAME).write_bytes(data[:-5])


@pytest.mark.parametrize("damage", [damage_checkpoint, truncate_position, grow_sealed,
                                    lose_middle, lose_head, lose_after, other_version,
                                    cut_checkpoint])
@pytest_twisted.inlineCallbacks
def test_a_doubtful_checkpoint_replays_the_whole_log(tmp_path, logged, damage):
    yield crashed(tmp_path, SETUP + fill(40), fill(40, 41))
    damage(tmp_path)
    store = make(tmp_path)
    recovered = yield store.open()
    yield store.close()
    assert store.recovery.checkpoint is None
    assert any("not used" in line and "replaying the whole log" in line for line in logged), \
        logged
    (tmp_path / log_checkpoint.FILENAME).unlink()
    yield check_against_a_full_replay(tmp_path, False)  # as the fallback found it
    assert recovered.next_seq == 81 or damage in (lose_middle, lose_head, lose_after)


def point_in(store: LogStore) -> log_checkpoint.Capture:
    return capture(store._index, store._segments, store._active, store._next_seq)


@pytest_twisted.inlineCallbacks
def test_an_index_pointing_where_the_log_has_nothing_replays_the_whole_log(tmp_path, logged):
    store = make(tmp_path)
    yield store.open()
    for ops in SETUP + fill(30):
        yield store.apply(ops)
    wrong = point_in(store)
    wrong.declares[b"q"] += 1 << 32  # the next frame: not the DECLARE
    yield store.close()
    (tmp_path / log_checkpoint.FILENAME).write_bytes(encode(wrong))
    store = make(tmp_path)
    yield store.open()
    yield store.close()
    assert store.recovery.checkpoint is None
    assert any("is not the declare of" in line or "no record of" in line for line in logged)


@pytest_twisted.inlineCallbacks
def test_no_checkpoint_when_the_log_is_not_where_the_index_is(tmp_path):
    store = make(tmp_path)
    yield store.open()
    yield store.apply(fill(10)[0])
    wrong = point_in(store)
    wrong.offset += 1
    written, text = yield store._thread.run(log_checkpoint.write_thd, store._files,
                                            store.checkpoints.path, wrong)
    yield store.close()
    assert not written and "not written" in text
    assert not (tmp_path / log_checkpoint.FILENAME).exists()


def test_the_file_round_trips_and_refuses_what_does_not_check(tmp_path):
    index = log_index.LogIndex()
    for seq in range(1, 20):
        index.put_message(b"q", seq, log_index.loc(1, 100 + 50 * seq, 50))
    index.messages[b"q"].archive()
    index.remove_message(b"q", 5)  # a hole
    index.put_message(b"q", 30, log_index.loc(2, 40, 60))  # a dict entry
    index.declare(b"q", log_index.loc(1, 60, 40))
    index.bind(b"q", b"e", log_index.loc(1, 100, 30))
    index.put_record(b"ns", b"k", log_index.loc(2, 100, 30))
    point = capture(index, {1: 4000, 2: 500}, 2, 31)
    back = decode(encode(point))
    assert (back.segment, back.offset, back.next_seq) == (2, 500, 31)
    assert list(back.index.messages[b"q"].everything()) == list(
        index.messages[b"q"].everything())
    assert back.index.messages[b"q"].holes == {5}
    assert (back.index.declares, back.index.bindings, back.index.records) == (
        index.declares, index.bindings, index.records)
    assert (back.index.live, back.index.live_total) == (index.live, index.live_total)
    data = encode(point)
    for bad in (data[:10], data[:-1], b"X" + data[1:]):
        with pytest.raises(CheckpointError):
            decode(bad)


def test_the_option():
    assert parse("64:5") == (64 << 20, 5.0)
    assert parse("0:0.5") == (0, 0.5)
    assert parse("off") == (0, 0.0)
    for bad in ("64", "x:1", "-1:5", "1:-1", ""):
        with pytest.raises(ValueError, match="--log-checkpoint"):
            parse(bad)


@pytest_twisted.inlineCallbacks
def test_checkpoints_come_after_bytes_written_and_seconds_after_a_write(tmp_path):
    clock = Clock()
    store = LogStore(tmp_path, clock=clock, checkpoint="1:5", index_at_rest=0)
    yield store.open()
    checkpoints = store.checkpoints
    clock.advance(5)  # nothing written, nothing walked: none
    yield store.drain()
    assert checkpoints.written == 0
    yield store.apply(fill(10)[0])
    assert 0 < checkpoints.unchecked < 1 << 20
    clock.advance(5)
    yield store.drain()
    assert checkpoints.written == 1 and checkpoints.unchecked == 0
    clock.advance(5)  # nothing written since: none
    yield store.drain()
    assert checkpoints.written == 1
    big = [(ENQUEUE, message(seq, body=b"x" * 5000)) for seq in range(100, 320)]
    yield store.apply(big)  # past 1 MiB: at once
    yield store.drain()
    assert checkpoints.written == 2 and checkpoints.unchecked == 0
    yield store.close()
    store = LogStore(tmp_path, clock=clock, checkpoint="1:5", index_at_rest=0)
    yield store.open()  # from the checkpoint, nothing after it: nothing to walk
    assert store.recovery.checkpoint is not None and store.checkpoints.unchecked == 0
    yield store.close()
    (tmp_path / log_checkpoint.FILENAME).unlink()
    store = LogStore(tmp_path, clock=clock, checkpoint="1:5", index_at_rest=0)
    yield store.open()  # a full replay: what it walked is written at once
    yield store.drain()
    assert store.checkpoints.written == 1 and store.checkpoints.unchecked == 0
    yield store.close()
    store = LogStore(tmp_path, clock=clock, checkpoint="1:5", index_at_rest=0)
    yield store.open()  # and the next crash restart walks nothing
    assert store.recovery.checkpoint is not None and store.recovery.walked == 0
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_start_from_the_snapshot_ignores_the_checkpoint_and_a_crash_after_uses_it(tmp_path):
    """The snapshot stands for the log at the clean close; the checkpoint, older, is
    still true of the log: a crash after the snapshot's start walks from it."""
    yield crashed(tmp_path, SETUP + fill(30), fill(20, 31))
    store = make(tmp_path)
    recovered = yield store.open()
    assert (yield store.close_clean(recovered))
    store = make(tmp_path)
    recovered = yield store.open()
    assert store.from_snapshot and store.recovery.checkpoint is None
    assert store.checkpoints.unchecked == store._total  # a new one due after a write or tick
    yield store.apply([(REMOVE, b"q", 1), (ENQUEUE, message(60))])
    yield store.close()
    recovery = yield check_against_a_full_replay(tmp_path, True)
    assert len(recovery.recovered.queues[b"q"].messages) == 50


@pytest_twisted.inlineCallbacks
def test_compaction_past_the_position_writes_a_new_checkpoint(tmp_path):
    """The position's segment compacted away: a new checkpoint at once, so a crash
    then walks from it (the records after the old position, tombstones too, went
    with the segment)."""
    store = LogStore(tmp_path, segment_bytes=1024, slice_bytes=256, checkpoint="1024:0")
    yield store.open()
    for ops in SETUP + fill(20):
        yield store.apply(ops)
    assert (yield store.checkpoints.now())
    standing = store.checkpoints.standing
    yield store.apply([(DELETE_QUEUE, b"q"), (DECLARE, b"q", QueueOptions())])
    for ops in fill(60, 100):
        yield store.apply(ops)
        yield store.apply([(REMOVE, b"q", op[1].seq) for op in ops])
    yield store.compaction_idle()
    yield store.drain()
    assert min(store._segments) > standing and store.checkpoints.written > 1
    assert store.checkpoints.standing > standing
    yield store.close()
    yield check_against_a_full_replay(tmp_path, True)


@pytest_twisted.inlineCallbacks
def test_the_first_checkpoint_is_logged_the_next_counted_and_batches_queue_none(tmp_path,
                                                                              logged):
    clock = Clock()
    store = LogStore(tmp_path, clock=clock, checkpoint="1:5", index_at_rest=0)
    yield store.open()

    def big(first: int) -> Any:
        return store.apply([(ENQUEUE, message(seq, body=b"x" * 5000))
                            for seq in range(first, first + 220)])

    big(100)  # past 1 MiB: one is captured now, written behind the batch
    big(320)  # past 1 MiB again each, while it is being written: none more
    big(540)
    yield store.drain()
    assert store.checkpoints.written == 1
    metrics = store.metrics()
    assert metrics["checkpoints_total"] == 1 and metrics["checkpoint_behind_bytes"] > 2 << 20
    yield big(760)  # the first batch after it: the next one
    yield store.drain()
    assert store.metrics()["checkpoints_total"] == 2
    assert store.metrics()["checkpoint_behind_bytes"] == 0
    assert sum("log checkpoint written" in line for line in logged) == 1
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_start_from_the_snapshot_writes_a_checkpoint_at_once(tmp_path):
    """A crash soon after a clean restart (before the first tick) walks nothing."""
    clock = Clock()
    store = LogStore(tmp_path, clock=clock, checkpoint="off", index_at_rest=0)
    yield store.open()
    for ops in SETUP + fill(30):
        yield store.apply(ops)
    yield store.close()  # a crash, and no checkpoint: a full replay, then a clean stop
    store = LogStore(tmp_path, clock=clock, checkpoint="off", index_at_rest=0)
    recovered = yield store.open()
    assert (yield store.close_clean(recovered))
    store = LogStore(tmp_path, clock=clock, checkpoint="64:5", index_at_rest=0)
    yield store.open()
    yield store.drain()
    assert store.from_snapshot and store.checkpoints.written == 1
    yield store.close()  # a crash: no snapshot
    store = LogStore(tmp_path, clock=clock, checkpoint="64:5", index_at_rest=0)
    yield store.open()
    assert store.recovery.checkpoint is not None and store.recovery.walked == 0
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_an_index_moved_at_rest_is_checkpointed_as_runs(tmp_path):
    clock = Clock()
    store = LogStore(tmp_path, clock=clock, checkpoint="64:0", index_at_rest=1.0)
    yield store.open()
    for first in range(1, 6001, 1000):
        yield store.apply([(ENQUEUE, message(seq)) for seq in range(first, first + 1000)])
    for _ in range(40):  # looks a second apart, then a slice a reactor turn
        clock.advance(1.0)
    yield store.drain()
    assert not store._index.messages[b"q"] and store.checkpoints.written == 1
    point = log_checkpoint.decode((tmp_path / log_checkpoint.FILENAME).read_bytes())
    by_seq = point.index.messages[b"q"]
    assert not by_seq and by_seq.archived_count() == 6000
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_due_checkpoint_waits_while_the_dicts_are_big(tmp_path, monkeypatch):
    monkeypatch.setattr(log_checkpoint, "CAPTURE_DICT_ENTRIES", 100)
    clock = Clock()
    store = LogStore(tmp_path, clock=clock, checkpoint="1:5", index_at_rest=0)
    yield store.open()
    yield store.apply([(ENQUEUE, message(seq, body=b"x" * 10_000)) for seq in range(1, 121)])
    clock.advance(5)
    yield store.drain()  # due by bytes and by the tick, but 120 dict entries
    assert store.checkpoints.written == 0 and store.checkpoints.unchecked > 1 << 20
    store._index.messages[b"q"].archive()  # what ARCHIVE_AT or an index at rest does
    yield store.apply([(ENQUEUE, message(121))])  # the next batch asks again
    yield store.drain()
    assert store.checkpoints.written == 1 and store.checkpoints.unchecked == 0
    yield store.close()
