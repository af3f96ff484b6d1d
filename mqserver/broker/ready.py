# -*- test-case-name: tests.unit.test_ready -*-
"""A large ready backlog kept packed: a few hundred bytes less per message.

A ready ``Message`` costs about 346 bytes (the object 112, body 144, id 48,
seq 32, deque slot 8), so a million of them cannot fit in 300 MB.  Small
queues, the common case, keep ``Queue.ready`` a plain ``deque`` (nothing
here is on their path).  Past ``--pack-ready-after`` messages the queue
swaps it for a ``PackedReady``: the messages ready so far stay objects (the
head, dispatched first), and what arrives later is packed in ``Chunk``\\ s of
``CHUNK`` messages, each one a handful of columns (ids and bodies joined into
one ``bytes``, numbers in arrays), about 130 bytes per 100-byte message.
Popping from the head turns the next chunk back into ``Message`` objects,
``CHUNK`` at a time.

``PackedReady`` offers exactly the deque operations the broker uses on a
queue's ready messages, in the same order and with equal messages; messages
read from a chunk are fresh objects each time, which is fine because nothing
keeps or compares a *ready* message by identity (a message is only tracked by
identity once delivered, in ``Consumer.unacked``).
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import accumulate, pairwise, repeat
from typing import Any

from mqserver.model import Message

# messages per chunk: large enough that a chunk's fixed cost (~1 KB: the
# arrays' and the joined bytes' headers) is about a byte per message, small
# enough that unpacking one costs well under a millisecond
CHUNK = 1024
# default --pack-ready-after: above W1's 200,000-message backlog, so ordinary
# backlogs never pay for packing (about 1-1.5 us per message, pack plus unpack)
PACK_READY_AFTER = 250_000

_NONE = math.nan  # expires_at None in the float array
_BYTES_ONLY = {bytes}
# sys.getrefcount of a message only a deque holds: the deque's reference and the argument's
_ONLY_THE_TAIL = 2


def _shared(values: list[Any]) -> Any:
    """One value if every message holds that same object, else the list.

    Queue names, event names, sources (and headers, if a client reuses them)
    are normally shared by a whole burst; the list is the exception.  A list
    is never itself a field value, so ``type(column) is list`` tells them apart.
    """
    first = values[0]
    for value in values:
        if value is not first:
            return values
    return first


def _column(column: Any, count: int) -> Iterable[Any]:
    return column if type(column) is list else repeat(column, count)


def _joined(values: list[bytes]) -> tuple[bytes, array[int]] | list[bytes]:
    """Byte strings as one ``bytes`` plus end offsets, or the list if any is not ``bytes``."""
    if set(map(type, values)) != _BYTES_ONLY:
        return values
    data = b"".join(values)
    ends = array("I" if len(data) < 1 << 32 else "Q", accumulate(map(len, values)))
    return data, ends


def _split(column: tuple[bytes, array[int]] | list[bytes]) -> list[bytes]:
    if type(column) is list:
        return column
    data, ends = column
    return [data[start:end] for start, end in pairwise([0, *ends])]


def _one(column: tuple[bytes, array[int]] | list[bytes], i: int) -> bytes:
    if type(column) is list:
        return column[i]
    data, ends = column
    return data[ends[i - 1] if i else 0:ends[i]]


class Chunk:
    """Up to a few thousand consecutive ready messages as columns.

    ``seqs`` is a ``range`` when consecutive (a burst into one queue), else an
    array; ``expires`` is None when no message has a TTL, else floats with
    NaN for "none"; ``retries`` is one int when all are equal (normally 0).
    ``first_expiry`` lets the TTL sweep skip a chunk without unpacking it.
    """

    __slots__ = ("bodies", "count", "created", "events", "expires", "first_expiry",
                 "headers", "ids", "queues", "retries", "seqs", "sources")

    def __init__(self, messages: list[Message]) -> None:
        count = self.count = len(messages)
        # one comprehension per field: the attribute reads are specialized,
        # about twice as fast as map(attrgetter(...))
        self.ids = _joined([m.id for m in messages])
        self.bodies = _joined([m.body for m in messages])
        self.queues = _shared([m.queue for m in messages])
        self.events = _shared([m.event for m in messages])
        self.headers = _shared([m.headers for m in messages])
        self.sources = _shared([m.source for m in messages])
        seqs = [m.seq for m in messages]
        first = seqs[0]
        consecutive = seqs[-1] - first == count - 1 and seqs == list(range(first, first + count))
        self.seqs = range(first, first + count) if consecutive else array("q", seqs)
        self.created = array("d", [m.created_at for m in messages])
        expires = [m.expires_at for m in messages]
        if expires.count(None) == count:
            self.expires = None
            self.first_expiry = math.inf
        else:
            self.expires = array("d", [_NONE if value is None else value for value in expires])
            self.first_expiry = min(value for value in expires if value is not None)
        retries = [m.retry for m in messages]
        self.retries = retries[0] if retries.count(retries[0]) == count else array("q", retries)

    def unpack(self) -> list[Message]:
        """The messages, as fresh objects, in order."""
        count = self.count
        expires: Iterable[float | None] = (
            repeat(None, count) if self.expires is None
            else [None if value != value else value for value in self.expires]
        )
        retries = self.retries
        return list(map(
            Message, _split(self.ids), _column(self.queues, count), _split(self.bodies),
            self.seqs, _column(self.events, count), _column(self.headers, count),
            self.created, expires,
            repeat(retries, count) if type(retries) is int else retries,
            _column(self.sources, count),
        ))

    def message(self, i: int) -> Message:
        """Message ``i`` alone (for peeks at either end and bisecting by seq)."""
        i %= self.count
        expires = None if self.expires is None else self.expires[i]
        retries = self.retries
        return Message(
            _one(self.ids, i), _at(self.queues, i), _one(self.bodies, i), self.seqs[i],
            _at(self.events, i), _at(self.headers, i), self.created[i],
            None if expires != expires else expires,
            retries if type(retries) is int else retries[i], _at(self.sources, i),
        )


def _at(column: Any, i: int) -> Any:
    return column[i] if type(column) is list else column


class PackedReady:
    """A queue's ready messages: ``head`` objects, packed ``chunks``, ``tail`` objects.

    Appends go to the tail, which is packed ``CHUNK`` messages at a time; pops
    come from the head, which takes the next chunk's messages when it runs
    out (or the tail's, once no chunk is left).  ``Queue.pack_ready`` swaps a
    large deque for one of these (its deque becomes the head, so nothing is
    copied) and swaps back once no chunk is left and it is small again.
    """

    __slots__ = ("chunk_size", "chunks", "head", "packed", "tail")

    def __init__(self, head: deque[Message], chunk_size: int = CHUNK) -> None:
        self.head = head
        self.chunk_size = chunk_size
        self.chunks: deque[Chunk] = deque()
        self.packed = 0  # messages in chunks
        self.tail: deque[Message] = deque()

    def __len__(self) -> int:
        return len(self.head) + self.packed + len(self.tail)

    def __bool__(self) -> bool:
        return bool(self.head or self.chunks or self.tail)

    def append(self, message: Message) -> None:
        tail = self.tail
        tail.append(message)
        if len(tail) > self.chunk_size:
            self._pack()

    def _pack(self) -> None:
        """Pack the tail's oldest ``chunk_size`` messages, if the tail is all that holds them.

        A message something else still references (a durable store's write
        backlog: SQLite can lag a fast publisher by most of a million messages)
        would be kept twice, packed and as an object, costing memory instead of
        saving it; it is packed by a later append, once its writer let go.  The
        chunk's newest message stands for all of it, as writers work in order.
        At most two chunks per append, so a tail that grew meanwhile shrinks
        again without one long pause.
        """
        tail = self.tail
        size = self.chunk_size
        for _ in range(2):
            if len(tail) <= size or sys.getrefcount(tail[size - 1]) > _ONLY_THE_TAIL:
                return
            self.chunks.append(Chunk([tail.popleft() for _ in range(size)]))
            self.packed += size

    def extend(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.append(message)

    def appendleft(self, message: Message) -> None:
        self.head.appendleft(message)

    def popleft(self) -> Message:
        if not self.head:
            self._refill()
        return self.head.popleft()

    def _refill(self) -> None:
        """Give the (empty) head the next messages: a chunk's, else the tail's."""
        if self.chunks:
            chunk = self.chunks.popleft()
            self.packed -= chunk.count
            self.head.extend(chunk.unpack())
        else:
            self.head, self.tail = self.tail, self.head

    def clear(self) -> None:
        self.head.clear()
        self.chunks.clear()
        self.packed = 0
        self.tail.clear()

    def __iter__(self) -> Iterator[Message]:
        yield from self.head
        for chunk in self.chunks:
            yield from chunk.unpack()
        yield from self.tail

    def __getitem__(self, i: int) -> Message:
        """Message ``i`` (negative from the end), unpacking only that one."""
        size = len(self)
        if i < 0:
            i += size
        if not 0 <= i < size:
            raise IndexError("ready index out of range")
        head = self.head
        if i < len(head):
            return head[i]
        i -= len(head)
        for chunk in self.chunks:
            if i < chunk.count:
                return chunk.message(i)
            i -= chunk.count
        return self.tail[i]

    def insert(self, i: int, message: Message) -> None:
        """Put ``message`` before position ``i`` (``bisect.insort`` during a restore).

        A message landing inside a chunk repacks just that chunk, one larger.
        """
        head = self.head
        if i <= len(head):
            head.insert(i, message)
            return
        i -= len(head)
        chunks = self.chunks
        for n, chunk in enumerate(chunks):
            if i < chunk.count:
                messages = chunk.unpack()
                messages.insert(i, message)
                chunks[n] = Chunk(messages)
                self.packed += 1
                return
            i -= chunk.count
        self.tail.insert(i, message)

    def unpacked(self) -> deque[Message]:
        """Every message as objects in one deque; this object is left empty.

        The head deque itself is returned, so going back to a plain deque
        copies only the tail (at most ``CHUNK`` messages) once no chunk is left.
        """
        head = self.head
        for chunk in self.chunks:
            head.extend(chunk.unpack())
        head.extend(self.tail)
        self.head = deque()
        self.clear()
        return head

    def take_expired(self, now: float) -> list[Message]:
        """Remove and return the messages whose expiry is at or before ``now``, in order.

        Only chunks holding such a message are unpacked (and repacked without
        them), so a sweep over a large packed backlog stays small in memory.
        """
        expired = take_expired(self.head, now)
        chunks: deque[Chunk] = deque()
        for chunk in self.chunks:
            if chunk.first_expiry > now:
                chunks.append(chunk)
                continue
            messages = chunk.unpack()
            expired.extend(take_expired(messages, now))
            self.packed -= chunk.count - len(messages)
            if messages:
                chunks.append(Chunk(messages))
        self.chunks = chunks
        expired.extend(take_expired(self.tail, now))
        return expired


def take_expired(messages: deque[Message] | list[Message], now: float) -> list[Message]:
    """Remove from ``messages`` (in place) and return those expired at ``now``."""
    expired = []
    keep = []
    for message in messages:
        if message.expires_at is not None and message.expires_at <= now:
            expired.append(message)
        else:
            keep.append(message)
    if expired:
        messages.clear()
        messages.extend(keep)
    return expired
