"""The log backend: the storage contract, then damage, locking, fsync and compaction."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.model import BIND, DECLARE, ENQUEUE, PUT, REMOVE, REQUEUE, QueueOptions
from mqserver.storage import log_compaction, log_index
from mqserver.storage import log_records as records
from mqserver.storage.errors import StoreFailedError, StoreFormatError, StoreLockedError
from mqserver.storage.log import LogStore, parse_fsync
from mqserver.testing import StoreContract, message


class TestLogStore(StoreContract):
    def make_store(self, path: Path) -> LogStore:
        return LogStore(path)


class TestLogStoreTinySegmentsAlways(StoreContract):
    """Segments of 2 KiB roll and compact all the time, under the whole contract,
    and each queue's index keeps all but 4 entries in its arrays (``SeqIndex``)."""

    @pytest.fixture(autouse=True)
    def _small_index_dicts(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(log_index, "ARCHIVE_AT", 4)

    def make_store(self, path: Path) -> LogStore:
        return LogStore(path, fsync="always", segment_bytes=2048, slice_bytes=512)


class TestLogStoreNeverFsync(StoreContract):
    """``--fsync=never`` (the default ``interval:50`` is ``TestLogStore``, ``always`` above)."""

    def make_store(self, path: Path) -> LogStore:
        return LogStore(path, fsync="never")


def segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


def frames_of(path: Path) -> list[tuple[int, int, bytes]]:
    data = path.read_bytes()
    return list(records.iter_frames(data, records.HEADER_SIZE, len(data)))


def offset_of_seq(path: Path, seq: int) -> tuple[int, int]:
    for offset, size, payload in frames_of(path):
        if payload[0] in records.MESSAGE_KINDS and records.message_key(payload)[1] == seq:
            return offset, size
    raise AssertionError(f"seq {seq} not in {path}")


@pytest_twisted.inlineCallbacks
def write(path: Path, *batches: list[tuple[Any, ...]], **options: Any) -> Any:
    store = LogStore(path, **options)
    yield store.open()
    for ops in batches:
        yield store.apply(ops)
    yield store.close()
    return store


@pytest_twisted.inlineCallbacks
def recover(path: Path, **options: Any) -> Any:
    store = LogStore(path, **options)
    recovered = yield store.open()
    yield store.close()
    return recovered, store


THREE = (
    [(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))],
    [(ENQUEUE, message(2))],
    [(ENQUEUE, message(3))],
)


def seqs(recovered: Any) -> list[int]:
    return [m.seq for m in recovered.queues[b"q"].messages]


# -- format ------------------------------------------------------------------


def test_every_op_round_trips_through_its_payload():
    full = message(5, event=b"e", headers={"ü": "1"}, expires_at=9.5, retry=3, source="mqks")
    ops = [
        (ENQUEUE, full), (REQUEUE, full, 2), (REMOVE, b"q", 7),
        (DECLARE, b"q", QueueOptions(0.0, True, b"dlq", 10, 60.0)),
        (DECLARE, b"q", QueueOptions()), (BIND, b"q", b"a.*"), (PUT, b"ns", b"k", b"\x00v"),
    ]
    for op in ops:
        assert records.decode(records.encode_op(op)) == op
    assert records.decode(records.encode_commit(3, 99)) == ("commit", 3, 99)
    assert records.as_enqueue(records.encode_op((REQUEUE, full, 2))) == records.encode_op(
        (ENQUEUE, full)
    )


def test_message_payloads_keep_the_documented_layout():
    """kind | [old seq] | seq, created, expires, retry, flags, six lengths | the six fields."""
    full = message(5, event=b"e", expires_at=9.5, retry=3, source="mqks")
    fields = b"q" + full.id + b"e" + b"mqks" + full.body
    head = struct.pack(">QddIBIIIIII", 5, full.created_at, 9.5, 3, 1 | 2 | 8,
                       1, len(full.id), 1, 0, 4, len(full.body))
    assert records.encode_op((ENQUEUE, full)) == bytes((records.K_ENQUEUE,)) + head + fields
    assert records.encode_op((REQUEUE, full, 2)) == (
        bytes((records.K_REQUEUE,)) + struct.pack(">Q", 2) + head + fields
    )
    assert records.encode_op((REMOVE, b"q", 7)) == (
        bytes((records.K_REMOVE,)) + struct.pack(">Q", 7) + b"q"
    )


