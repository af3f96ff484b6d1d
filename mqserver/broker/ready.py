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

import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from mqserver.model import Message
from mqserver.packed import CHUNK, Backlog, Chunk, sound_chunks

__all__ = ["CHUNK", "PACK_READY_AFTER", "Chunk", "PackedReady", "take_expired"]

# default --pack-ready-after: above W1's 200,000-message backlog, so ordinary
# backlogs never pay for packing (about 1-1.5 us per message, pack plus unpack)
PACK_READY_AFTER = 250_000

# sys.getrefcount of a message only its deque holds: the deque's reference and the argument's
_ONLY_ITS_DEQUE = 2


class PackedReady:
    """A queue's ready messages: ``head`` objects, packed ``chunks``, ``tail`` objects.

    Appends go to the tail, which is packed ``CHUNK`` messages at a time; pops
    come from the head, which takes the next chunk's messages when it runs
    out (or the tail's, once no chunk is left).  ``Queue.pack_ready`` swaps a
    large deque for one of these (its deque becomes the head, so nothing is
    copied) and swaps back once no chunk is left and it is small again.
    """

    __slots__ = ("chunk_size", "chunks", "head", "on_lag", "on_withheld", "packed", "tail",
                 "unsettled")

    def __init__(self, head: deque[Message], chunk_size: int = CHUNK,
                 on_lag: Callable[[], object] | None = None) -> None:
        self.head = head
        self.chunk_size = chunk_size
        self.chunks: deque[Chunk] = deque()
        self.packed = 0  # messages in chunks
        self.tail: deque[Message] = deque()
        # called when packing waits for a durable store's writer (see _pack)
        self.on_lag = on_lag
        # chunks read from a snapshot when needed are checked before any is
        # read (``settle``); those that cannot be go to ``on_withheld``
        self.unsettled = False
        self.on_withheld: Callable[[list[Chunk]], object] | None = None

    @classmethod
    def of(cls, messages: list[Message], keep: int, chunk_size: int = CHUNK,
           on_lag: Callable[[], object] | None = None) -> PackedReady:
        """``messages`` (in order) with the first ``keep`` as objects and the rest packed.

        A recovered backlog: the layout live publishing gives a queue past
        ``keep`` ready messages, so a restart holds what the broker held before it.
        """
        ready = cls(deque(messages[:keep]), chunk_size, on_lag)
        chunks = ready.chunks
        end = len(messages) - (len(messages) - keep) % chunk_size
        for start in range(keep, end, chunk_size):
            chunks.append(Chunk(messages[start:start + chunk_size]))
        ready.packed = end - keep
        ready.tail.extend(messages[end:])
        return ready

    @classmethod
    def of_backlog(cls, backlog: Backlog, chunk_size: int = CHUNK,
                   on_lag: Callable[[], object] | None = None,
                   on_withheld: Callable[[list[Chunk]], object] | None = None) -> PackedReady:
        """A store's recovered ``Backlog``, its chunks taken as they are.

        Chunks a snapshot reads when needed (``Chunk.unchecked``) are counted
        at once and checked before the first of them is read: ``settle``."""
        ready = cls(deque(), chunk_size, on_lag)
        ready.chunks.extend(backlog.chunks)
        ready.packed = backlog.packed
        ready.tail.extend(backlog.tail)
        ready.on_withheld = on_withheld
        ready.unsettled = any(chunk.unchecked for chunk in backlog.chunks)
        return ready

    def settle(self) -> None:
        """Check every chunk not checked yet; set aside those that cannot be read.

        Called before anything but a pop, ``bool()`` or ``[0]`` reads a
        message (those check the front alone: ``_settle_front``), so a
        damaged snapshot chunk is found here, where taking it out is clean,
        and never halfway through a lookup or an insert: its messages leave
        the count and go to ``on_withheld``.  Cheap once the broker's
        service checked them in its thread (``packed.check_thd``).
        """
        self.unsettled = False
        sound, damaged = sound_chunks(self.chunks)
        if damaged:
            self.chunks = deque(sound)
            self.packed -= sum(chunk.count for chunk in damaged)
            if self.on_withheld is not None:
                self.on_withheld(damaged)

    def _settle_front(self) -> None:
        """Check the chunks at the front until one can be read, setting aside the
        damaged ones (as ``settle`` does).

        What a delivery needs (``bool()``, then a pop) and the oldest message
        (``[0]``) look no further than the first sound chunk, so a consumer
        that comes before the broker's thread checked the rest waits for one
        chunk (a few ms), not for the whole backlog: 115 MB of a snapshot, or
        seconds of decoding a log replay's chunks, on the reactor thread.
        """
        chunks = self.chunks
        while chunks and chunks[0].check() is not None:
            damaged = chunks.popleft()
            self.packed -= damaged.count
            if self.on_withheld is not None:
                self.on_withheld([damaged])

    def __len__(self) -> int:
        return len(self.head) + self.packed + len(self.tail)

    def __bool__(self) -> bool:
        if self.unsettled and not self.head:
            self._settle_front()
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
        self.catch_up(2)

    def catch_up(self, most: int) -> bool:
        """Pack up to ``most`` chunks of the tail; True if it stopped at ``most`` with more to do.

        A tail whose oldest messages are still held elsewhere stays as it is
        and ``on_lag`` is told: the broker calls this again once its writer
        let go of them (``Broker._catch_up``), so a backlog that stopped
        growing is packed too, not only one that keeps growing.
        """
        tail = self.tail
        size = self.chunk_size
        for _ in range(most):
            if len(tail) <= size:
                return False
            if sys.getrefcount(tail[size - 1]) > _ONLY_ITS_DEQUE:
                if self.on_lag is not None:
                    self.on_lag()
                return False
            self.chunks.append(Chunk([tail.popleft() for _ in range(size)]))
            self.packed += size
        return len(tail) > size

    def pack_head(self, keep: int, most: int, hold: list[Message]) -> bool:
        """Pack up to ``most`` chunks of the head past its first ``keep``
        messages; True if it stopped at ``most`` with more to pack.

        For a backlog at rest (``mqserver.broker.resting``): the head is what
        a queue held as objects before it packed (up to ``--pack-ready-after``
        messages), dispatched first, so a busy queue keeps it; one nobody
        drains packs it too.  Chunks are taken from the head's newest end and
        put before the other chunks, so the order is kept.  Messages something
        else still holds (a durable store's writer) are left as they are, as
        in ``catch_up``: the head's newest stands for all of it.

        The packed messages go to ``hold``, which the caller lets go of once
        the whole head is packed.  Freed one chunk at a time, each message's
        memory would take the next chunk's small objects (pymalloc reuses
        freed blocks first), and one of them is enough to keep its arena (1
        MiB) from going back to the system: RSS would not fall at all.
        Freed at once after the last chunk, whole arenas are empty.
        """
        head, size, chunks = self.head, self.chunk_size, self.chunks
        for _ in range(most):
            if len(head) < keep + size:
                return False
            if sys.getrefcount(head[-1]) > _ONLY_ITS_DEQUE:
                return False
            messages = [head.pop() for _ in range(size)]
            messages.reverse()
            chunks.appendleft(Chunk(messages))
            hold += messages
            self.packed += size
        return len(head) >= keep + size

    def pack_tail(self, most: int, hold: list[Message]) -> bool:
        """Pack up to ``most`` chunks of the tail, the last one however short;
        True if it stopped at ``most`` with more to pack.

        For a backlog at rest, after ``pack_head``: the tail holds the newest
        messages (fewer than a chunk once the writer caught up), made at the
        end of a burst, when pymalloc hands out the scattered holes the
        burst's short-lived objects left: a thousand of them kept a few blocks
        alive in each of some twenty arenas (1 MiB each) on the log store.
        Messages the writer still holds stay, as in ``catch_up``; the packed
        ones go to ``hold``, as in ``pack_head``.  A short tail behind a short
        chunk joins it (one chunk of fewer than two ``chunk_size``), so a
        queue that a trickle of publishes keeps at rest does not grow a chunk
        per look.
        """
        if self.unsettled:
            self.settle()
        tail, size, chunks = self.tail, self.chunk_size, self.chunks
        for _ in range(most):
            count = min(size, len(tail))
            if not count or sys.getrefcount(tail[count - 1]) > _ONLY_ITS_DEQUE:
                return False
            messages = [tail.popleft() for _ in range(count)]
            hold += messages
            self.packed += count
            if count < size and chunks and chunks[-1].count < size:
                messages = chunks.pop().unpack() + messages
            chunks.append(Chunk(messages))
        return bool(tail)

    def extend(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.append(message)

    def appendleft(self, message: Message) -> None:
        self.head.appendleft(message)

    def popleft(self) -> Message:
        if not self.head:
            if self.unsettled:
                self._settle_front()
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
        if self.unsettled:
            self.settle()
        yield from self.head
        for chunk in self.chunks:
            yield from chunk.unpack()
        yield from self.tail

    def __getitem__(self, i: int) -> Message:
        """Message ``i`` (negative from the end), unpacking only that one."""
        if self.unsettled:
            if i == 0 and not self.head:
                self._settle_front()
            elif i != 0:
                self.settle()
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

        A message landing inside a chunk repacks just that chunk, one larger;
        one that reaches twice ``chunk_size`` is split in two, so restores into
        one stretch of a backlog never make a chunk that a pop or a lookup
        has to unpack whole for one message.
        """
        if self.unsettled:
            self.settle()
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
                self.packed += 1
                size = self.chunk_size
                if len(messages) < 2 * size:
                    chunks[n] = Chunk(messages)
                    return
                chunks[n] = Chunk(messages[size:])
                chunks.insert(n, Chunk(messages[:size]))
                return
            i -= chunk.count
        self.tail.insert(i, message)

    def unpacked(self) -> deque[Message]:
        """Every message as objects in one deque; this object is left empty.

        The head deque itself is returned, so going back to a plain deque
        copies only the tail (at most ``CHUNK`` messages) once no chunk is left.
        """
        if self.unsettled:
            self.settle()
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
