"""The snapshot codec: what it writes reads back exactly, and anything else is refused.

Round trips of drawn states (every message field, queue option, binding and
record, chunks of every shape); truncated, corrupted and forged files raise
``SnapshotError`` before anything large is allocated, or, for a chunk read
when needed (``snapshot_chunks``), make its ``check`` say why.
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqserver.durability import recovered_state
from mqserver.model import Message, QueueOptions, Recovered, RecoveredQueue
from mqserver.packed import Backlog
from mqserver.storage import snapshot
from mqserver.storage.snapshot import HEADER_SIZE, MAGIC, SnapshotError

names = st.sampled_from([b"q", b"q2", b"dlq", b"\x00\xff"])
optional_bytes = st.none() | st.binary(max_size=6)
texts = st.none() | st.sampled_from(["mqks", "phpmq", "x\udc80"])
headers = st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)
options = st.builds(
    QueueOptions,
    delete_when_unused=st.none() | st.floats(0, 100),
    delete_when_unused_bare=st.booleans(),
    dead_letter=st.none() | names,
    max_length=st.none() | st.integers(0, 1 << 40),
    default_ttl=st.none() | st.floats(0, 1e6),
    overflow=st.sampled_from([None, "drop-head", "reject-publish"]),
)
fields = st.tuples(
    st.binary(max_size=8), st.binary(max_size=20), optional_bytes, headers,
    st.floats(0, 2e9), st.none() | st.floats(0, 2e9), st.integers(0, 5), texts,
)


@st.composite
def states(draw: st.DrawFn) -> Recovered:
    """A state with queues of messages in seq order (gaps and runs), as lists or
    backlogs whose chunks are consecutive runs or not, sharing values or not."""
    recovered = Recovered(next_seq=1, records=draw(st.dictionaries(
        st.binary(max_size=3), st.dictionaries(st.binary(max_size=3), st.binary(max_size=5),
                                               max_size=3), max_size=2)))
    seq = 1
    for name in draw(st.lists(names, unique=True, max_size=3)):
        messages = []
        shared = draw(st.booleans())
        for values in draw(st.lists(fields, max_size=12)):
            seq += draw(st.sampled_from([1, 1, 1, 7]))
            mid, body, event, head, created, expires, retry, source = values
            if shared:
                event, head, source, retry = b"ev", None, "mqks", 0
            messages.append(Message(mid, name, body, seq, event, head, created, expires,
                                    retry, source))
        as_backlog = draw(st.booleans())
        recovered.queues[name] = RecoveredQueue(
            name, draw(options), set(draw(st.lists(st.binary(max_size=4), max_size=3))),
            Backlog(messages) if as_backlog else messages)
    recovered.next_seq = seq + draw(st.integers(1, 3))
    return recovered


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(Backlog, "chunk_size", 3)


def _write(tmp_path: Path, recovered: Recovered, token: int = 7, extra: bytes = b"") -> Path:
    path = tmp_path / snapshot.FILENAME
    snapshot.write(path, recovered, token, extra)
    return path


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recovered=states(), extra=st.binary(max_size=20))
def test_what_is_written_reads_back_exactly(tmp_path, recovered, extra):
    path = _write(tmp_path, recovered, 12345, extra)
    saved = snapshot.read(path, 12345)
    assert saved.token == 12345 and saved.extra == extra
    assert recovered_state(saved.recovered) == recovered_state(recovered)
    assert saved.recovered.next_seq == recovered.next_seq
    for rq in saved.recovered.queues.values():  # packed, never a list of messages
        assert isinstance(rq.messages, Backlog) and not rq.messages.tail


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recovered=states(), parsed=st.sets(st.integers(0, 20)))
def test_a_snapshot_read_then_written_again_reads_back_exactly(tmp_path, recovered, parsed):
    """A restart then a stop: the chunks read (``parsed``) are encoded anew, the
    others copied as they were read; the next start gets the same state."""
    saved = snapshot.read(_write(tmp_path, recovered, 5), 5)
    chunks = [chunk for rq in saved.recovered.queues.values() for chunk in rq.messages.chunks]
    for n in parsed & set(range(len(chunks))):
        chunks[n].unpack()
    again = tmp_path / "again"
    snapshot.write(again, saved.recovered, 6)
    assert recovered_state(snapshot.read(again, 6).recovered) == recovered_state(recovered)


def _read_all(path: Path, token: int | None = 7) -> snapshot.Snapshot:
    """``snapshot.read``, then every chunk checked and read: what a broker does
    before it delivers (``PackedReady.settle``); damage found late raises too."""
    saved = snapshot.read(path, token)
    for rq in saved.recovered.queues.values():
        for chunk in rq.messages.chunks:
            problem = chunk.check()
            if problem is not None:
                raise SnapshotError(problem)
            chunk.unpack()
    return saved


def _example(tmp_path: Path) -> tuple[Path, bytes]:
    messages = [Message(b"m%d" % seq, b"q", b"body %d" % seq, seq, b"ev",
                        {"k": "v"} if seq % 2 else None, 1.5, 9.0 if seq == 3 else None,
                        seq % 3, "mqks") for seq in range(1, 8)]
    recovered = Recovered({b"q": RecoveredQueue(b"q", QueueOptions(max_length=9), {b"ev"},
                                                Backlog(messages))}, 8, {b"ns": {b"k": b"v"}})
    path = _write(tmp_path, recovered, extra=b"store")
    return path, path.read_bytes()


def test_every_truncation_is_refused(tmp_path):
    path, data = _example(tmp_path)
    for size in range(len(data)):
        path.write_bytes(data[:size])
        with pytest.raises(SnapshotError):
            _read_all(path)


def test_every_flipped_byte_is_refused(tmp_path):
    path, data = _example(tmp_path)
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x10
        path.write_bytes(bytes(damaged))
        with pytest.raises(SnapshotError):
            _read_all(path)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recovered=states(), cut=st.floats(0, 1, exclude_max=True),
       flip=st.none() | st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)))
def test_damage_anywhere_is_a_clear_error_in_bounded_memory(tmp_path, recovered, cut, flip):
    """A drawn state cut short at a drawn byte, or with a drawn byte changed:
    ``SnapshotError``, never another exception, and never more memory than the
    file's size over again."""
    path = _write(tmp_path, recovered)
    data = bytearray(path.read_bytes())
    if flip is None:
        data = data[:int(cut * len(data))]
    else:
        data[int(flip[0] * len(data))] ^= flip[1]
    path.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotError):
            _read_all(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(data) + (64 << 10)


def test_a_stale_token_is_refused_before_the_body_is_read(tmp_path):
    path, data = _example(tmp_path)
    path.write_bytes(data[:HEADER_SIZE])  # no body at all: the token is checked first
    with pytest.raises(SnapshotError, match="stale"):
        snapshot.read(path, 8)


def test_the_store_refuses_its_section_before_the_messages_are_read(tmp_path):
    path, _ = _example(tmp_path)

    def refuse(section):
        assert section.rest() == b"store"
        raise SnapshotError("stale: files changed")

    with pytest.raises(SnapshotError, match="files changed"):
        snapshot.read(path, 7, refuse)


def test_foreign_files_are_refused(tmp_path):
    path = tmp_path / "x"
    for data in (b"", b"hello", b"SQLite format 3\x00" + bytes(100), MAGIC + bytes(40)):
        path.write_bytes(data)
        with pytest.raises(SnapshotError):
            snapshot.read(path)


def _forged(body: bytes, sections: int = 3, state_at: int | None = None) -> bytes:
    """A header that checks, with ``body`` after it (the state after the store's
    section, unless ``state_at`` says otherwise)."""
    if state_at is None:
        state_at = HEADER_SIZE + 12 + struct.unpack_from("<Q", body)[0]
    header = struct.pack("<8sHHIQQQ", MAGIC, snapshot.VERSION, snapshot._FLAGS, sections, 7,
                         len(body), state_at)
    return header + struct.pack("<I", zlib.crc32(header)) + body


def _section(payload: bytes) -> bytes:
    return struct.pack("<QI", len(payload), zlib.crc32(payload)) + payload


@pytest.mark.parametrize("state", [
    # a section that claims more than the file holds
    struct.pack("<QI", 1 << 60, 0),
    # counts and lengths inside a section that checks: far more than it holds
    _section(b"") + _section(struct.pack("<QI", 1, 0xFFFFFFFF)),
    _section(b"") + _section(struct.pack("<QII", 1, 0, 1) + struct.pack("<Q", 1 << 62)),
    # a queue claiming a billion chunks
    _section(b"") + _section(struct.pack("<QII", 1, 0, 1) + struct.pack("<Q", 1) + b"q"
                             + bytes(8) + b"\x00" + struct.pack("<Q", (1 << 64) - 1) + b"\x00"
                             + bytes(8) + b"\x00" + struct.pack("<Q", (1 << 64) - 1)
                             + struct.pack("<II", 0, 10 ** 9)),
])
def test_forged_lengths_are_refused_without_allocating_them(tmp_path, state):
    path = tmp_path / "forged"
    path.write_bytes(_forged(state))
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotError):
            snapshot.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_discard_removes_the_file_and_a_temporary_one(tmp_path):
    path, _ = _example(tmp_path)
    path.with_name(path.name + ".tmp").write_bytes(b"half")
    assert snapshot.discard(path)
    assert not list(tmp_path.iterdir())
    assert not snapshot.discard(path)