@given(st.binary(min_size=1, max_size=5000))  # a record's payload is never empty
def test_frames_carry_the_payload_length_and_a_crc_of_both(payload):
    """Payloads under 4 KiB take the length's CRC from a table; longer ones compute it."""
    length = struct.pack(">I", len(payload))
    crc = struct.pack(">I", zlib.crc32(length + payload))
    framed = records.frame(payload)
    assert framed == b"\xa5\x5a" + length + crc + payload
    assert list(records.iter_frames(framed, 0, len(framed))) == [(0, len(framed), payload)]


def test_frames_at_the_edge_of_the_length_table():
    for size in (4095, 4096, 4097):
        payload = b"p" * size
        assert list(records.iter_frames(records.frame(payload), 0, size + 10)) == [
            (0, size + 10, payload)
        ]


def test_header_checks():
    header = records.encode_header(7, 42)
    assert records.decode_header(header) == (7, 42)
    with pytest.raises(records.FormatError, match="checksum"):
        records.decode_header(header[:9] + b"X" + header[10:])
    with pytest.raises(records.FormatError, match="needs 32"):
        records.decode_header(header[:10])


def test_frames_resync_after_garbage():
    good = [records.frame(b"\x08one"), records.frame(b"\x08two")]
    data = good[0] + b"\xa5\x5a\x00\x00\x00\x05junk!" + b"\x00" * 7 + good[1]
    walked = list(records.iter_frames(data, 0, len(data)))
    assert [p for _, _, p in walked] == [b"\x08one", None, b"\x08two"]
    assert walked[1][1] == -(len(data) - len(good[0]) - len(good[1]))


def test_fsync_policy_parsing():
    assert parse_fsync("always") == ("always", 0.0)
    assert parse_fsync("never") == ("never", 0.0)
    assert parse_fsync("interval:50") == ("interval", 0.05)
    for bad in ("interval:0", "interval:x", "sometimes", "interval"):
        with pytest.raises(ValueError):
            parse_fsync(bad)


# -- damage --------------------------------------------------------------------


@pytest.mark.parametrize("cut", [3, 12, 40])
@pytest_twisted.inlineCallbacks
def test_torn_tail_is_truncated_and_logged(tmp_path: Path, logged: list[str], cut: int) -> Any:
    yield write(tmp_path / "two", *THREE[:2])
    yield write(tmp_path / "log", *THREE)
    [segment] = segments(tmp_path / "log")
    size = segment.stat().st_size
    os.truncate(segment, size - cut)
    recovered, store = yield recover(tmp_path / "log")
    assert seqs(recovered) == [1, 2]
    intact = segments(tmp_path / "two")[0].stat().st_size
    assert segment.stat().st_size == intact
    assert store.recovery.truncated == size - cut - intact
    assert any(f"torn tail of {size - cut - intact} bytes truncated" in line for line in logged)
    again, _ = yield recover(tmp_path / "log")  # the repair holds; nothing more to cut
    assert seqs(again) == [1, 2]


