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
from mqserver.storage.log_seq_index import SeqIndex


def loc(segment: int, offset: int, size: int) -> int:
    """One int for (segment, offset, size): ~36 bytes per live message instead of a tuple."""
    return (segment << 64) | (offset << 32) | size


def loc_segment(location: int) -> int:
    return location >> 64


def loc_size(location: int) -> int:
    return location & 0xFFFFFFFF


ARCHIVE_AT = 262_144
"""Entries a queue's ``SeqIndex`` keeps in its dict before they move to its runs: above
W1's 200,000-message backlog, so ordinary backlogs never pay for the runs (a
remove there is a Python call, about 1 us, where a dict's pop costs 0.1)."""


class LogIndex:
    """Live records by key, and live bytes by segment."""

    def __init__(self) -> None:
        self.messages: dict[bytes, SeqIndex] = {}  # queue -> seq -> loc
        self.declares: dict[bytes, int] = {}  # queue -> loc of its current DECLARE
        self.bindings: dict[bytes, dict[bytes, int]] = {}  # queue -> event -> loc of BIND
        self.records: dict[bytes, dict[bytes, int]] = {}  # namespace -> key -> loc of PUT
        self.live: dict[int, int] = {}  # segment -> live bytes
        self.live_total = 0
        # no live message with a TTL has a seq above this one (``expiring``): a
        # checkpoint's restart reads no flags between it and the checkpoint's
        # next seq (``log_chunks.expiring_seqs``)
        self.ttl_seq = 0

    def expiring(self, message: Any) -> None:
        """``message`` (ENQUEUE, REQUEUE) is written: mark it if it has a TTL."""
        if message.expires_at is not None and message.seq > self.ttl_seq:
            self.ttl_seq = message.seq

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
            self.expiring(op[1])
        elif kind == REMOVE:
            self.remove_message(op[1], op[2])
        elif kind == REQUEUE:
            self.requeue(op[1].queue, op[2], op[1].seq, location)
            self.expiring(op[1])
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

    def bind(self, queue: bytes, event: bytes, location: int) -> None:
        """The binding's live record is its newest BIND, as a DECLARE's and a PUT's:
        a bind of an existing binding, or compaction's copy of its record, moves
        it.  So a replay that never saw a deleted segment's record and the index
        that moved past it agree on where it is (a checkpoint's walk too)."""
        events = self.bindings.get(queue)
        if events is None:
            events = self.bindings[queue] = {}
        old = events.get(event)
        if old is not None:
            self._drop(old)
        events[event] = location
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
