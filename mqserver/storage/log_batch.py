# -*- test-case-name: tests.unit.test_log_batch -*-
"""One pass over a batch of ops: each op's framed record, and the index moved to it.

This runs on the reactor thread for every op the broker stores, where it
competes with the broker itself, so it is written for few interpreter steps
per op.  Nearly every op of a busy broker is an ENQUEUE of a plain message
(no event, headers, source or expiry) or a REMOVE; those two are encoded and
indexed inline here.  Every other op takes the general path,
``log_records.encode_op`` and ``LogIndex.apply_op``, and
``tests/unit/test_log_batch.py`` holds the inline path to it: the same bytes,
byte for byte, and the same index.

Live bytes are summed per batch: everything the batch adds lives in the one
segment it is written to, so that is one update at the end instead of one
per op.
"""

from __future__ import annotations

import zlib
from typing import Any

from mqserver.model import ENQUEUE, REMOVE, REQUEUE
from mqserver.storage import log_index
from mqserver.storage import log_records as records
from mqserver.storage.log_index import LogIndex, SeqIndex

_SIZE_MASK = 0xFFFFFFFF  # the frame size in a ``loc``


def encode_batch(
    ops: list[tuple[Any, ...]], index: LogIndex, segment: int, start: int, next_seq: int
) -> tuple[list[bytes], int]:
    """(frame headers and payloads to join, the next free seq after the batch).

    The batch is to be written at ``start`` in ``segment``; ``index`` is
    moved there as it goes.  An op that does not encode raises with the
    index moved for the ops before it: the caller must stop the store.
    """
    encode, frame_header = records.encode_op, records.frame_header
    plain_head, remove_head = records.ENQUEUE_HEAD.pack, records.REMOVE_HEAD.pack
    k_enqueue, k_remove = records.K_ENQUEUE, records.K_REMOVE
    frame_pack, magic, frame_size = records.FRAME.pack, records.RECORD_MAGIC, records.FRAME_SIZE
    length_crcs, crc32 = records.LENGTH_CRCS, zlib.crc32
    small = len(length_crcs)
    messages, live = index.messages, index.live
    archive_at = log_index.ARCHIVE_AT  # read here: a test may make it small
    live.setdefault(segment, 0)  # an op may drop a record this batch wrote
    parts: list[bytes] = []
    append = parts.append
    base = (segment << 64) | (start << 32)  # loc(segment, start, 0)
    offset = added = dropped = 0  # offset in the batch; live bytes added, dropped
    for op in ops:
        kind = op[0]
        # the payload: encode_op's bytes
        if kind == ENQUEUE:
            message = op[1]
            if (message.event is None and message.headers is None and message.source is None
                    and message.expires_at is None):
                # encode_message's layout with flags 0 and three empty fields
                queue, mid, body = message.queue, message.id, message.body
                payload = b"".join((
                    plain_head(k_enqueue, message.seq, message.created_at, 0.0, message.retry,
                               0, len(queue), len(mid), 0, 0, 0, len(body)),
                    queue, mid, body,
                ))
            else:
                payload = encode(op)
                index.expiring(message)
        elif kind == REMOVE:
            payload = remove_head(k_remove, op[2]) + op[1]
        else:
            payload = encode(op)
        # its frame: frame_header's bytes, the CRC seed from its table
        size = len(payload)
        append(frame_pack(magic, size, crc32(payload, length_crcs[size]))
               if size < small else frame_header(payload))
        append(payload)
        size += frame_size
        location = base + (offset << 32) + size
        offset += size
        # the index: put_message and remove_message inline, live bytes summed
        if kind == ENQUEUE:
            seq = message.seq
            by_seq = messages.get(message.queue)
            if by_seq is None:
                by_seq = messages[message.queue] = SeqIndex()
            old = by_seq.get(seq)
            if old is None and seq <= by_seq.last:  # an archived seq (SeqIndex)
                old = by_seq.put_old(seq, location)
            else:
                by_seq[seq] = location
                if len(by_seq) > archive_at:
                    by_seq.archive()
            added += size
            if old is not None:
                live[old >> 64] -= old & _SIZE_MASK
                dropped += old & _SIZE_MASK
            if seq >= next_seq:
                next_seq = seq + 1
        elif kind == REMOVE:
            by_seq = messages.get(op[1])
            old = None if by_seq is None else by_seq.pop(op[2], None)
            if old is None and by_seq is not None and op[2] <= by_seq.last:
                old = by_seq.take(op[2])
            if old is not None:
                live[old >> 64] -= old & _SIZE_MASK
                dropped += old & _SIZE_MASK
        else:
            index.apply_op(op, location)
            if kind == REQUEUE:  # as a replay counts it: the old seq too
                next_seq = max(next_seq, op[1].seq + 1, op[2] + 1)
    index.settle_batch(segment, added, dropped)
    return parts, next_seq
