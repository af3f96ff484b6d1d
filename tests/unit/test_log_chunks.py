"""A log replay's chunks decoded when needed (``log_chunks``): counted at once, decoded by
``check`` (in any thread), read as ordinary chunks after; one that does not decode is
withheld by the broker's queue before anything reads it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st

from mqserver.broker.ready import PackedReady
from mqserver.model import ENQUEUE, Message
from mqserver.packed import Backlog, Chunk
from mqserver.storage import log_records as records
from mqserver.storage.log import LogStore
from mqserver.storage.log_chunks import ReplayChunk, any_within, expiring_seqs, head_at
from mqserver.storage.log_index import loc
from mqserver.storage.log_seq_index import SeqIndex
from mqserver.testing import message

SIZE = 4


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Backlog, "chunk_size", SIZE)


def sent(count: int, **fields: Any) -> list[Message]:
    return [message(seq, event=b"e", source="mqks", **fields) for seq in range(1, count + 1)]


@pytest_twisted.inlineCallbacks
def replayed(path: Path, messages: list[Message], damage: int | None = None) -> Any:
    """What a crash restart recovers of ``messages`` (written, the store not closed
    cleanly); with ``damage``, that message's record is made one that passes its
    checksum but does not decode (its body length off by one)."""
    store = LogStore(path)
    yield store.open()
    yield store.apply([(ENQUEUE, m) for m in messages])
    yield store.close()
    if damage is not None:
        [segment] = [p for p in sorted(path.glob("*.seg")) if p.stat().st_size > 100]
        data = bytearray(segment.read_bytes())
        for offset, size, payload in records.iter_frames(bytes(data), records.HEADER_SIZE,
                                                         len(data)):
            if payload[0] == records.K_ENQUEUE and records.message_key(payload)[1] == damage:
                payload = bytearray(payload)
                at = 1 + records.MESSAGE_HEAD.size - 4  # the body's length, last of the head
                payload[at:at + 4] = (int.from_bytes(payload[at:at + 4], "big") + 1).to_bytes(
                    4, "big")
                data[offset:offset + size] = records.frame(bytes(payload))
        segment.write_bytes(bytes(data))
    store = LogStore(path)
    recovered = yield store.open()
    yield store.close()
    return recovered.queues[b"q"].messages


@pytest_twisted.inlineCallbacks
def test_a_replay_counts_its_chunks_and_decodes_them_when_checked(tmp_path: Path) -> Any:
    messages = sent(10)
    backlog = yield replayed(tmp_path, messages)
    chunks = backlog.chunks
    assert [type(chunk) for chunk in chunks] == [ReplayChunk, ReplayChunk]
    assert len(backlog) == 10 and len(backlog.tail) == 2
    assert all(chunk.unchecked for chunk in chunks)
    assert [chunk.seq_range for chunk in chunks] == [(1, 4), (5, 8)]
    checks = [threading.Thread(target=chunk.check) for chunk in chunks]
    for thread in checks:
        thread.start()
    for thread in checks:
        thread.join()
    assert not any(chunk.unchecked for chunk in chunks)
    assert list(backlog) == messages
    first = chunks[0]
    assert first.events == b"e" and first.sources == "mqks" and first.queues == b"q"


@pytest_twisted.inlineCallbacks
def test_a_chunk_is_decoded_at_its_first_read_unchecked(tmp_path: Path) -> Any:
    messages = sent(8)
    backlog = yield replayed(tmp_path, messages)
    second = backlog.chunks[1]
    assert second.unchecked and second.message(0) == messages[4]
    assert not second.unchecked and second.unpack() == messages[4:]


@pytest_twisted.inlineCallbacks
def test_a_chunk_with_a_ttl_is_decoded_at_the_replay(tmp_path: Path) -> Any:
    messages = sent(8)
    messages[5].expires_at = 5000.0
    backlog = yield replayed(tmp_path, messages)
    first, second = backlog.chunks
    assert type(first) is ReplayChunk and type(second) is Chunk
    assert second.first_expiry == 5000.0
    assert list(backlog) == messages


@pytest_twisted.inlineCallbacks
def test_a_chunk_that_does_not_decode_is_withheld_before_it_is_read(tmp_path: Path) -> Any:
    messages = sent(12)
    backlog = yield replayed(tmp_path, messages, damage=6)
    damaged = backlog.chunks[1]
    assert damaged.check() is not None and damaged.check().startswith("a message does not")
    assert "seqs 5 to 8" in damaged.describe()
    with pytest.raises(records.FormatError):
        damaged.unpack()
    withheld: list[Chunk] = []
    ready = PackedReady.of_backlog(backlog, SIZE, on_withheld=withheld.extend)
    assert ready.unsettled and len(ready) == 12
    assert ready  # asking whether any is ready checks the front chunk alone
    assert withheld == [] and len(ready) == 12
    assert [ready.popleft().seq for _ in range(4)] == [1, 2, 3, 4]
    assert ready  # the front is now the damaged chunk: set aside, the next one read
    assert withheld == [damaged] and len(ready) == 4
    assert [m.seq for m in ready] == [9, 10, 11, 12]



@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1,
                max_size=30),
       st.sets(st.integers(1, 30)), st.integers(0, 30), st.integers(1, 31), st.integers(0, 31))
def test_expiring_seqs_reads_runs_and_single_entries(frames, removed, fresh, plain_from, plain_to):
    """Frames one after the other (ENQUEUE or REQUEUE, with a TTL or not, ids of
    one or two lengths: runs, and kinds mixed within a size), archived but for
    the last ``fresh``, some removed (holes, ends): the seqs with a TTL are
    those whose flags byte says so, but for those ``plain`` (known to have no
    TTL, as a checkpoint knows them): their flags are not read."""
    plain = range(plain_from, plain_to)
    data, by_seq = bytes(5), SeqIndex()
    for seq, (requeue, ttl, long_id) in enumerate(frames, start=1):
        kind = records.K_REQUEUE if requeue else records.K_ENQUEUE
        frame = records.frame(records.encode_message(
            kind, message(seq, id=b"m%03d" % seq + (b"xxxxxxxx" if long_id else b""),
                          expires_at=9e9 if ttl else None), 1))
        by_seq[seq] = loc(3, len(data), len(frame))
        data += frame
        if seq == len(frames) - fresh:
            by_seq.archive()
    for seq in removed:
        if by_seq.pop(seq, None) is None and seq <= by_seq.last:
            by_seq.take(seq)
    expected = [seq for seq, location in by_seq.everything()
                if data[head_at(data, location)[0] + 28] & 1 and seq not in plain]
    found = expiring_seqs({3: data}, by_seq, plain)
    assert found == expected
    assert any_within(found, 1, len(frames)) == bool(expected)
    for seq in expected:
        assert any_within(found, seq, seq) and any_within(found, seq - 1, seq + 2)
