# -*- test-case-name: tests.unit.test_storage_log -*-
"""Rebuild the broker's state from the log's segments (runs in the store thread).

What recovery does with damage, and why:

- **Torn tail** (a crash mid-write): the newest segment is cut back to the
  end of its last complete batch and the number of bytes is logged.  Those
  bytes were never acknowledged: a batch's Deferred fires only after its
  COMMIT record is written.
- **A corrupt record** (a flipped byte): its CRC fails; the walk skips to the
  next offset where a record checks again, logs how many bytes it skipped,
  and keeps going.  The other ops of that batch are still applied: each op
  is self-contained, and losing a REMOVE only brings a message back
  (at-least-once), never loses one.
- **A missing segment**: segments are numbered consecutively and only the
  oldest is ever deleted, so a gap means lost files.  It is logged; the
  segments around it are recovered.
- **A segment from a newer mqserver** stops the start-up (StoreFormatError):
  guessing at a format we do not know would be worse than refusing.

Log lines are returned as notes and logged by the reactor thread.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
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
    Message,
    QueueOptions,
    Recovered,
    RecoveredQueue,
)
from mqserver.packed import Backlog, Chunk, share_recovered_values
from mqserver.storage import log_records as records
from mqserver.storage import snapshot
from mqserver.storage.errors import StoreFormatError
from mqserver.storage.log_chunks import (
    DECODE_ERRORS,
    ReplayChunk,
    any_within,
    expiring_seqs,
    message_fields,
)
from mqserver.storage.log_index import LogIndex, loc
from mqserver.storage.log_segment import Data, SegmentFiles


@dataclass
class RecoveryResult:
    recovered: Recovered
    index: LogIndex
    segments: dict[int, int]  # number -> size in bytes, oldest first
    next_seq: int
    notes: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    truncated: int = 0  # bytes cut off torn tails
    skipped: int = 0  # damaged bytes skipped
    walked: int = 0  # bytes of segments walked (from a checkpoint's position, or all)
    checkpoint: tuple[int, int] | None = None  # (segment, offset) it started from


class Replay:
    """Applies recovered ops to the index, the options and the records.

    Messages are not decoded while the log is replayed: the index keeps where
    each live one is, and ``result`` packs only those, in seq order, into a
    ``Backlog`` per queue, a chunk's worth at a time, each a ``ReplayChunk``
    the broker decodes once it serves (``log_chunks``; one with a TTL at
    once).  So a message published and acked long ago costs nothing, and a
    million live ones are never a million objects at once.

    Nearly every record is an ENQUEUE, a REMOVE or a COMMIT, and a crash
    restart walks a million of them: ``segment`` walks valid frames with
    those three inline (``_walk``, few interpreter steps a record) and
    ``_commit`` hands the two message ops straight to the index; every other
    op goes through ``replay_op`` and ``apply``.  The first frame that does
    not check hands the rest of the segment to the careful walk
    (``records.iter_frames``), which skips damage and says where.
    """

    def __init__(self) -> None:
        self.index = LogIndex()
        self.options: dict[bytes, QueueOptions] = {}
        self.records: dict[bytes, dict[bytes, bytes]] = {}
        self.next_seq = 1
        self.walked = 0  # records of the batches applied (not their COMMITs)
        self.plain = range(0)  # seqs known to have no TTL (``log_chunks.expiring_seqs``)

    def apply(self, op: tuple[Any, ...], location: int) -> None:
        """One op, as ``replay_op`` gives it (messages by queue and seq only)."""
        kind, index = op[0], self.index
        if kind == ENQUEUE:
            index.put_message(op[1], op[2], location)
            if op[2] >= self.next_seq:
                self.next_seq = op[2] + 1
        elif kind == REMOVE:
            index.remove_message(op[1], op[2])
        elif kind == REQUEUE:
            index.requeue(op[1], op[3], op[2], location)
            self.next_seq = max(self.next_seq, op[2] + 1, op[3] + 1)
        elif kind == DECLARE:
            self.options[op[1]] = op[2]
            index.declare(op[1], location)
        elif kind == BIND:
            index.bind(op[1], op[2], location)
        elif kind == UNBIND:
            index.unbind(op[1], op[2])
        elif kind == DELETE_QUEUE:
            self.options.pop(op[1], None)
            index.delete_queue(op[1])
        elif kind == PUT:
            self.records.setdefault(op[1], {})[op[2]] = op[3]
            index.put_record(op[1], op[2], location)
        elif kind == DELETE:
            self.records.get(op[1], {}).pop(op[2], None)
            index.delete_record(op[1], op[2])

    def segment(self, number: int, data: bytes, result: RecoveryResult,
                start: int = records.HEADER_SIZE) -> int:
        """Replay one segment's records from ``start`` (a batch's first record: its
        header's end, or a checkpoint's position); returns the end offset of its
        last complete batch."""
        pending: list[tuple[Any, ...]] = []
        pos, good_end = self._walk(number, data, pending, start)
        if pos < len(data):
            good_end = self._careful(number, data, pos, good_end, pending, result)
        if pending:
            result.notes.append(("warn", f"log segment {number}: {len(pending)} records of an "
                                         "unfinished batch (never acknowledged) discarded"))
        return good_end

    def _walk(self, number: int, data: bytes, pending: list[tuple[Any, ...]],
              start: int = records.HEADER_SIZE) -> tuple[int, int]:
        """Replay valid frames from ``start`` on, each batch at its COMMIT;
        (where the walk stopped: the end or a frame that does not check, the end of
        the last batch applied).  ``pending`` holds the ops of an unfinished batch,
        ENQUEUE as ``(K_ENQUEUE, queue, seq, location)``, REMOVE as ``(K_REMOVE,
        queue, seq)``, the others as ``(0, op, location)``."""
        unpack_frame, magic, frame_size = records.FRAME.unpack_from, records.RECORD_MAGIC, \
            records.FRAME_SIZE
        length_crcs, crc32, most = records.LENGTH_CRCS, zlib.crc32, records.MAX_PAYLOAD
        small = len(length_crcs)
        key, seq_of, commit_of = _ENQUEUE_KEY.unpack_from, _SEQ.unpack_from, _COMMIT.unpack_from
        append = pending.append
        view = memoryview(data)
        end = len(data)
        base = number << 64
        pos = good_end = start
        while end - pos >= frame_size:
            mark, length, crc = unpack_frame(data, pos)
            start = pos + frame_size
            stop = start + length
            if (mark != magic or not 0 < length <= most or stop > end
                    or crc32(data[start:stop], length_crcs[length] if length < small
                             else crc32(data[pos + 2:pos + 6])) != crc):
                break
            kind = data[start]
            if kind == K_ENQUEUE and length >= QUEUE_AT:
                seq, size = key(data, start + 1)
                append((K_ENQUEUE, data[start + QUEUE_AT:start + QUEUE_AT + size], seq,
                        base | (pos << 32) | (stop - pos)))
            elif kind == K_REMOVE and length >= 9:
                append((K_REMOVE, data[start + 9:stop], seq_of(data, start + 1)[0]))
            elif kind == K_COMMIT and length == _COMMIT_SIZE:
                count, next_seq = commit_of(data, start + 1)
                if count != len(pending):
                    break  # the careful walk says what the batch lost
                self._commit(pending)
                pending.clear()
                if next_seq > self.next_seq:
                    self.next_seq = next_seq
                good_end = stop
            else:
                try:
                    op = replay_op(view[start:stop])
                except (records.FormatError, struct.error, ValueError, UnicodeDecodeError):
                    break
                if op[0] == "commit":
                    break
                append((0, op, base | (pos << 32) | (stop - pos)))
            pos = stop
        return pos, good_end

    def _careful(self, number: int, data: bytes, pos: int, good_end: int,
                 pending: list[tuple[Any, ...]], result: RecoveryResult) -> int:
        """The rest of the segment from ``pos``, with damage skipped and logged: a
        batch that lost records is applied with what is left."""
        damaged = False
        notes = result.notes
        for offset, size, payload in records.iter_frames(data, pos, len(data)):
            if payload is None:
                damaged = True
                result.skipped += -size
                notes.append(("error", f"log segment {number}: {-size} damaged bytes at offset "
                                       f"{offset} skipped (checksum or framing mismatch)"))
                continue
            try:
                op = replay_op(payload)
            except (records.FormatError, struct.error, ValueError, UnicodeDecodeError) as e:
                damaged = True
                notes.append(("error", f"log segment {number}: record at offset {offset} "
                                       f"cannot be decoded ({e}); skipped"))
                continue
            if op[0] == "commit":
                if damaged or op[1] != len(pending):
                    notes.append(("warn", f"log segment {number}: the batch ending at offset "
                                          f"{offset} lost records ({len(pending)} of {op[1]} "
                                          "left); applying what is left"))
                self._commit(pending)
                pending.clear()
                damaged = False
                self.next_seq = max(self.next_seq, op[2])
                good_end = offset + size
            else:
                pending.append((0, op, loc(number, offset, size)))
        return good_end

    def _commit(self, pending: list[tuple[Any, ...]]) -> None:
        """Apply a batch's ops: ENQUEUE and REMOVE straight to the index, the others
        through ``apply``."""
        index = self.index
        put, remove = index.put_message, index.remove_message
        next_seq = self.next_seq
        self.walked += len(pending)
        for item in pending:
            kind = item[0]
            if kind == K_ENQUEUE:
                put(item[1], item[2], item[3])
                if item[2] >= next_seq:
                    next_seq = item[2] + 1
            elif kind == K_REMOVE:
                remove(item[1], item[2])
            else:
                self.next_seq = next_seq
                self.apply(item[1], item[2])
                next_seq = self.next_seq
        self.next_seq = next_seq

    def result(self, segments: dict[int, Data], notes: list[tuple[str, str]]) -> Recovered:
        """The state, each live message in ``segments`` (number -> data) packed."""
        recovered = Recovered(
            next_seq=self.next_seq,
            records={ns: dict(values) for ns, values in self.records.items() if values},
        )
        size, lock = Backlog.chunk_size, threading.Lock()
        self.index.ttl_seq = 0  # the newest live one with a TTL, found below
        for name in self.index.queue_names():
            by_seq = self.index.messages.get(name)
            backlog = Backlog()
            blocks = iter(()) if by_seq is None else by_seq.blocks(size)
            expiring = [] if by_seq is None else expiring_seqs(segments, by_seq, self.plain)
            if expiring and expiring[-1] > self.index.ttl_seq:
                self.index.ttl_seq = expiring[-1]
            for first, last, seqs, locations in blocks:
                if len(seqs) == size and not any_within(expiring, first, last):
                    # decoded once the broker serves (``log_chunks``)
                    backlog.append_chunk(ReplayChunk(name, segments, locations, first, last,
                                                     lock))
                    continue
                rows: list[tuple[Any, ...]] = []
                for seq, location in zip(seqs, locations, strict=True):
                    try:
                        rows.append(message_fields(segments, location))
                    except DECODE_ERRORS as e:
                        notes.append(("error", f"log: message {seq} of queue {name!r} cannot "
                                               f"be decoded ({e}); skipped"))
                if len(rows) == size:
                    # packed as they are decoded, never made messages
                    backlog.append_chunk(Chunk.of_columns(*zip(*rows, strict=True)))
                else:
                    backlog.extend(Message(*row) for row in rows)
            recovered.queues[name] = RecoveredQueue(
                name,
                self.options.get(name, QueueOptions()),
                set(self.index.bindings.get(name, ())),
                backlog,
            )
        share_recovered_values(recovered.queues.values())
        return recovered


_MASK = 0xFFFFFFFF


def replay_op(payload: Any) -> tuple[Any, ...]:
    """``log_records.decode``, but a message op by its queue and seq alone:
    ``(ENQUEUE, queue, seq)``, ``(REQUEUE, queue, seq, old_seq)``."""
    kind = payload[0]
    if kind == K_ENQUEUE:  # nearly every record: message_key inline
        head = HEAD.unpack_from(payload, 1)
        return (ENQUEUE, payload[QUEUE_AT:QUEUE_AT + head[5]], head[0])
    if kind == records.K_REQUEUE:
        queue, seq = records.message_key(payload)
        return (REQUEUE, queue, seq, _SEQ.unpack_from(payload, 1)[0])
    return records.decode(payload)


_SEQ = struct.Struct(">Q")
K_ENQUEUE, K_REMOVE, K_COMMIT = records.K_ENQUEUE, records.K_REMOVE, records.K_COMMIT
HEAD = records.MESSAGE_HEAD
QUEUE_AT = 1 + HEAD.size
_ENQUEUE_KEY = struct.Struct(">Q21xI")  # MESSAGE_HEAD's seq and queue length alone
_COMMIT = records.COMMIT
_COMMIT_SIZE = 1 + _COMMIT.size


def recover_thd(files: SegmentFiles) -> RecoveryResult:
    """Read every segment, repair the newest one's tail, and rebuild the state."""
    started = time.perf_counter()
    replay = Replay()
    result = RecoveryResult(Recovered(), replay.index, {}, 1)
    kept = walk_thd(files, replay, result, files.segments_thd(), records.HEADER_SIZE)
    return finish(files, replay, result, kept, started)


