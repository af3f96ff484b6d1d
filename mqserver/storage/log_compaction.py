# -*- test-case-name: tests.unit.test_storage_log -*-
"""Compaction of the log backend: rewrite the head segment's live records, then delete it.

Why the head only: if only the oldest segment is ever deleted, a gap in the
segment numbers always means a lost file, and tombstones (REMOVE, UNBIND,
DELETE_QUEUE, DELETE) never need rewriting, because whatever they cancel is
in their own segment or an older one, which is gone before they are.

When the total size exceeds ``garbage_ratio`` times the live bytes plus one
segment (beanstalkd's rule), the head's records are scanned in slices of
``slice_bytes``.  Parsing happens in the store thread; the reactor only
checks each record's key against the index and frames the live ones at the
tail, which ``max_slice_seconds`` records (about a millisecond per 8 KiB
slice here).  Once nothing in the head is live, the store thread fsyncs the
copies and unlinks it.  A head with nothing live is unlinked at once.  Under
steady publish + ack the disk use stays near twice the live bytes plus a
few segments (``tests/unit/test_storage_log.py`` measures it).

A compaction that fails is logged and not retried until the next restart:
retrying a failing disk operation in a loop would only fill the log.
"""

from __future__ import annotations

import time
from itertools import chain
from typing import Any

from twisted.internet.defer import Deferred, inlineCallbacks, succeed
from twisted.logger import Logger

from mqserver.storage import log_records as records
from mqserver.storage.log_checkpoint import Checkpointer
from mqserver.storage.log_index import LogIndex, loc
from mqserver.storage.log_segment import SegmentFiles
from mqserver.storage.worker import StoreThread

log = Logger()

LOOKUP_MESSAGES = 100_000
"""Steps up to which compaction looks a head's live messages up in the index (a
walk of every queue's dict entries and archived runs, ~10 ms per 100,000:
``SeqIndex.locations_in``) rather than scanning the head (~1 s of CPU for a 64
MiB segment)."""


