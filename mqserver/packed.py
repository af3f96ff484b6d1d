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
from array import array
from collections.abc import Iterable, Iterator
from itertools import accumulate, pairwise, repeat
from typing import Any

from mqserver.model import Message, RecoveredQueue

# messages per chunk: large enough that a chunk's fixed cost (~1 KB: the
# arrays' and the joined bytes' headers) is about a byte per message, small
# enough that unpacking one costs well under a millisecond
CHUNK = 1024

_NONE = math.nan  # expires_at None in the float array
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


Joined = tuple[bytes, "array[int] | int"] | list[bytes]


def _joined(values: list[bytes]) -> Joined:
    """Byte strings as one ``bytes`` plus end offsets (or their one length, when all
    are as long: 4 bytes a message less), or the list if any is not ``bytes``."""
    if set(map(type, values)) != _BYTES_ONLY:
        return values
    data = b"".join(values)
    lengths = list(map(len, values))
    width = lengths[0]
    if width and lengths.count(width) == len(lengths):
        return data, width
    return data, array("I" if len(data) < 1 << 32 else "Q", accumulate(lengths))


def _split(column: Joined) -> list[bytes]:
    if type(column) is list:
        return column
    data, ends = column
    if type(ends) is int:
        return [data[start:start + ends] for start in range(0, len(data), ends)]
    return [data[start:end] for start, end in pairwise([0, *ends])]


def _one(column: Joined, i: int) -> bytes:
    if type(column) is list:
        return column[i]
    data, ends = column
    if type(ends) is int:
        return data[i * ends:(i + 1) * ends]
    return data[ends[i - 1] if i else 0:ends[i]]


class Chunk:
    """Up to a few thousand consecutive ready messages as columns.

    ``seqs`` is an array of the first seq alone when consecutive (a burst
    into one queue), else of every seq (``seq_column`` reads both);
    ``expires`` is None when no message has a TTL, else floats with NaN for
    "none"; ``retries`` is one int when all are equal (normally 0).
    ``first_expiry`` lets the TTL sweep skip a chunk without unpacking it.
    """

    __slots__ = ("bodies", "count", "created", "events", "expires", "first_expiry",
                 "headers", "ids", "queues", "retries", "seqs", "sources")

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
        count = self.count = len(ids)
        self.ids = _joined(ids)
        self.bodies = _joined(bodies)
        self.queues = _shared(queues)
        self.events = _shared(events)
        self.headers = _same(headers)
        self.sources = _shared(sources)
        # consecutive: the first alone, in an array (not a range: its int objects,
        # long-lived among a publish burst's short-lived ones, would each keep a
        # pymalloc arena of 1 MiB from going back once the messages around go)
        first = seqs[0]
        consecutive = seqs[-1] - first == count - 1 and seqs == list(range(first, first + count))
        self.seqs = array("q", [first] if consecutive else seqs)
        self.created = array("d", created)
        if expires.count(None) == count:
            self.expires = None
            self.first_expiry = math.inf
        else:
            self.expires = array("d", [_NONE if value is None else value for value in expires])
            # read back from the array: fresh floats, for the same reason
            self.first_expiry = min(value for value in self.expires if value == value)
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
            self.seq_column(), _column(self.events, count), _column(self.headers, count),
            self.created, expires,
            repeat(retries, count) if type(retries) is int else retries,
            _column(self.sources, count),
        ))

    def seq_column(self) -> Iterable[int]:
        """The messages' seqs: a range when consecutive, else the array."""
        seqs = self.seqs
        return range(seqs[0], seqs[0] + self.count) if len(seqs) == 1 else seqs

    def message(self, i: int) -> Message:
        """Message ``i`` alone (for peeks at either end and bisecting by seq)."""
        i %= self.count
        expires = None if self.expires is None else self.expires[i]
        retries = self.retries
        return Message(
            _one(self.ids, i), _at(self.queues, i), _one(self.bodies, i),
            self.seqs[0] + i if len(self.seqs) == 1 else self.seqs[i],
            _at(self.events, i), _at(self.headers, i), self.created[i],
            None if expires != expires else expires,
            retries if type(retries) is int else retries[i], _at(self.sources, i),
        )


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


def expiries(messages: Iterable[Message]) -> list[float]:
    """The expiry times of ``messages``, one per message with a TTL; a ``Backlog``'s
    chunks are read as they are, never unpacked."""
    times: list[float] = []
    if isinstance(messages, Backlog):
        for chunk in messages.chunks:
            if chunk.expires is not None:
                times += [value for value in chunk.expires if value == value]
        messages = messages.tail
    times += [m.expires_at for m in messages if m.expires_at is not None]
    return times


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
