"""Snapshot chunks read when needed: counted at the open, read and checked later.

A read touches the header, the store's section and the state alone (and any
chunk holding TTLs); a chunk's damage is then found by its ``check``, which
a broker runs before it reads any message of the queue, and a read error is
one more way of being damaged.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqserver.broker.ready import PackedReady
from mqserver.model import Message, QueueOptions, Recovered, RecoveredQueue
from mqserver.packed import Backlog, check_thd
from mqserver.storage import snapshot
from mqserver.storage.snapshot import SnapshotError
from mqserver.storage.snapshot_chunks import LazyChunk

SIZE = 4


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(Backlog, "chunk_size", SIZE)


def _messages(count: int, ttl_at: int | None = None) -> list[Message]:
    return [Message(b"m%d" % seq, b"q", b"body %04d" % seq, seq, b"ev", None, 1.5,
                    99.0 if seq == ttl_at else None, 0, "mqks") for seq in range(1, count + 1)]


def _write(tmp_path: Path, messages: list[Message]) -> Path:
    recovered = Recovered({b"q": RecoveredQueue(b"q", QueueOptions(), {b"ev"},
                                                Backlog(messages))}, len(messages) + 1)
    path = tmp_path / snapshot.FILENAME
    snapshot.write(path, recovered, 7)
    return path


def _flip(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(needle)] ^= 0x01
    path.write_bytes(bytes(data))


def _chunks(saved: snapshot.Snapshot) -> list:
    return saved.recovered.queues[b"q"].messages.chunks


def test_a_read_counts_the_chunks_without_reading_them(tmp_path):
    path = _write(tmp_path, _messages(10))
    _flip(path, b"body 0006")  # in the second chunk
    saved = snapshot.read(path, 7)
    backlog = saved.recovered.queues[b"q"].messages
    assert len(backlog) == 10
    assert [type(chunk) for chunk in backlog.chunks] == [LazyChunk] * 3
    assert all(chunk.unchecked for chunk in backlog.chunks)
    first, second, third = backlog.chunks
    assert first.check() is None and third.check() is None
    assert second.check() == "it fails its checksum"
    assert second.seq_range == (5, 8) and "4 messages of queue b'q' (seqs 5 to 8)" in \
        second.describe()
    assert [m.seq for m in first.unpack()] == [1, 2, 3, 4]
    with pytest.raises(SnapshotError, match="fails its checksum"):
        second.unpack()  # never reached by a broker: it settles first


def test_a_chunk_with_ttls_is_read_at_the_open(tmp_path):
    path = _write(tmp_path, _messages(10, ttl_at=6))
    saved = snapshot.read(path, 7)
    first, second, third = _chunks(saved)
    assert type(second) is not LazyChunk and second.first_expiry == 99.0
    assert (type(first), type(third)) == (LazyChunk, LazyChunk)
    _flip(path, b"body 0006")
    with pytest.raises(SnapshotError, match="fails its checksum"):
        snapshot.read(path, 7)


def test_a_chunk_is_read_from_the_open_file_after_it_is_unlinked(tmp_path):
    path = _write(tmp_path, _messages(10))
    saved = snapshot.read(path, 7)
    snapshot.discard(path)
    assert list(saved.recovered.queues[b"q"].messages) == _messages(10)


def test_a_read_error_makes_the_chunk_damaged(tmp_path):
    path = _write(tmp_path, _messages(10))
    saved = snapshot.read(path, 7)
    with open(path, "r+b") as f:  # only a writer by hand could: the file is unlinked
        f.truncate(100)
    assert all("cannot be read" in chunk.check() for chunk in _chunks(saved))


def test_checked_chunks_let_go_of_the_file_and_parsed_ones_share_values(tmp_path):
    path = _write(tmp_path, _messages(10))
    saved = snapshot.read(path, 7)
    chunks = _chunks(saved)
    fd = chunks[0]._file.fd
    os.fstat(fd)
    check_thd(chunks)
    assert all(chunk._file is None for chunk in chunks)
    with pytest.raises(OSError):  # the last reference gone, the descriptor is closed
        os.fstat(fd)
    for chunk in chunks:
        chunk.unpack()
    assert all(chunk.queues is saved.recovered.queues[b"q"].name for chunk in chunks)
    assert chunks[0].events is chunks[1].events  # interned, as share_recovered_values does


def test_checks_from_two_threads_agree(tmp_path):
    path = _write(tmp_path, _messages(400))
    _flip(path, b"body 0203")
    saved = snapshot.read(path, 7)
    chunks = _chunks(saved)
    thread = threading.Thread(target=check_thd, args=(chunks,))
    thread.start()
    check_thd(reversed(chunks))
    thread.join()
    damaged = [chunk.seq_range for chunk in chunks if chunk.check() is not None]
    assert damaged == [(201, 204)]
    messages = [m for chunk in chunks if chunk.check() is None for m in chunk.unpack()]
    assert [m.seq for m in messages] == [*range(1, 201), *range(205, 401)]


def test_a_packed_ready_settles_before_its_first_read(tmp_path):
    path = _write(tmp_path, _messages(10))
    _flip(path, b"body 0001")  # the first chunk: the very first pop would read it
    saved = snapshot.read(path, 7)
    withheld = []
    ready = PackedReady.of_backlog(saved.recovered.queues[b"q"].messages, SIZE,
                                   on_withheld=withheld.extend)
    assert len(ready) == 10 and ready.unsettled  # counted at once, nothing read
    assert ready  # asking whether any is ready checks the front until a sound chunk
    assert [chunk.seq_range for chunk in withheld] == [(1, 4)]
    assert len(ready) == 6 and ready.unsettled, "the chunks behind it wait for the thread"
    assert [ready.popleft().seq for _ in range(6)] == [*range(5, 11)]
    assert not ready


def test_a_first_delivery_reads_the_front_chunk_alone(tmp_path):
    """A consumer that comes before the broker's thread checked the chunks waits
    for one chunk, not for the whole backlog."""
    path = _write(tmp_path, _messages(12))
    saved = snapshot.read(path, 7)
    ready = PackedReady.of_backlog(saved.recovered.queues[b"q"].messages, SIZE)
    assert ready and ready[0].seq == 1 and ready.popleft().seq == 1
    assert [chunk.unchecked for chunk in ready.chunks] == [True, True]
    assert ready[-1].seq == 12, "any other lookup settles the whole queue"
    assert not ready.unsettled and not any(chunk.unchecked for chunk in ready.chunks)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(1, 30), flips=st.sets(st.integers(1, 30), max_size=3),
       op=st.sampled_from(["popleft", "index", "iter", "insert", "pack_tail", "unpacked"]))
def test_whatever_reads_first_sees_only_sound_messages(tmp_path, count, flips, op):
    """Each operation that reads a message settles first: what it sees is exactly
    the sound chunks' messages, in order, and the count agrees."""
    path = _write(tmp_path, _messages(count))
    for seq in flips & set(range(1, count + 1)):
        _flip(path, b"body %04d" % seq)
    saved = snapshot.read(path, 7)
    withheld = []
    ready = PackedReady.of_backlog(saved.recovered.queues[b"q"].messages, SIZE,
                                   on_withheld=withheld.extend)
    assert len(ready) == count
    damaged = {(seq - 1) // SIZE for seq in flips if seq <= count}
    sound = [m.seq for m in _messages(count) if (m.seq - 1) // SIZE not in damaged]
    if op == "popleft":
        got = [ready.popleft().seq for _ in range(len(sound))] if sound else []
        assert not ready
    elif op == "index":
        got = [ready[i].seq for i in range(len(sound))] if sound else []
        with pytest.raises(IndexError):
            ready[len(sound)]
    elif op == "iter":
        got = [m.seq for m in ready]
    elif op == "insert":
        ready.insert(0, Message(b"x", b"q", b"", 0))
        got = [m.seq for m in ready][1:]
    elif op == "pack_tail":
        ready.pack_tail(1, [])
        got = [m.seq for m in ready]
    else:
        got = [m.seq for m in ready.unpacked()]
    assert got == sound
    assert sorted(seq for chunk in withheld for seq in range(chunk.seq_range[0],
                                                             chunk.seq_range[1] + 1)) == \
        [seq for seq in range(1, count + 1) if (seq - 1) // SIZE in damaged]


def test_a_chunk_never_parsed_is_written_again_as_it_was_read(tmp_path):
    """A restart then a stop with a backlog nobody read: the next snapshot copies
    each checked section (no parse, no encoding); a parsed one is encoded anew."""
    path = _write(tmp_path, _messages(10))
    first = path.read_bytes()
    saved = snapshot.read(path, 7)
    chunks = _chunks(saved)
    chunks[1].unpack()
    again = tmp_path / "again"
    snapshot.write(again, saved.recovered, 7)
    assert again.read_bytes() == first  # the same chunks, state and header
    assert chunks[0]._raw is not None and chunks[2]._raw is not None  # still unparsed
    assert list(snapshot.read(again, 7).recovered.queues[b"q"].messages) == _messages(10)


def test_a_damaged_chunk_fails_the_next_snapshot(tmp_path):
    path = _write(tmp_path, _messages(10))
    _flip(path, b"body 0006")
    saved = snapshot.read(path, 7)
    with pytest.raises(SnapshotError, match="fails its checksum"):
        snapshot.write(tmp_path / "again", saved.recovered, 7)