def walk_thd(files: SegmentFiles, replay: Replay, result: RecoveryResult, numbers: list[int],
             start: int) -> dict[int, Data]:
    """Replay segments ``numbers``, the first from ``start``, the others whole; repair
    the newest one's tail; what each replayed segment holds, for ``Replay.result``."""
    kept: dict[int, Data] = {}
    previous: int | None = None
    for position, number in enumerate(numbers):
        newest = position == len(numbers) - 1
        if previous is not None and number != previous + 1:
            gap = f"{previous + 1}" if number == previous + 2 else f"{previous + 1}..{number - 1}"
            result.notes.append(("error", f"log segment(s) {gap} missing from {files.directory}: "
                                          "their records are lost; recovering the others"))
        previous = number
        data = files.map_thd(number)
        try:
            header_number, header_next = records.decode_header(data)
            if header_number != number:
                raise records.FormatError(f"header says segment {header_number}")
        except records.VersionError as e:
            raise StoreFormatError(f"{files.path(number)}: {e}") from e
        except records.FormatError as e:
            if newest and len(data) <= records.HEADER_SIZE:
                # created, but the crash came before its header was complete
                files.remove_thd(number)
                result.truncated += len(data)
                result.notes.append(("warn", f"log segment {number}: torn header "
                                             f"({len(data)} bytes); segment removed"))
                continue
            result.notes.append(("error", f"log segment {number} unreadable ({e}); its "
                                          f"{len(data)} bytes are skipped"))
            result.skipped += len(data)
            result.segments[number] = len(data)
            continue
        replay.next_seq = max(replay.next_seq, header_next)
        first = start if position == 0 else records.HEADER_SIZE
        end = replay.segment(number, data, result, first)
        result.walked += max(0, len(data) - first)
        if end < len(data):
            if newest:
                torn = len(data) - end
                data = data[:end]  # read, not mapped: nothing may touch a mapping past the end
                files.truncate_thd(number, end)
                result.truncated += torn
                result.notes.append(("warn", f"log segment {number}: torn tail of "
                                             f"{torn} bytes truncated at offset {end}"))
            else:
                result.notes.append(("warn", f"log segment {number}: {len(data) - end} bytes "
                                             "after its last complete batch ignored"))
        result.segments[number] = len(data)
        kept[number] = data
    return kept


def finish(files: SegmentFiles, replay: Replay, result: RecoveryResult, kept: dict[int, Data],
           started: float) -> RecoveryResult:
    """The replayed state packed into ``result``, and the line that says how long it took."""
    result.recovered = replay.result(kept, result.notes)
    result.next_seq = replay.next_seq
    # what the bench reads as the store's own recovery time
    # (``bench.workloads.reported_recovery``)
    result.notes.append(("info", f"log {files.directory}: {len(result.recovered.queues)} queues, "
                                 f"{snapshot.message_count(result.recovered)} messages recovered "
                                 f"in {time.perf_counter() - started:.3f} s (replay)"))
    return result
