# -*- test-case-name: tests.unit.test_packed -*-
"""Ready messages packed as columns: ``Chunk``, and ``Backlog``, a recovered queue's messages.

A ready ``Message`` costs about 346 bytes (the object 112, body 144, id 48,
seq 32, a container's slot 8); a ``Chunk`` of ``CHUNK`` consecutive messages
keeps the same fields as a handful of columns (ids and bodies joined into
one ``bytes``, numbers in arrays, values the messages share once), about
125 bytes per 100-byte message.  The broker's ``PackedReady``
(``mqserver.broker.ready``) keeps a big ready queue's middle in chunks;
a store recovering a backlog fills a ``Backlog``, which packs as it goes, so
a restart never holds a million message objects at once (memory the
allocator would keep) and the broker takes the chunks as they are.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, pairwise, repeat
from typing import Any, NamedTuple

from mqserver.model import Message, RecoveredQueue

# messages per chunk: large enough that a chunk's fixed cost (~1 KB: the
# arrays' and the joined bytes' headers) is about a byte per message, small
# enough that unpacking one costs well under a millisecond
CHUNK = 1024

_NONE = math.nan  # expires_at None in the float64s
_EXACT = 1 << 53  # ints below it are exact as floats
_BYTES_ONLY = {bytes}
def _shared(values: list[Any]) -> Any:
    """One value if every message holds an equal one (bytes, str or None), else the list.

    Queue names, event names and sources are normally shared by a whole
    burst, or equal in a recovered backlog; the list is the exception.  A
    list is never itself a field value, so ``type(column) is list`` tells
    them apart.  (``list.count`` tests identity before equality: the usual
    all-the-same-object case costs one C loop.)
    """
    first = values[0]
    return first if values.count(first) == len(values) else values


def _same(values: list[Any]) -> Any:
    """One value if every message holds that same object (headers), else the list.

    Identity, not equality: equal header dicts of separate publishes stay
    separate objects, as they were."""
    first = values[0]
    for value in values:
        if value is not first:
            return values
    return first


def _column(column: Any, count: int) -> Iterable[Any]:
    return column if type(column) is list else repeat(column, count)


def _joined(values: list[bytes]) -> tuple[Any, Any]:
    """Byte strings as one ``bytes`` and their ends: their one length when all are
    as long and it is a cached small int (4 bytes a message less), else the end
    offsets as the bytes of an array; the list itself and None if any is not
    ``bytes``."""
    if set(map(type, values)) != _BYTES_ONLY:
        return values, None
    data = b"".join(values)
    lengths = list(map(len, values))
    width = lengths[0]
    if 0 < width <= _SMALL_INT and lengths.count(width) == len(lengths):
        return data, width
    return data, array(_ends_code(data), accumulate(lengths)).tobytes()


def _ends_code(data: bytes) -> str:
    return "I" if len(data) < 1 << 32 else "Q"


def _split(data: Any, ends: Any) -> list[bytes]:
    if ends is None:
        return data
    if type(ends) is int:
        return [data[start:start + ends] for start in range(0, len(data), ends)]
    return [data[start:end] for start, end
            in pairwise([0, *memoryview(ends).cast(_ends_code(data))])]


def _one(data: Any, ends: Any, i: int) -> bytes:
    if ends is None:
        return data[i]
    if type(ends) is int:
        return data[i * ends:(i + 1) * ends]
    offsets = memoryview(ends).cast(_ends_code(data))
    return data[offsets[i - 1] if i else 0:offsets[i]]


def _numbers(code: str, values: Iterable[float | int]) -> bytes:
    return array(code, values).tobytes()


# A chunk holds no small object of its own (512 bytes or less, pymalloc's):
# one made when it is packed, long-lived among a publish burst's short-lived
# objects, lands in a hole of some pymalloc pool and keeps that pool's arena
# (1 MiB) from going back once the messages around it go; a few per chunk
# pinned most of a packed backlog's arenas.  So its numbers are ``bytes``
# (malloc's, past 512 bytes), ``count`` and the first seq and expiry are
# read from them, and the chunk itself is padded past 512 bytes.
_SMALL_INT = 256  # ints up to this are shared objects in CPython
_PAD = tuple(f"_pad{n}" for n in range(52))


class Chunk:
    """Up to a few thousand consecutive ready messages as columns.

    ``numbers`` holds, as float64 bytes, every message's ``created_at``,
    then the first seq (when ``seqs`` is None: consecutive, a burst into one
    queue; exact below 2**53) and the first expiry (infinity when none:
    the TTL sweep skips a chunk without unpacking it); ``seqs`` otherwise
    holds every seq as int64 bytes.  ``expires`` is None when no message
    has a TTL, else float64 bytes with NaN for "none"; ``retries`` is one
    int when all are equal (normally 0), else int64 bytes.
    """

    __slots__ = ("bodies", "body_ends", "events", "expires", "headers", "id_ends", "ids",
                 "numbers", "queues", "retries", "seqs", "sources", *_PAD)

    def __init__(self, messages: list[Message]) -> None:
        # one comprehension per field: the attribute reads are specialized,
        # about twice as fast as map(attrgetter(...))
        self._fill(
            [m.id for m in messages], [m.queue for m in messages], [m.body for m in messages],
            [m.seq for m in messages], [m.event for m in messages],
            [m.headers for m in messages], [m.created_at for m in messages],
            [m.expires_at for m in messages], [m.retry for m in messages],
            [m.source for m in messages],
        )

    @classmethod
    def of_columns(cls, *columns: Iterable[Any]) -> Chunk:
        """A chunk from its fields as columns, in ``Message``'s order (id, queue,
        body, seq, event, headers, created_at, expires_at, retry, source): a store's
        rows, transposed, never made into messages."""
        chunk = cls.__new__(cls)
        chunk._fill(*map(list, columns))
        return chunk

    def _fill(self, ids: list[bytes], queues: list[bytes], bodies: list[bytes], seqs: list[int],
              events: list[Any], headers: list[Any], created: list[float],
              expires: list[float | None], retries: list[int], sources: list[Any]) -> None:
        count = len(ids)
        self.ids, self.id_ends = _joined(ids)
        self.bodies, self.body_ends = _joined(bodies)
        self.queues = _shared(queues)
        self.events = _shared(events)
        self.headers = _same(headers)
        self.sources = _shared(sources)
        first = seqs[0]
        consecutive = (first < _EXACT and seqs[-1] - first == count - 1
                       and seqs == list(range(first, first + count)))
        self.seqs = None if consecutive else _numbers("q", seqs)
        if expires.count(None) == count:
            self.expires = None
            first_expiry = math.inf
        else:
            self.expires = _numbers("d", [_NONE if value is None else value for value in expires])
            first_expiry = min(value for value in expires if value is not None)
        created.append(first if consecutive else 0)
        created.append(first_expiry)
        self.numbers = _numbers("d", created)
        self.retries = (retries[0] if retries.count(retries[0]) == count
                        and 0 <= retries[0] <= _SMALL_INT else _numbers("q", retries))

    @property
    def count(self) -> int:
        return len(self.numbers) // 8 - 2

    @property
    def first_expiry(self) -> float:
        return memoryview(self.numbers).cast("d")[-1]

    def _created(self) -> memoryview:
        return memoryview(self.numbers).cast("d")[:-2]

    def unpack(self) -> list[Message]:
        """The messages, as fresh objects, in order."""
        count = self.count
        expires: Iterable[float | None] = (
            repeat(None, count) if self.expires is None
            else [None if value != value else value
                  for value in memoryview(self.expires).cast("d")]
        )
        retries = self.retries
        return list(map(
            Message, _split(self.ids, self.id_ends), _column(self.queues, count),
            _split(self.bodies, self.body_ends), self.seq_column(), _column(self.events, count),
            _column(self.headers, count), self._created(), expires,
            repeat(retries, count) if type(retries) is int else memoryview(retries).cast("q"),
            _column(self.sources, count),
        ))

    def seq_column(self) -> Iterable[int]:
        """The messages' seqs: a range when consecutive, else the int64s."""
        if self.seqs is None:
            first = int(memoryview(self.numbers).cast("d")[-2])
            return range(first, first + self.count)
        return memoryview(self.seqs).cast("q")

    def expiry_values(self) -> list[float]:
        """The expiry times of the messages that have one (none: an empty list)."""
        if self.expires is None:
            return []
        return [value for value in memoryview(self.expires).cast("d") if value == value]

    def message(self, i: int) -> Message:
        """Message ``i`` alone (for peeks at either end and bisecting by seq)."""
        i %= self.count
        expires = None if self.expires is None else memoryview(self.expires).cast("d")[i]
        retries = self.retries
        return Message(
            _one(self.ids, self.id_ends, i), _at(self.queues, i),
            _one(self.bodies, self.body_ends, i), self.seq_column()[i],
            _at(self.events, i), _at(self.headers, i), self._created()[i],
            None if expires != expires else expires,
            retries if type(retries) is int else memoryview(retries).cast("q")[i],
            _at(self.sources, i),
        )

    def parts(self) -> ChunkParts:
        """The columns as arrays and tuples (a snapshot's layout: ``snapshot_sections``)."""
        count = self.count
        numbers = array("d", self.numbers)
        return ChunkParts(
            count, _parted(self.ids, self.id_ends), _parted(self.bodies, self.body_ends),
            self.queues,
            array("q", [int(numbers[-2])]) if self.seqs is None else array("q", self.seqs),
            self.events, self.headers, numbers[:count],
            None if self.expires is None else array("d", self.expires), numbers[-1],
            self.retries if type(self.retries) is int else array("q", self.retries),
            self.sources,
        )

    @classmethod
    def of_parts(cls, parts: ChunkParts) -> Chunk:
        """A chunk from ``parts`` (a snapshot's), in this layout."""
        chunk = cls.__new__(cls)
        count = parts.count
        chunk.ids, chunk.id_ends = _unparted(parts.ids, count)
        chunk.bodies, chunk.body_ends = _unparted(parts.bodies, count)
        chunk.queues, chunk.events = parts.queues, parts.events
        chunk.headers, chunk.sources = parts.headers, parts.sources
        seqs = parts.seqs
        consecutive = len(seqs) == 1 and seqs[0] < _EXACT
        chunk.seqs = None if consecutive else seqs.tobytes()
        chunk.expires = None if parts.expires is None else parts.expires.tobytes()
        # the array as it is (a copy in C), not a list of ``count`` floats: a
        # restart from a snapshot builds a thousand chunks per million messages
        numbers = array("d", parts.created)
        numbers.append(seqs[0] if consecutive else 0)
        numbers.append(parts.first_expiry)
        chunk.numbers = numbers.tobytes()
        retries = parts.retries
        chunk.retries = retries if type(retries) is int and 0 <= retries <= _SMALL_INT \
            else _numbers("q", [retries] * count if type(retries) is int else retries)
        return chunk

    # a chunk read from a clean-shutdown snapshot when needed
    # (``mqserver.storage.snapshot_chunks.LazyChunk``) is unchecked until
    # its bytes were read and their checksum verified
    unchecked = False

    def check(self) -> str | None:
        """None if the chunk's messages can be read; else why not (a damaged snapshot)."""
        return None

    def share(self, queue: bytes, names: dict[bytes, bytes], sources: dict[str, str]) -> None:
        """Hold ``queue`` and the interned event and source (``share_recovered_values``)."""
        if type(self.queues) is not list:
            self.queues = queue
        if self.events is not None and type(self.events) is not list:
            self.events = names.setdefault(self.events, self.events)
        if self.sources is not None and type(self.sources) is not list:
            self.sources = sources.setdefault(self.sources, self.sources)