class Compaction:
    """Mixin for ``LogStore``: the compaction half of the store, on the reactor thread."""

    # provided by LogStore
    segment_bytes: int
    garbage_ratio: float
    slice_bytes: int
    is_open: bool
    _thread: StoreThread
    _files: SegmentFiles
    _index: LogIndex
    _segments: dict[int, int]
    _total: int
    _active: int
    _next_seq: int
    _failure: Any
    _closing: bool
    _roll: Any
    _grow: Any
    _write: Any
    _job: Any
    checkpoints: Checkpointer

    _compaction: Deferred[None] | None = None
    _compaction_failed = False
    records_copied = 0
    segments_deleted = 0
    max_slice_seconds = 0.0

    def compaction_idle(self) -> Deferred[None]:
        """Fires when no compaction is running and none is due (tests, benchmarks)."""
        if self._compaction is None:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._compaction.addBoth(lambda _: self.compaction_idle().chainDeferred(d))
        return d

    def _should_compact(self) -> bool:
        if len(self._segments) < 2:
            return False
        head = next(iter(self._segments))
        if head == self._active:
            return False
        if self._index.live.get(head, 0) <= 0:
            return True
        return self._total > self.garbage_ratio * self._index.live_total + self.segment_bytes

    def _maybe_compact(self) -> None:
        try:
            if (self._compaction is not None or self._closing or not self.is_open
                    or self._failure is not None or self._compaction_failed
                    or not self._should_compact()):
                return
            d = self._compaction = self._compact()
            d.addErrback(self._compaction_error)
            d.addBoth(self._compaction_done)
        except Exception:
            log.failure("could not start log compaction")

    def _compaction_error(self, failure: Any) -> None:
        self._compaction_failed = True
        log.failure("log compaction failed; it is retried after the next restart", failure)

    def _compaction_done(self, _: Any) -> None:
        self._compaction = None
        self._maybe_compact()

    @inlineCallbacks
    def _compact(self) -> Any:
        head = next(iter(self._segments))
        spans = self._live_spans(head)
        if spans is not None:
            yield self._copy_spans(head, spans)
        offset = records.HEADER_SIZE
        while self._index.live.get(head, 0) > 0 and not self._closing:
            found, offset, size = yield self._thread.run(
                self._files.scan_thd, head, offset, self.slice_bytes
            )
            if self._closing:
                return
            copy = self._copy_live(head, found)
            if copy is not None:
                yield copy
            if offset >= size:
                break
        if self._closing:
            return
        if self._index.live.get(head, 0) > 0:
            raise RuntimeError(f"segment {head}: {self._index.live[head]} live bytes were not "
                               "found in it; keeping it")
        yield self._job(self._files.drop_thd, head)
        self._total -= self._segments.pop(head)
        self._index.live.pop(head, None)
        self.segments_deleted += 1
        self.checkpoints.dropped(head)

    def _live_spans(self, head: int) -> list[tuple[int, int]] | None:
        """(offset, frame size) of every live record in ``head``, from the index,
        or None when a scan of the segment is cheaper than finding them.

        A head is typically dead but for a few records: a queue's DECLARE and
        BINDs, PUT records, a message nobody acked.  Scanning its 64 MiB for
        them parses every record in it (about a second of CPU, taken from the
        broker through the GIL, in the middle of whatever load is running);
        the index already knows where they are.  Non-message records are few,
        so they are always looked up; messages only while walking the index
        takes at most ``LOOKUP_MESSAGES`` steps (an entry of a queue's dict, a
        run of its archived ones).
        """
        index, spans, found = self._index, [], 0
        for location in chain(index.declares.values(),
                              *(events.values() for events in index.bindings.values()),
                              *(keys.values() for keys in index.records.values())):
            if location >> 64 == head:
                spans.append(location)
                found += location & 0xFFFFFFFF
        if found < index.live.get(head, 0):
            if sum(by_seq.lookup_cost() for by_seq in index.messages.values()) \
                    > LOOKUP_MESSAGES:
                return None
            for by_seq in index.messages.values():
                spans += by_seq.locations_in(head)
        return sorted(((location >> 32) & 0xFFFFFFFF, location & 0xFFFFFFFF)
                      for location in spans)

    @inlineCallbacks
    def _copy_spans(self, head: int, spans: list[tuple[int, int]]) -> Any:
        """Read the records at ``spans`` (store thread) and copy them, a slice's worth at a time."""
        start = 0
        while start < len(spans) and not self._closing:
            end, budget = start, 0
            while end < len(spans) and budget < self.slice_bytes:
                budget += spans[end][1]
                end += 1
            found = yield self._thread.run(self._files.read_records_thd, head, spans[start:end])
            if self._closing:
                return
            copy = self._copy_live(head, found)
            if copy is not None:
                yield copy
            start = end

    def _copy_live(self, head: int, found: list[tuple[int, int, int, Any, bytes]]) -> Any:
        """Rewrite the still-live records of one slice at the tail (reactor thread, bounded)."""
        started = time.perf_counter()
        index = self._index
        keep = []
        for offset, size, kind, key, payload in found:
            location = loc(head, offset, size)
            if kind in records.MESSAGE_KINDS:
                live = index.message_location(key[0], key[1]) == location
            elif kind == records.K_DECLARE:
                live = index.declares.get(key) == location
            elif kind == records.K_PUT:
                live = index.records.get(key[0], {}).get(key[1]) == location
            else:
                live = index.bindings.get(key[0], {}).get(key[1]) == location
            if live:
                keep.append((kind, key, payload))
        result = None
        if keep:
            if self._segments[self._active] >= self.segment_bytes:
                self._roll()
            segment = self._active
            start = offset = self._segments[segment]
            frames = []
            for kind, key, payload in keep:
                if kind in records.MESSAGE_KINDS:
                    data = records.frame(records.as_enqueue(payload))
                    index.put_message(key[0], key[1], loc(segment, offset, len(data)))
                elif kind == records.K_DECLARE:
                    data = records.frame(payload)
                    index.declare(key, loc(segment, offset, len(data)))
                elif kind == records.K_PUT:
                    data = records.frame(payload)
                    index.put_record(key[0], key[1], loc(segment, offset, len(data)))
                else:
                    data = records.frame(payload)
                    index.bind(key[0], key[1], loc(segment, offset, len(data)))
                frames.append(data)
                offset += len(data)
            frames.append(records.frame(records.encode_commit(len(keep), self._next_seq)))
            data = b"".join(frames)
            self._grow(segment, start + len(data))
            self.records_copied += len(keep)
        # the reactor's own work on the slice: handing the write to the store
        # thread can wait for the GIL, which is not the slice's cost
        self.max_slice_seconds = max(self.max_slice_seconds, time.perf_counter() - started)
        if keep:
            result = self._write(data, False)
        return result