@pytest.mark.parametrize("where", ["payload", "length", "crc"])
@pytest_twisted.inlineCallbacks
def test_a_flipped_byte_loses_only_that_record(tmp_path: Path, logged: list[str],
                                               where: str) -> Any:
    yield write(tmp_path, *THREE)
    [segment] = segments(tmp_path)
    offset, size = offset_of_seq(segment, 2)
    at = offset + {"payload": size // 2, "length": 4, "crc": 7}[where]
    data = bytearray(segment.read_bytes())
    data[at] ^= 0x40
    segment.write_bytes(bytes(data))
    recovered, store = yield recover(tmp_path)
    assert seqs(recovered) == [1, 3]
    assert store.recovery.skipped > 0 and store.recovery.truncated == 0
    assert any(f"damaged bytes at offset {offset} skipped" in line for line in logged)
    assert any("lost records" in line for line in logged)


@pytest_twisted.inlineCallbacks
def test_a_missing_segment_is_logged_and_the_rest_recovered(tmp_path: Path,
                                                           logged: list[str]) -> Any:
    batches = [[(DECLARE, b"q", QueueOptions())]]
    batches += [[(ENQUEUE, message(n, body=b"x" * 300))] for n in range(1, 9)]
    yield write(tmp_path, *batches, segment_bytes=600)
    files = segments(tmp_path)
    assert len(files) >= 4
    lost = {records.message_key(p)[1] for _, _, p in frames_of(files[2])
            if p[0] in records.MESSAGE_KINDS}
    files[2].unlink()
    recovered, _ = yield recover(tmp_path, segment_bytes=600)
    assert lost and seqs(recovered) == [n for n in range(1, 9) if n not in lost]
    number = int(files[2].stem)
    assert any(f"log segment(s) {number} missing" in line for line in logged)


@pytest_twisted.inlineCallbacks
def test_an_unreadable_segment_header_is_skipped(tmp_path: Path, logged: list[str]) -> Any:
    batches = [[(DECLARE, b"q", QueueOptions())]]
    batches += [[(ENQUEUE, message(n, body=b"x" * 300))] for n in range(1, 7)]
    yield write(tmp_path, *batches, segment_bytes=600)
    files = segments(tmp_path)
    with open(files[1], "r+b") as f:
        f.write(b"NOTMQLOG")
    recovered, _ = yield recover(tmp_path, segment_bytes=600)
    assert 1 <= len(seqs(recovered)) < 6
    number = int(files[1].stem)
    assert any(f"log segment {number} unreadable (header checksum mismatch)" in line
               for line in logged)


@pytest_twisted.inlineCallbacks
def test_a_newer_format_version_is_refused(tmp_path: Path) -> Any:
    yield write(tmp_path, *THREE)
    [segment] = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    head = struct.pack(">8sHHQQ", records.SEGMENT_MAGIC, records.FORMAT_VERSION + 1, 0, 1, 1)
    data[: records.HEADER_SIZE] = head + struct.pack(">I", zlib.crc32(head))
    segment.write_bytes(bytes(data))
    with pytest.raises(StoreFormatError, match="format version 2"):
        yield LogStore(tmp_path).open()


# -- locking -----------------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_two_stores_cannot_share_a_directory(tmp_path: Path) -> Any:
    first = LogStore(tmp_path)
    yield first.open()
    with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
        yield LogStore(tmp_path).open()
    yield first.close()
    second = LogStore(tmp_path)
    yield second.open()
    yield second.close()


@pytest_twisted.inlineCallbacks
def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> Any:
    tmp_path.joinpath("lock").touch()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({str(tmp_path / 'lock')!r}, os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(StoreLockedError):
            yield LogStore(tmp_path).open()
    finally:
        holder.kill()
        holder.wait()
    store = LogStore(tmp_path)
    yield store.open()
    yield store.close()


# -- fsync and group commit --------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


@pytest_twisted.inlineCallbacks
def test_always_one_fsync_per_batch_through_the_broker(tmp_path: Path, fsyncs: list[int]) -> Any:
    store = LogStore(tmp_path, fsync="always")
    clock = Clock()
    broker = Broker(store, clock)
    broker.load((yield store.open()))
    before = len(fsyncs)
    for n in range(1000):
        broker.publish_to_queue(b"q", b"m%d" % n, b"body")
    done = broker.durable()
    clock.advance(0)
    yield done
    assert len(fsyncs) - before == 1
    assert broker.writer.batches == 1 and store.batches == 1
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_interval_fsyncs_on_the_clock_only_when_dirty(tmp_path: Path, fsyncs: list[int]) -> Any:
    clock = Clock()
    store = LogStore(tmp_path, fsync="interval:50", clock=clock)
    yield store.open()
    before = len(fsyncs)
    for n in range(1, 4):
        yield store.apply([(ENQUEUE, message(n))])
    assert len(fsyncs) == before  # acknowledged once written to the kernel
    clock.advance(0.049)
    yield store.drain()
    assert len(fsyncs) == before
    clock.advance(0.001)
    yield store.drain()
    assert len(fsyncs) == before + 1  # three batches, one fsync
    clock.advance(0.5)
    yield store.drain()
    assert len(fsyncs) == before + 1  # nothing new written: no fsync
    yield store.close()
    assert not clock.getDelayedCalls()


@pytest_twisted.inlineCallbacks
def test_never_fsyncs_only_at_close(tmp_path: Path, fsyncs: list[int]) -> Any:
    clock = Clock()
    # no timer at all (a checkpoint fsyncs the log up to its position: test_log_checkpoint)
    store = LogStore(tmp_path, fsync="never", clock=clock, index_at_rest=0, checkpoint="off")
    yield store.open()
    before = len(fsyncs)
    for n in range(1, 4):
        yield store.apply([(ENQUEUE, message(n))])
    clock.advance(10)
    yield store.drain()
    assert len(fsyncs) == before and not clock.getDelayedCalls()
    yield store.close()
    assert len(fsyncs) == before + 1


@pytest_twisted.inlineCallbacks
def test_a_failing_interval_fsync_is_logged_and_stops_writes(
    tmp_path: Path, logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> Any:
    clock = Clock()
    store = LogStore(tmp_path, fsync="interval:10", clock=clock)
    yield store.open()
    yield store.apply([(ENQUEUE, message(1))])

    def broken() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store._files, "fsync_thd", broken)
    clock.advance(0.01)
    yield store.drain()
    assert any("interval fsync failed" in line for line in logged)
    assert store._ticker.running  # the periodic task survived its failure
    with pytest.raises(StoreFailedError, match="Input/output error"):
        yield store.apply([(ENQUEUE, message(2))])
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_a_failed_write_stops_the_store_and_a_restart_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    store = LogStore(tmp_path)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1))])

    def full(data: bytes, sync: bool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store._files, "append_thd", full)
    with pytest.raises(OSError, match="No space left"):
        yield store.apply([(ENQUEUE, message(2))])
    with pytest.raises(StoreFailedError):
        yield store.apply([(ENQUEUE, message(3))])
    yield store.close()
    recovered, _ = yield recover(tmp_path)
    assert seqs(recovered) == [1]


