"""A log replay's chunks decoded when needed (``log_chunks``): counted at once, decoded by
``check`` (in any thread), read as ordinary chunks after; one that does not decode is
withheld by the broker's queue before anything reads it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from mqserver.broker.ready import PackedReady
from mqserver.model import ENQUEUE, Message
from mqserver.packed import Backlog, Chunk
from mqserver.storage import log_records as records
from mqserver.storage.log import LogStore
from mqserver.storage.log_chunks import ReplayChunk, any_expiry
from mqserver.storage.log_index import loc
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


def test_any_expiry_reads_the_flags_of_enqueue_and_requeue_records():
    """Each record alone, in two segments: only one with an expiry time says so."""
    frames = [records.frame(records.encode_message(records.K_ENQUEUE, message(1))),
              records.frame(records.encode_message(records.K_REQUEUE, message(2, retry=1), 1)),
              records.frame(records.encode_message(records.K_ENQUEUE,
                                                   message(3, expires_at=9e9))),
              records.frame(records.encode_message(records.K_REQUEUE,
                                                   message(4, expires_at=9e9), 3))]
    segments, locations = {}, []
    for number, frame in enumerate(frames, start=1):
        segments[number] = bytes(7) + frame
        locations.append(loc(number, 7, len(frame)))
    assert [any_expiry(segments, [location]) for location in locations] == [
        False, False, True, True]
    assert not any_expiry(segments, locations[:2]) and any_expiry(segments, locations)