def _at(column: Any, i: int) -> Any:
    return column[i] if type(column) is list else column


class ChunkParts(NamedTuple):
    """A chunk's columns as ``snapshot_sections`` writes and reads them: ids and
    bodies as (joined bytes, one length or an array of ends) or a list; seqs
    every one, or the first alone when consecutive; numbers as arrays."""

    count: int
    ids: Any
    bodies: Any
    queues: Any
    seqs: array[int]
    events: Any
    headers: Any
    created: array[float]
    expires: array[float] | None
    first_expiry: float
    retries: int | array[int]
    sources: Any


def _parted(data: Any, ends: Any) -> Any:
    if ends is None or type(ends) is int:
        return data if ends is None else (data, ends)
    return data, array(_ends_code(data), ends)


def _unparted(column: Any, count: int) -> tuple[Any, Any]:
    if type(column) is list:
        return column, None
    data, ends = column
    if type(ends) is int:
        if 0 < ends <= _SMALL_INT:
            return data, ends
        ends = range(ends, ends * count + 1, ends)
    return data, array(_ends_code(data), ends).tobytes()


class Backlog:
    """A recovered queue's ready messages in order, packed ``chunk_size`` at a time as added.

    It stands where a list of messages would (``RecoveredQueue.messages``):
    it iterates, counts and compares like one, while only the newest few
    are objects.  ``Broker.load`` takes its chunks as they are.
    """

    chunk_size = CHUNK  # the durability machine makes it small
    __slots__ = ("chunks", "packed", "tail")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self.chunks: list[Chunk] = []
        self.packed = 0  # messages in chunks
        self.tail: list[Message] = []
        self.extend(messages)

    def append(self, message: Message) -> None:
        tail = self.tail
        tail.append(message)
        if len(tail) >= self.chunk_size:
            self.chunks.append(Chunk(tail))
            self.packed += len(tail)
            self.tail = []

    def extend(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.append(message)

    def append_chunk(self, chunk: Chunk) -> None:
        """Messages packed elsewhere (``Chunk.of_columns``), after those appended so far."""
        if self.tail:
            self.chunks.append(Chunk(self.tail))
            self.packed += len(self.tail)
            self.tail = []
        self.chunks.append(chunk)
        self.packed += chunk.count

    def __len__(self) -> int:
        return self.packed + len(self.tail)

    def settle(self) -> list[Chunk]:
        """Check every chunk (``Chunk.check``) and set aside those that cannot be
        read: returns them, and this holds the rest."""
        self.chunks, damaged = sound_chunks(self.chunks)
        self.packed -= sum(chunk.count for chunk in damaged)
        return damaged

    def __iter__(self) -> Iterator[Message]:
        for chunk in self.chunks:
            yield from chunk.unpack()
        yield from self.tail

    def __getitem__(self, i: int | slice) -> Any:
        return list(self)[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, Backlog)):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Backlog {len(self)} messages, {len(self.chunks)} chunks>"