# -- compaction ----------------------------------------------------------------


def disk_use(path: Path) -> int:
    return sum(p.stat().st_size for p in segments(path))


@pytest.mark.parametrize("lookup", [log_compaction.LOOKUP_MESSAGES, 0],
                         ids=["index lookups", "scans"])
@pytest_twisted.inlineCallbacks
def test_compaction_keeps_disk_bounded_under_publish_and_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookup: int
) -> Any:
    """400 rounds of publish 20 + ack the previous 20, with a backlog that never moves.

    Writes about 5 MB in all; the directory must stay within twice the live
    bytes plus a few segments, and everything live must survive the
    rewriting: queue options, bindings, a requeued retry count, PUT records.
    Both ways of finding a head's live messages: in the index, and (an index
    bigger than ``LOOKUP_MESSAGES``) by scanning the head.
    """
    monkeypatch.setattr(log_compaction, "LOOKUP_MESSAGES", lookup)
    segment = 32 * 1024
    store = LogStore(tmp_path, fsync="never", segment_bytes=segment, slice_bytes=8192)
    yield store.open()
    options = QueueOptions(dead_letter=b"dlq", default_ttl=60.0)
    backlog = [message(n, body=b"b" * 300, expires_at=7e9) for n in range(1, 51)]
    requeued = message(60, id=b"m1", body=b"b" * 300, retry=4)
    yield store.apply([(DECLARE, b"q", options), (BIND, b"q", b"ev.*"),
                       (PUT, b"schedules", b"s", b"cron"), *((ENQUEUE, m) for m in backlog),
                       (REQUEUE, requeued, 1)])
    expected = [*backlog[1:], requeued]
    seq, previous, peak, written = 100, [], 0, 0
    for _ in range(400):
        batch = [(ENQUEUE, message(seq + n, body=b"x" * 500)) for n in range(20)]
        written += sum(len(records.encode_op(op)) for op in batch)
        yield store.apply(batch + [(REMOVE, b"q", s) for s in previous])
        previous = [seq + n for n in range(20)]
        seq += 20
        yield store.compaction_idle()
        yield store.drain()
        assert store.disk_bytes() == disk_use(tmp_path)
        peak = max(peak, disk_use(tmp_path))
    bound = 2 * store.live_bytes() + 3 * segment
    assert peak <= bound < written / 10
    assert store.segments_deleted > 50 and store.records_copied > 50
    assert store.max_slice_seconds < 0.05
    yield store.close()
    recovered, _ = yield recover(tmp_path)
    queue = recovered.queues[b"q"]
    assert [m.as_tuple() for m in queue.messages[: len(expected)]] == [
        m.as_tuple() for m in expected
    ]
    assert [m.seq for m in queue.messages[len(expected):]] == previous
    assert queue.options == options and queue.bindings == {b"ev.*"}
    assert recovered.records == {b"schedules": {b"s": b"cron"}}


