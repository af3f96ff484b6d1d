"""A recovered backlog packs as it is filled and reads back exactly as a list would."""

from __future__ import annotations

import sys

import pytest

from mqserver.model import Message, RecoveredQueue
from mqserver.packed import (
    CHECK_SWITCH_INTERVAL,
    CHUNK,
    Backlog,
    Chunk,
    check_thd,
    expiries,
    share_recovered_values,
)


def _messages(first: int, count: int, **fields) -> list[Message]:
    return [Message(b"m%d" % seq, b"q", b"body%d" % seq, seq, **fields)
            for seq in range(first, first + count)]


def test_a_backlog_packs_every_chunk_and_reads_like_a_list(monkeypatch):
    monkeypatch.setattr(Backlog, "chunk_size", 4)
    messages = _messages(1, 10)
    backlog = Backlog(messages[:9])
    backlog.append(messages[9])
    assert [chunk.count for chunk in backlog.chunks] == [4, 4] and len(backlog.tail) == 2
    assert len(backlog) == 10 and list(backlog) == messages and backlog == messages
    assert backlog[-1] == messages[-1] and backlog[2:4] == messages[2:4]
    assert Backlog() == []


def test_a_chunk_of_columns_is_the_chunk_of_the_messages(monkeypatch):
    monkeypatch.setattr(Backlog, "chunk_size", 4)
    messages = _messages(5, 3, event=b"ev", created_at=1.5, source="mqks")
    columns = zip(*(m.as_tuple() for m in messages), strict=True)
    backlog = Backlog(_messages(1, 2))
    backlog.append_chunk(Chunk.of_columns(*columns))
    assert [chunk.count for chunk in backlog.chunks] == [2, 3] and not backlog.tail
    assert list(backlog) == _messages(1, 2) + messages


def _fresh(raw: bytes) -> bytes:
    """An equal bytes that is another object (as each row a store decodes is)."""
    return bytes(bytearray(raw))


def test_equal_recovered_values_are_stored_once_and_shared():
    rows = [(b"m%d" % n, _fresh(b"q"), b"b", n, _fresh(b"ev"), None, 1.0, None, 0,
             "".join(["mq", "ks"])) for n in range(3)]
    chunk = Chunk.of_columns(*zip(*rows, strict=True))
    assert chunk.events == b"ev" and chunk.sources == "mqks" and chunk.queues == b"q"
    backlog = Backlog()
    backlog.append_chunk(chunk)
    name = _fresh(b"q")
    share_recovered_values([RecoveredQueue(name, messages=backlog)])
    assert all(m.queue is name for m in backlog)


def test_expiries_read_chunks_without_unpacking_them(monkeypatch):
    monkeypatch.setattr(Backlog, "chunk_size", 2)
    backlog = Backlog(_messages(1, 2) + _messages(3, 2, expires_at=9.0) + _messages(5, 1,
                                                                              expires_at=7.0))
    assert len(backlog.chunks) == 2 and sorted(expiries(backlog)) == [7.0, 9.0, 9.0]
    assert expiries(_messages(1, 2, expires_at=3.0)) == [3.0, 3.0]


def test_a_chunk_makes_no_object_of_pymalloc_size():
    """A small object a chunk made would keep its pymalloc arena (1 MiB) from going
    back once the messages around it go: a chunk's own objects are all past 512
    bytes (malloc's), and the rest are shared (the queue, small ints, None)."""
    burst = [Message(b"%020d" % n, b"q", b"x" * 100, 10**6 + n, None, None, 1.7e9 + n / 1e3)
             for n in range(CHUNK)]
    chunk = Chunk(burst)
    assert sys.getsizeof(chunk) > 512
    for name in Chunk.__slots__:
        value = getattr(chunk, name, None)
        shared = value is None or value is burst[0].queue or (type(value) is int and value <= 256)
        assert shared or sys.getsizeof(value) > 512, (name, value)
    assert chunk.count == CHUNK and chunk.unpack() == burst


def test_parts_give_back_the_same_chunk():
    """``Chunk.parts`` and ``Chunk.of_parts`` (a snapshot's layout) keep every field:
    one length past a small int, ends, lists, expiries, retries, gaps in seqs."""
    bursts = [
        [Message(b"m%d" % n, b"q", b"y" * 300, 5 + n, None, None, 1.0 + n) for n in range(3)],
        [Message(b"a", b"q", b"1", 1, b"e1", None, 1.0, 9.0, 0),
         Message(b"bb", b"q", bytearray(b"22"), 5, b"e2", {"k": "v"}, 2.0, None, 3, "emqp")],
        [Message(b"id%d" % n, b"q", b"z" * n, 7 + 2 * n, b"e", None, 3.0, 4.0 + n, 2**40, "x")
         for n in range(4)],
    ]
    for burst in bursts:
        chunk = Chunk(burst)
        again = Chunk.of_parts(chunk.parts())
        assert again.unpack() == chunk.unpack()
        assert again.first_expiry == chunk.first_expiry and again.count == chunk.count
        assert again.numbers == chunk.numbers  # created, the first seq, the first expiry
        mine, theirs = chunk.parts(), again.parts()
        assert theirs._replace(expires=None) == mine._replace(expires=None)
        assert (theirs.expires is None) == (mine.expires is None)
        assert mine.expires is None or theirs.expires.tobytes() == mine.expires.tobytes()


def test_the_check_thread_keeps_the_reactors_waits_for_the_gil_short():
    """While ``check_thd`` decodes (a log replay's chunks hold the GIL) the switch
    interval is short, and it is the process's own again after, raised or not."""
    seen = []

    class Recorded:
        def check(self) -> None:
            seen.append(sys.getswitchinterval())

    interval = sys.getswitchinterval()
    try:
        check_thd([Recorded(), Recorded()])
        assert seen == [CHECK_SWITCH_INTERVAL] * 2 and sys.getswitchinterval() == interval

        class Fails(Recorded):
            def check(self) -> None:
                raise ValueError("damaged")

        with pytest.raises(ValueError):
            check_thd([Fails()])
        assert sys.getswitchinterval() == interval
    finally:
        sys.setswitchinterval(interval)
