# -*- test-case-name: tests.unit.test_storage_log -*-
"""Where the live copy of everything sits in the log, and how many bytes are live per segment.

Compaction needs two answers: is this record still the live copy of
something (so it must be rewritten before its segment goes), and how much of
each segment is garbage (so it knows when to bother).  The index answers
both without keeping message bodies in memory: a location is one int packing
segment, offset and frame size.

Recovery builds it by replaying the log through these methods; at run time
the store updates it while it encodes each batch, on the reactor thread
(``log_batch``), which inlines ``put_message`` and ``remove_message`` for
the two ops nearly every batch is made of and uses ``apply_op`` for the
rest.  ``tests/unit/test_log_batch.py`` checks that both build the same index.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import chain, islice
from typing import Any

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
)


def loc(segment: int, offset: int, size: int) -> int:
    """One int for (segment, offset, size): ~36 bytes per live message instead of a tuple."""
    return (segment << 64) | (offset << 32) | size


def loc_segment(location: int) -> int:
    return location >> 64


def loc_size(location: int) -> int:
    return location & 0xFFFFFFFF


ARCHIVE_AT = 262_144
"""Entries a queue's ``SeqIndex`` keeps in its dict before they move to its arrays: above
W1's 200,000-message backlog, so ordinary backlogs never pay for the arrays (a
remove there is a Python call, about 1 us, where a dict's pop costs 0.1)."""
_MASK = (1 << 64) - 1


class SeqIndex(dict[int, int]):
    """One queue's live messages: seq -> location, the newest in the dict itself.

    A dict entry costs about 110 bytes (the entry, an int key, a 128-bit
    location int); a million waiting messages would cost more than their
    packed bodies.  Past ``ARCHIVE_AT`` entries the dict's go to three arrays
    (seq, segment, offset and size: 24 bytes an entry), sorted by seq, where a
    remove marks its entry 0 and the head is skipped as acks reach it (FIFO,
    so nearly every remove is the first live entry).  Callers use the dict
    first, as C code, and the arrays only for a seq at or below ``last``.
    """

    __slots__ = ("first", "last", "places", "segments", "seqs")

    def __init__(self) -> None:
        super().__init__()
        self.seqs = array("q")
        self.segments = array("Q")
        self.places = array("Q")  # offset << 32 | size; 0: removed
        self.first = 0  # the first entry that may be live
        self.last = -1  # the highest archived seq

    def archive(self) -> None:
        """Move the dict's entries to the arrays."""
        items = sorted(self.items())
        self.clear()
        if items and items[0][0] <= self.last:  # a seq below the archived ones: merge
            items = sorted([*self.archived(), *items])
            self.seqs, self.segments, self.places = array("q"), array("Q"), array("Q")
            self.first = 0
        self.seqs.extend([seq for seq, _ in items])
        self.segments.extend([location >> 64 for _, location in items])
        self.places.extend([location & _MASK for _, location in items])
        self.last = self.seqs[-1] if self.seqs else -1

    def archive_oldest(self, most: int) -> None:
        """Move the dict's oldest ``most`` entries to the arrays (a slice of a backlog
        at rest: ``log_rest``); all of them once no more than ``most`` are left
        (``archive``, which also frees the dict's table).

        The dict's order is the order entries came in, which is seq order as
        publishing goes; an entry at or below the archived ones (a requeue
        into an old seq, rare) takes the merging ``archive`` instead.
        """
        if len(self) <= most:
            self.archive()
            return
        items = sorted(islice(self.items(), most))
        if items[0][0] <= self.last:
            self.archive()
            return
        for seq, _ in items:
            del self[seq]
        self.seqs.extend([seq for seq, _ in items])
        self.segments.extend([location >> 64 for _, location in items])
        self.places.extend([location & _MASK for _, location in items])
        self.last = items[-1][0]

    def _find(self, seq: int) -> int:
        seqs, i = self.seqs, self.first
        if i < len(seqs) and seqs[i] == seq:
            return i if self.places[i] else -1
        i = bisect_left(seqs, seq, i)
        return i if i < len(seqs) and seqs[i] == seq and self.places[i] else -1

    def take(self, seq: int) -> int | None:
        """Remove archived ``seq``; its location, or None if it is not there."""
        i = self._find(seq)
        if i < 0:
            return None
        places = self.places
        location = (self.segments[i] << 64) | places[i]
        places[i] = 0
        if i == self.first:
            end = len(places)
            i += 1
            while i < end and not places[i]:
                i += 1
            self.first = i
            if i > 4096 and 2 * i > end:  # drop the removed head
                del self.seqs[:i], self.segments[:i], places[:i]
                self.first = 0
        return location

    def put_old(self, seq: int, location: int) -> int | None:
        """Put ``seq``, at or below ``last``: moved in the arrays if archived (its old
        location returned), else into the dict (None; ``archive`` merges it)."""
        i = self._find(seq)
        if i < 0:
            self[seq] = location
            return None
        old = (self.segments[i] << 64) | self.places[i]
        self.segments[i], self.places[i] = location >> 64, location & _MASK
        return old

    def location(self, seq: int) -> int | None:
        location = self.get(seq)
        if location is None and seq <= self.last:
            i = self._find(seq)
            if i >= 0:
                location = (self.segments[i] << 64) | self.places[i]
        return location

    def archived(self) -> Iterator[tuple[int, int]]:
        first = self.first
        return ((seq, (segment << 64) | place) for seq, segment, place
                in zip(islice(self.seqs, first, None), islice(self.segments, first, None),
                       islice(self.places, first, None), strict=True) if place)

    def everything(self) -> Iterator[tuple[int, int]]:
        """Every live (seq, location), in seq order, one at a time (a million
        tuples at once would be a hundred megabytes)."""
        fresh = sorted(self.items())
        if not fresh or fresh[0][0] > self.last:  # the dict holds the newest: as usual
            return chain(self.archived(), fresh)
        return heapq.merge(self.archived(), fresh)