def head_scans(monkeypatch: pytest.MonkeyPatch, store: LogStore) -> list[int]:
    """The segments ``store``'s compaction scans (``scan_thd`` calls)."""
    scans: list[int] = []
    scan = store._files.scan_thd

    def counted(number: int, offset: int, budget: int) -> Any:
        scans.append(number)
        return scan(number, offset, budget)

    monkeypatch.setattr(store._files, "scan_thd", counted)
    return scans


@inlineCallbacks
def churn(store: LogStore, seq: int, segments_deleted: int) -> Any:
    """Publish 50 messages from ``seq`` on and ack them, again and again, until
    compaction has deleted ``segments_deleted`` segments."""
    while store.segments_deleted < segments_deleted:
        batch = [message(seq + n, body=b"x" * 200) for n in range(50)]
        yield store.apply([(ENQUEUE, m) for m in batch])
        yield store.apply([(REMOVE, b"q", m.seq) for m in batch])
        seq += 50
        yield store.compaction_idle()


@pytest_twisted.inlineCallbacks
def test_a_mostly_dead_head_is_compacted_from_the_index_without_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """A head whose only live records are a DECLARE, a BIND, a PUT and two
    unacked messages among thousands of acked ones: they are read where the
    index says and copied, the head goes, and nothing is scanned."""
    segment = 64 * 1024
    store = LogStore(tmp_path, fsync="never", segment_bytes=segment)
    scans = head_scans(monkeypatch, store)
    yield store.open()
    options = QueueOptions(default_ttl=60.0)
    yield store.apply([(DECLARE, b"q", options), (BIND, b"q", b"ev"),
                       (PUT, b"schedules", b"s", b"cron"), (ENQUEUE, message(1, body=b"old")),
                       (ENQUEUE, message(2, id=b"two", retry=3))])
    yield churn(store, 3, segments_deleted=3)
    yield store.drain()
    assert scans == []
    assert store.records_copied >= 5
    assert store.disk_bytes() == disk_use(tmp_path) < 3 * segment
    yield store.close()
    recovered, _ = yield recover(tmp_path)
    queue = recovered.queues[b"q"]
    assert [m.as_tuple() for m in queue.messages] == [
        message(1, body=b"old").as_tuple(), message(2, id=b"two", retry=3).as_tuple()]
    assert queue.options == options and queue.bindings == {b"ev"}
    assert recovered.records == {b"schedules": {b"s": b"cron"}}


