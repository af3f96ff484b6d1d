"""The log store's one-pass batch encoder against the general path it inlines.

``log_batch.encode_batch`` must write exactly the bytes of
``frame(encode_op(op))`` per op and leave the index exactly where
``LogIndex.apply_op`` per op leaves it: anything else would be a format
change or an index that disagrees with what recovery rebuilds.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st

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
    Message,
    QueueOptions,
)
from mqserver.storage import log_records as records
from mqserver.storage.errors import StoreFailedError
from mqserver.storage.log import LogStore
from mqserver.storage.log_batch import encode_batch
from mqserver.storage.log_index import LogIndex, loc
from mqserver.testing import message

QUEUES = st.sampled_from([b"q", b"other", b""])
SEQS = st.integers(1, 40)


@st.composite
def messages(draw: Any) -> Message:
    """Plain messages (the inline path) and ones with every optional field (the general one)."""
    plain = draw(st.booleans())
    return Message(
        draw(st.binary(max_size=40)), draw(QUEUES),
        # up to past 4 KiB, where a frame's CRC seed is not in the table
        draw(st.sampled_from([b"", b"x" * 100, b"y" * 4100]) | st.binary(max_size=300)),
        draw(SEQS),
        None if plain else draw(st.none() | st.binary(max_size=10)),
        None if plain else draw(st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3))),
        draw(st.floats(allow_nan=False, allow_infinity=False)),
        None if plain else draw(st.none() | st.floats(0, 1e10)),
        draw(st.integers(0, 2**32 - 1)),
        None if plain else draw(st.none() | st.text(max_size=5)),
    )


OPS = st.one_of(
    st.tuples(st.just(ENQUEUE), messages()),
    st.tuples(st.just(ENQUEUE), messages()),
    st.tuples(st.just(REMOVE), QUEUES, SEQS),
    st.tuples(st.just(REMOVE), QUEUES, SEQS),
    st.tuples(st.just(REQUEUE), messages(), SEQS),
    st.tuples(st.just(DECLARE), QUEUES, st.just(QueueOptions(max_length=5))),
    st.tuples(st.just(BIND), QUEUES, st.sampled_from([b"a", b"b.*"])),
    st.tuples(st.just(UNBIND), QUEUES, st.sampled_from([b"a", b"b.*"])),
    st.tuples(st.just(DELETE_QUEUE), QUEUES),
    st.tuples(st.just(PUT), st.just(b"ns"), st.sampled_from([b"k", b"l"]), st.binary(max_size=9)),
    st.tuples(st.just(DELETE), st.just(b"ns"), st.sampled_from([b"k", b"l"])),
)


def general(ops: list[tuple[Any, ...]], index: LogIndex, segment: int, start: int,
            next_seq: int) -> tuple[bytes, int]:
    """The general path, one op at a time: what ``encode_batch`` must equal."""
    frames, offset = [], start
    for op in ops:
        data = records.frame(records.encode_op(op))
        index.apply_op(op, loc(segment, offset, len(data)))
        if op[0] in (ENQUEUE, REQUEUE):
            next_seq = max(next_seq, op[1].seq + 1, op[2] + 1 if op[0] == REQUEUE else 0)
        frames.append(data)
        offset += len(data)
    return b"".join(frames), next_seq


def state(index: LogIndex) -> tuple[Any, ...]:
    """Everything the index holds; a segment at 0 live bytes is the same as none."""
    live = {segment: size for segment, size in index.live.items() if size}
    return (index.messages, index.declares, index.bindings, index.records, live, index.live_total,
            index.ttl_seq)


def filled(earlier: list[tuple[Any, ...]]) -> LogIndex:
    """An index that already holds ``earlier``'s records, in segment 1."""
    index = LogIndex()
    general(earlier, index, 1, records.HEADER_SIZE, 1)
    return index


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=8), st.lists(OPS, max_size=25), st.integers(1, 60))
def test_a_batch_is_the_general_paths_bytes_and_index(earlier, ops, next_seq):
    """The earlier ops put records in segment 1, so the batch (in segment 2)
    removes and overwrites records of another segment too."""
    inline, reference = filled(earlier), filled(earlier)
    parts, inline_next = encode_batch(ops, inline, 2, 100, next_seq)
    data, reference_next = general(ops, reference, 2, 100, next_seq)
    assert b"".join(parts) == data
    assert inline_next == reference_next
    assert state(inline) == state(reference)


@given(messages(), st.integers(0, 2**64 - 1))
def test_message_payloads_are_the_documented_struct(message, old_seq):
    """encode_message against the layout spelled out field by field."""
    expires, event, headers, source = (message.expires_at, message.event, message.headers,
                                       message.source)
    flags = ((expires is not None) | (event is not None) << 1 | (headers is not None) << 2
             | (source is not None) << 3)
    header_bytes = b"" if headers is None else records.json.dumps(
        headers, separators=(",", ":")).encode()
    source_bytes = b"" if source is None else source.encode()
    fields = (message.queue, message.id, event or b"", header_bytes, source_bytes, message.body)
    head = struct.pack(">QddIBIIIIII", message.seq, message.created_at, expires or 0.0,
                       message.retry, flags, *map(len, fields))
    assert records.encode_op((ENQUEUE, message)) == b"\x01" + head + b"".join(fields)
    assert records.encode_op((REQUEUE, message, old_seq)) == (
        b"\x02" + struct.pack(">Q", old_seq) + head + b"".join(fields)
    )
    assert records.decode(records.encode_op((REQUEUE, message, old_seq))) == (
        REQUEUE, message, old_seq)


def test_plain_messages_take_the_inline_path_to_the_same_record():
    """A hand-made case of the property above, readable when it fails."""
    ops = [(ENQUEUE, message(7, body=b"x" * 100)), (REMOVE, b"q", 7)]
    parts, next_seq = encode_batch(ops, LogIndex(), 3, 32, 1)
    assert parts == [piece for op in ops for piece in (
        records.frame(records.encode_op(op))[:records.FRAME_SIZE], records.encode_op(op))]
    assert next_seq == 8


@pytest_twisted.inlineCallbacks
def test_an_op_that_does_not_encode_stops_the_store(tmp_path: Path) -> Any:
    """Its batch fails, later ones are refused, and a restart recovers what was written."""
    store = LogStore(tmp_path)
    yield store.open()
    yield store.apply([(ENQUEUE, message(1))])
    with pytest.raises(TypeError):
        yield store.apply([(ENQUEUE, message(2)), (ENQUEUE, message(3, body="not bytes"))])
    with pytest.raises(StoreFailedError):
        yield store.apply([(ENQUEUE, message(4))])
    yield store.close()
    store = LogStore(tmp_path)
    recovered = yield store.open()
    yield store.close()
    assert [m.seq for m in recovered.queues[b"q"].messages] == [1]