class LogIndex:
    """Live records by key, and live bytes by segment."""

    def __init__(self) -> None:
        self.messages: dict[bytes, SeqIndex] = {}  # queue -> seq -> loc
        self.declares: dict[bytes, int] = {}  # queue -> loc of its current DECLARE
        self.bindings: dict[bytes, dict[bytes, int]] = {}  # queue -> event -> loc of BIND
        self.records: dict[bytes, dict[bytes, int]] = {}  # namespace -> key -> loc of PUT
        self.live: dict[int, int] = {}  # segment -> live bytes
        self.live_total = 0

    def _add(self, location: int) -> None:
        segment, size = location >> 64, location & 0xFFFFFFFF
        self.live[segment] = self.live.get(segment, 0) + size
        self.live_total += size

    def _drop(self, location: int) -> None:
        segment, size = location >> 64, location & 0xFFFFFFFF
        self.live[segment] -= size
        self.live_total -= size

    def settle_batch(self, segment: int, added: int, dropped: int) -> None:
        """A batch's live bytes (``log_batch``): ``added`` bytes live in ``segment``,
        and ``dropped`` bytes already taken from their segments leave the total."""
        self.live[segment] = self.live.get(segment, 0) + added
        self.live_total += added - dropped

    def apply_op(self, op: tuple[Any, ...], location: int) -> None:
        """Move the index for one broker op whose record is at ``location``."""
        kind = op[0]
        if kind == ENQUEUE:
            self.put_message(op[1].queue, op[1].seq, location)
        elif kind == REMOVE:
            self.remove_message(op[1], op[2])
        elif kind == REQUEUE:
            self.requeue(op[1].queue, op[2], op[1].seq, location)
        elif kind == DECLARE:
            self.declare(op[1], location)
        elif kind == BIND:
            self.bind(op[1], op[2], location)
        elif kind == UNBIND:
            self.unbind(op[1], op[2])
        elif kind == DELETE_QUEUE:
            self.delete_queue(op[1])
        elif kind == PUT:
            self.put_record(op[1], op[2], location)
        elif kind == DELETE:
            self.delete_record(op[1], op[2])

    def put_message(self, queue: bytes, seq: int, location: int) -> None:
        by_seq = self.messages.get(queue)
        if by_seq is None:
            by_seq = self.messages[queue] = SeqIndex()
        old = by_seq.get(seq)
        if old is None and seq <= by_seq.last:
            old = by_seq.put_old(seq, location)
        else:
            by_seq[seq] = location
            if len(by_seq) > ARCHIVE_AT:
                by_seq.archive()
        if old is not None:
            self._drop(old)
        self._add(location)

    def remove_message(self, queue: bytes, seq: int) -> bool:
        by_seq = self.messages.get(queue)
        if by_seq is None:
            return False
        old = by_seq.pop(seq, None)
        if old is None and seq <= by_seq.last:
            old = by_seq.take(seq)
        if old is None:
            return False
        self._drop(old)
        return True

    def message_location(self, queue: bytes, seq: int) -> int | None:
        by_seq = self.messages.get(queue)
        return None if by_seq is None else by_seq.location(seq)

    def requeue(self, queue: bytes, old_seq: int, seq: int, location: int) -> None:
        if old_seq != seq:
            self.remove_message(queue, old_seq)
        self.put_message(queue, seq, location)

    def declare(self, queue: bytes, location: int) -> None:
        old = self.declares.get(queue)
        if old is not None:
            self._drop(old)
        self.declares[queue] = location
        self._add(location)

    def bind(self, queue: bytes, event: bytes, location: int) -> bool:
        """Record a binding; False (the record is garbage) if it already existed."""
        events = self.bindings.get(queue)
        if events is None:
            events = self.bindings[queue] = {}
        if event in events:
            return False
        events[event] = location
        self._add(location)
        return True

    def move_binding(self, queue: bytes, event: bytes, location: int) -> None:
        """The live BIND record was rewritten (compaction)."""
        self._drop(self.bindings[queue][event])
        self.bindings[queue][event] = location
        self._add(location)

    def unbind(self, queue: bytes, event: bytes) -> None:
        old = self.bindings.get(queue, {}).pop(event, None)
        if old is not None:
            self._drop(old)

    def delete_queue(self, queue: bytes) -> None:
        by_seq = self.messages.pop(queue, None)
        for _, location in () if by_seq is None else by_seq.everything():
            self._drop(location)
        for location in self.bindings.pop(queue, {}).values():
            self._drop(location)
        old = self.declares.pop(queue, None)
        if old is not None:
            self._drop(old)

    def put_record(self, namespace: bytes, key: bytes, location: int) -> None:
        keys = self.records.get(namespace)
        if keys is None:
            keys = self.records[namespace] = {}
        old = keys.get(key)
        if old is not None:
            self._drop(old)
        keys[key] = location
        self._add(location)

    def delete_record(self, namespace: bytes, key: bytes) -> None:
        old = self.records.get(namespace, {}).pop(key, None)
        if old is not None:
            self._drop(old)

    def queue_names(self) -> set[bytes]:
        return set(self.messages) | set(self.declares) | set(self.bindings)