def sound_chunks(chunks: Iterable[Chunk]) -> tuple[list[Chunk], list[Chunk]]:
    """(the chunks that can be read, those that cannot), each in order."""
    sound: list[Chunk] = []
    damaged: list[Chunk] = []
    for chunk in chunks:
        (sound if chunk.check() is None else damaged).append(chunk)
    return sound, damaged


CHECK_SWITCH_INTERVAL = 0.0005
"""The interpreter's switch interval (seconds) while ``check_thd`` runs."""


def check_thd(chunks: Iterable[Chunk]) -> None:
    """``Chunk.check`` each of ``chunks``: a thread's work (a snapshot chunk's read
    and checksum leave the GIL), so the reactor's first look finds it done.

    A log replay's chunks decode in Python, holding the GIL, and the reactor
    thread waits for it up to the switch interval (5 ms) each time it wakes:
    right after a crash restart with 1M messages, a consumer's first
    delivery came 35-60 ms after the broker answered (of 0.3 s).  So while
    this runs the interval is ``CHECK_SWITCH_INTERVAL``."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, CHECK_SWITCH_INTERVAL))
    try:
        for chunk in chunks:
            chunk.check()
    finally:
        sys.setswitchinterval(interval)


def expiries(messages: Iterable[Message]) -> list[float]:
    """The expiry times of ``messages``, one per message with a TTL; a ``Backlog``'s
    chunks are read as they are, never unpacked."""
    times: list[float] = []
    if isinstance(messages, Backlog):
        for chunk in messages.chunks:
            times += chunk.expiry_values()
        messages = messages.tail
    times += [m.expires_at for m in messages if m.expires_at is not None]
    return times


def packing_queue(queues: dict[bytes, RecoveredQueue]) -> Callable[[bytes], RecoveredQueue]:
    """A store's replay's ``queue(name)``: the queue in ``queues``, made with an
    empty ``Backlog`` the first time, so its rows are packed as they are read
    (a million rows never become a million objects at once: memory the
    allocator would keep)."""

    def queue(name: bytes) -> RecoveredQueue:
        rq = queues.get(name)
        if rq is None:
            rq = queues[name] = RecoveredQueue(name, messages=Backlog())
        return rq

    return queue


def share_recovered_values(queues: Iterable[RecoveredQueue]) -> None:
    """Let recovered messages share equal queue and event names, sources and times.

    A store decodes every row into fresh objects, while live publishing shares
    these between messages (the route cache's event name, the publish time
    within a millisecond): without this a restarted broker would hold about
    190 bytes more per message than the one that published them.  A
    ``Backlog``'s chunks hold each shared value once already (its times are
    arrays); they get the same objects.
    """
    names: dict[bytes, bytes] = {}
    sources: dict[str, str] = {}
    times: dict[float, float] = {}
    for rq in queues:
        messages = rq.messages
        if isinstance(messages, Backlog):
            for chunk in messages.chunks:
                chunk.share(rq.name, names, sources)
            messages = messages.tail
        for message in messages:
            message.queue = rq.name
            if message.event is not None:
                message.event = names.setdefault(message.event, message.event)
            if message.source is not None:
                message.source = sources.setdefault(message.source, message.source)
            message.created_at = times.setdefault(message.created_at, message.created_at)
            if message.expires_at is not None:
                message.expires_at = times.setdefault(message.expires_at, message.expires_at)