@pytest_twisted.inlineCallbacks
def test_an_archived_backlog_in_the_head_is_looked_up_a_run_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """300 live messages archived as a run cost one step of the walk, not 300:
    the head is not scanned, and the copies are a run per slice copied."""
    monkeypatch.setattr(log_compaction, "LOOKUP_MESSAGES", 20)
    store = LogStore(tmp_path, fsync="never", segment_bytes=64 * 1024)
    scans = head_scans(monkeypatch, store)
    yield store.open()
    backlog = [message(n, queue=b"b", body=b"%03d" % n * 30) for n in range(1, 301)]
    yield store.apply([(DECLARE, b"q", QueueOptions()), *((ENQUEUE, m) for m in backlog)])
    by_seq = store._index.messages[b"b"]
    by_seq.archive()
    yield churn(store, 301, segments_deleted=1)
    assert scans == [] and store.records_copied >= 300
    runs = [count for count in by_seq.counts[by_seq.first:] if count]
    assert sum(runs) == 300 and len(runs) <= 3
    yield store.close()
    recovered, _ = yield recover(tmp_path)
    assert [m.as_tuple() for m in recovered.queues[b"b"].messages] == \
        [m.as_tuple() for m in backlog]


@pytest_twisted.inlineCallbacks
def test_a_head_with_live_messages_in_a_big_index_is_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """Past ``LOOKUP_MESSAGES`` live messages, walking the index would cost more
    than a scan: the head with a live message is scanned, and it still goes."""
    monkeypatch.setattr(log_compaction, "LOOKUP_MESSAGES", 1)
    segment = 64 * 1024
    store = LogStore(tmp_path, fsync="never", segment_bytes=segment)
    scans = head_scans(monkeypatch, store)
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(1)),
                       (ENQUEUE, message(2))])
    yield churn(store, 3, segments_deleted=1)
    assert scans and set(scans) == {scans[0]}
    yield store.close()
    recovered, _ = yield recover(tmp_path)
    assert seqs(recovered) == [1, 2]


@pytest_twisted.inlineCallbacks
def test_dead_segments_of_earlier_runs_are_deleted_at_open(tmp_path: Path) -> Any:
    for n in range(1, 6):
        yield write(tmp_path, [(DECLARE, b"q", QueueOptions()), (ENQUEUE, message(n))],
                    [(REMOVE, b"q", n)])
    store = LogStore(tmp_path)
    recovered = yield store.open()
    yield store.compaction_idle()
    yield store.drain()
    assert len(segments(tmp_path)) <= 2  # the one with the live DECLARE, the new one
    assert recovered.next_seq == 6
    yield store.close()


@pytest_twisted.inlineCallbacks
def test_fsync_time_is_published_for_metrics(tmp_path):
    store = LogStore(tmp_path / "log", fsync="always")
    yield store.open()
    yield store.apply([(DECLARE, b"q", QueueOptions())])
    metrics = store.metrics()
    yield store.close()
    assert metrics["fsyncs_total"] >= 1
    assert metrics["fsync_seconds_total"] >= metrics["last_fsync_seconds"] > 0


@pytest_twisted.inlineCallbacks
def test_an_index_at_rest_moves_to_its_arrays_and_recovers_the_same(tmp_path: Path) -> Any:
    clock = Clock()
    store = LogStore(tmp_path, fsync="never", clock=clock)
    yield store.open()
    store._at_rest.least, store._at_rest.quiet = 4, 2
    yield store.apply([(ENQUEUE, message(n)) for n in range(1, 11)])
    clock.advance(1.0)
    clock.advance(1.0)  # the second look: nothing moved, it is at rest
    by_seq = store._index.messages[b"q"]
    assert not by_seq and [seq for seq, _ in by_seq.archived()] == list(range(1, 11))
    yield store.apply([(REMOVE, b"q", 3), (ENQUEUE, message(11))])
    live = store.live_bytes()
    yield store.close()
    again = LogStore(tmp_path, fsync="never", clock=Clock())
    recovered = yield again.open()
    try:
        assert [m.seq for m in recovered.queues[b"q"].messages] == [1, 2, *range(4, 12)]
        assert again.live_bytes() == live
    finally:
        yield again.close()
