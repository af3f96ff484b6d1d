# -*- test-case-name: tests.unit.test_storage_log -*-
"""The on-disk format of the log backend: segment headers, record frames, op payloads.

Pure functions only, so the format can be tested (and read by tools)
without a store.  Layout (all integers big-endian):

Segment header, 32 bytes::

    b"MQSRVLOG" | u16 format version | u16 flags (0) | u64 segment number
    | u64 next free seq when the segment was started | u32 crc32 of the above

Record frame, 10 bytes + payload::

    b"\\xa5\\x5a" | u32 payload length | u32 crc32(length bytes + payload) | payload

The magic lets recovery find the next record after damage (scan for it, then
trust a candidate only if its CRC matches); covering the length with the CRC
means a flipped length bit is caught too.  The payload's first byte is its
kind; a batch of ops ends with a COMMIT record that counts them, so recovery
applies a batch only when all of it is there.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
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
)

FORMAT_VERSION = 1
SEGMENT_MAGIC = b"MQSRVLOG"
_HEADER = struct.Struct(">8sHHQQ")
HEADER_SIZE = _HEADER.size + 4

RECORD_MAGIC = b"\xa5\x5a"
FRAME = struct.Struct(">2sII")
FRAME_SIZE = FRAME.size
_LENGTH = struct.Struct(">I")
MAX_PAYLOAD = 1 << 30

# payload kinds
(K_ENQUEUE, K_REQUEUE, K_REMOVE, K_DECLARE, K_BIND, K_UNBIND, K_DELETE_QUEUE, K_COMMIT,
 K_PUT, K_DELETE) = range(1, 11)
MESSAGE_KINDS = (K_ENQUEUE, K_REQUEUE)
KEPT_KINDS = frozenset((K_ENQUEUE, K_REQUEUE, K_DECLARE, K_BIND, K_PUT))
"""Kinds whose record can be the live copy of something (the rest are tombstones)."""

# seq, created_at, expires_at, retry, flags, then six lengths:
# queue, id, event, headers (JSON, ASCII-escaped), source, body
_MSG = struct.Struct(">QddIBIIIIII")
_MSG_SIZE = _MSG.size
_HAS_EXPIRES, _HAS_EVENT, _HAS_HEADERS, _HAS_SOURCE = 1, 2, 4, 8
_SEQ = struct.Struct(">Q")
_LEN = struct.Struct(">I")
# flags, delete_when_unused, max_length, default_ttl, len(queue)
_OPTIONS = struct.Struct(">BdqdI")
# flag bits 5-6 of a DECLARE: the overflow policy (0: the server default).
# Older readers ignore the bits and so see the default, which is what a
# queue declared before the option existed had.
_OVERFLOW_FLAGS = {None: 0, "drop-head": 1, "reject-publish": 2}
_OVERFLOW_NAMES = {0: None, 1: "drop-head", 2: "reject-publish", 3: None}
_COMMIT = struct.Struct(">IQ")
COMMIT = _COMMIT
"""A COMMIT payload after its kind byte: the batch's op count, then its next free seq."""
# The head of a payload with its kind byte first: ENQUEUE, REQUEUE (then the
# old seq), REMOVE (then the seq).  One pack instead of a pack and a concat.
ENQUEUE_HEAD = struct.Struct(">B" + _MSG.format[1:])
_REQUEUE_HEAD = struct.Struct(">BQ" + _MSG.format[1:])
REMOVE_HEAD = struct.Struct(">BQ")
# crc32 of the four length bytes that start every frame's checksum, for the
# payload sizes most records have (a table lookup instead of a pack and a crc)
LENGTH_CRCS = [zlib.crc32(_LENGTH.pack(size)) for size in range(4096)]
_TWO_LENGTHS = struct.Struct(">II")


class FormatError(ValueError):
    """Bytes that are not a valid header or payload."""


class VersionError(FormatError):
    """A valid header of a format version this code does not read (a newer mqserver's)."""


def encode_header(segment: int, next_seq: int) -> bytes:
    head = _HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, segment, next_seq)
    return head + _LENGTH.pack(zlib.crc32(head))


def decode_header(data: bytes) -> tuple[int, int]:
    """(segment number, next_seq) of a header; FormatError if it is not ours or too new."""
    if len(data) < HEADER_SIZE:
        raise FormatError(f"header is {len(data)} bytes, needs {HEADER_SIZE}")
    head = data[: _HEADER.size]
    (crc,) = _LENGTH.unpack_from(data, _HEADER.size)
    if zlib.crc32(head) != crc:
        raise FormatError("header checksum mismatch")
    magic, version, _flags, segment, next_seq = _HEADER.unpack(head)
    if magic != SEGMENT_MAGIC:
        raise FormatError("not an mqserver log segment")
    if version != FORMAT_VERSION:
        raise VersionError(f"format version {version}, this mqserver reads {FORMAT_VERSION}")
    return segment, next_seq


def frame_header(payload: bytes) -> bytes:
    """The 10 bytes that go before ``payload`` in its frame.

    Apart from the payload, so a batch joins headers and payloads once
    instead of copying each payload into its frame and then into the batch.
    """
    size = len(payload)
    seed = LENGTH_CRCS[size] if size < len(LENGTH_CRCS) else zlib.crc32(_LENGTH.pack(size))
    return FRAME.pack(RECORD_MAGIC, size, zlib.crc32(payload, seed))


def frame(payload: bytes) -> bytes:
    return frame_header(payload) + payload


def _valid_at(buf: Any, pos: int, end: int) -> int:
    """Payload length of a valid record at ``pos``, or -1."""
    if end - pos < FRAME_SIZE:
        return -1
    magic, length, crc = FRAME.unpack_from(buf, pos)
    if magic != RECORD_MAGIC or length == 0 or length > MAX_PAYLOAD \
            or length > end - pos - FRAME_SIZE:
        return -1
    start = pos + FRAME_SIZE
    # the CRC of the length bytes from the table, as frame_header takes it
    seed = LENGTH_CRCS[length] if length < len(LENGTH_CRCS) else zlib.crc32(buf[pos + 2:pos + 6])
    if zlib.crc32(buf[start : start + length], seed) != crc:
        return -1
    return length


def iter_frames(buf: Any, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """Walk records from ``pos``: yields (offset, frame size, payload).

    Damage yields (offset, -bytes skipped, None): the walk resumes at the next
    offset where a record's magic and CRC both check, or stops at ``end``.
    """
    while pos < end:
        length = _valid_at(buf, pos, end)
        if length >= 0:
            start = pos + FRAME_SIZE
            yield pos, FRAME_SIZE + length, buf[start : start + length]
            pos = start + length
            continue
        found = pos
        while True:
            found = buf.find(RECORD_MAGIC, found + 1, end)
            if found < 0 or _valid_at(buf, found, end) >= 0:
                break
        resume = end if found < 0 else found
        yield pos, -(resume - pos), None
        pos = resume


# -- payloads ---------------------------------------------------------------


def encode_message(kind: int, message: Message, old_seq: int = 0) -> bytes:
    flags = 0
    expires = message.expires_at
    if expires is not None:
        flags |= _HAS_EXPIRES
    event = message.event
    if event is not None:
        flags |= _HAS_EVENT
    headers = b""
    if message.headers is not None:
        flags |= _HAS_HEADERS
        # ASCII-escaped JSON: a lone surrogate a client sent still encodes,
        # and reads back as it was (a failed encode would stop the store)
        headers = json.dumps(message.headers, separators=(",", ":")).encode()
    source = b""
    if message.source is not None:
        flags |= _HAS_SOURCE
        source = message.source.encode("utf-8")
    queue, mid, body, ev = message.queue, message.id, message.body, event or b""
    # one pack called with its arguments (no tuple of fields to star-unpack:
    # this runs for every message the broker stores)
    if kind == K_ENQUEUE:
        head = ENQUEUE_HEAD.pack(
            kind, message.seq, message.created_at, expires or 0.0, message.retry, flags,
            len(queue), len(mid), len(ev), len(headers), len(source), len(body),
        )
    else:
        head = _REQUEUE_HEAD.pack(
            kind, old_seq, message.seq, message.created_at, expires or 0.0, message.retry,
            flags, len(queue), len(mid), len(ev), len(headers), len(source), len(body),
        )
    return b"".join((head, queue, mid, ev, headers, source, body))


MESSAGE_HEAD = _MSG
"""The fixed head of an ENQUEUE payload after its kind byte (seq first, queue length sixth)."""


def message_key(payload: Any) -> tuple[bytes, int]:
    """(queue, seq) of an ENQUEUE or REQUEUE payload, without decoding the rest."""
    at = 1 if payload[0] == K_ENQUEUE else 9
    fields = _MSG.unpack_from(payload, at)
    start = at + _MSG.size
    return bytes(payload[start : start + fields[5]]), fields[0]


def as_enqueue(payload: Any) -> bytes:
    """A REQUEUE payload rewritten as the ENQUEUE of the same message (for compaction)."""
    if payload[0] == K_ENQUEUE:
        return bytes(payload)
    return bytes((K_ENQUEUE,)) + bytes(payload[9:])


def decode_message(payload: Any, at: int) -> Message:
    return Message(*message_fields(bytes(payload), at, len(payload)))


def message_fields(buf: bytes, at: int, end: int) -> tuple[Any, ...]:
    """The fields of the message whose payload's head is at ``at`` in ``buf`` and
    which ends at ``end``, in ``Message``'s order (recovery packs them as they are).

    ``buf`` is ``bytes`` (a whole segment, in recovery), so each slice is a
    field as it is: this runs for every live message a restart replays."""
    seq, created, expires, retry, flags, lq, li, le, lh, ls, lb = _MSG.unpack_from(buf, at)
    pos = at + _MSG_SIZE
    queue = buf[pos:pos + lq]
    pos += lq
    mid = buf[pos:pos + li]
    pos += li
    event = buf[pos:pos + le] if flags & _HAS_EVENT else None
    pos += le
    headers = json.loads(buf[pos:pos + lh]) if flags & _HAS_HEADERS else None
    pos += lh
    source = buf[pos:pos + ls].decode("utf-8") if flags & _HAS_SOURCE else None
    pos += ls
    body = buf[pos:pos + lb]
    if pos + lb != end:
        raise FormatError("message payload length mismatch")
    return (mid, queue, body, seq, event, headers, created,
            expires if flags & _HAS_EXPIRES else None, retry, source)


def encode_options(queue: bytes, options: QueueOptions) -> bytes:
    o = options
    flags = (
        (o.delete_when_unused is not None)
        | (o.delete_when_unused_bare << 1)
        | ((o.dead_letter is not None) << 2)
        | ((o.max_length is not None) << 3)
        | ((o.default_ttl is not None) << 4)
        | (_OVERFLOW_FLAGS[o.overflow] << 5)
    )
    head = _OPTIONS.pack(
        flags, o.delete_when_unused or 0.0, o.max_length or 0, o.default_ttl or 0.0, len(queue)
    )
    return b"".join((bytes((K_DECLARE,)), head, queue, o.dead_letter or b""))


def _pair(kind: int, first: bytes, second: bytes) -> bytes:
    return b"".join((bytes((kind,)), _LEN.pack(len(first)), first, second))


def _unpair(payload: Any) -> tuple[bytes, bytes]:
    (length,) = _LEN.unpack_from(payload, 1)
    return bytes(payload[5 : 5 + length]), bytes(payload[5 + length :])


def encode_op(op: tuple[Any, ...]) -> bytes:
    """The payload of one broker op (see ``mqserver.model``)."""
    kind = op[0]
    if kind == ENQUEUE:
        return encode_message(K_ENQUEUE, op[1])
    if kind == REQUEUE:
        return encode_message(K_REQUEUE, op[1], op[2])
    if kind == REMOVE:
        return REMOVE_HEAD.pack(K_REMOVE, op[2]) + op[1]
    if kind == DECLARE:
        return encode_options(op[1], op[2])
    if kind == BIND:
        return _pair(K_BIND, op[1], op[2])
    if kind == UNBIND:
        return _pair(K_UNBIND, op[1], op[2])
    if kind == DELETE_QUEUE:
        return bytes((K_DELETE_QUEUE,)) + op[1]
    if kind == PUT:
        return b"".join((bytes((K_PUT,)), _TWO_LENGTHS.pack(len(op[1]), len(op[2])),
                         op[1], op[2], op[3]))
    if kind == DELETE:
        return _pair(K_DELETE, op[1], op[2])
    raise ValueError(f"unknown storage op {kind!r}")


def encode_commit(count: int, next_seq: int) -> bytes:
    return bytes((K_COMMIT,)) + _COMMIT.pack(count, next_seq)


def decode(payload: Any) -> tuple[Any, ...]:
    """A payload back to its op tuple; COMMIT is ("commit", count, next_seq).

    Raises FormatError (or struct.error) for a payload that checked but makes
    no sense, which only a bug or a deliberate edit produces.
    """
    kind = payload[0]
    if kind == K_ENQUEUE:
        return (ENQUEUE, decode_message(payload, 1))
    if kind == K_REQUEUE:
        (old_seq,) = _SEQ.unpack_from(payload, 1)
        return (REQUEUE, decode_message(payload, 9), old_seq)
    if kind == K_REMOVE:
        (seq,) = _SEQ.unpack_from(payload, 1)
        return (REMOVE, bytes(payload[9:]), seq)
    if kind == K_DECLARE:
        flags, unused, max_length, ttl, qlen = _OPTIONS.unpack_from(payload, 1)
        start = 1 + _OPTIONS.size
        queue = bytes(payload[start : start + qlen])
        options = QueueOptions(
            delete_when_unused=unused if flags & 1 else None,
            delete_when_unused_bare=bool(flags & 2),
            dead_letter=bytes(payload[start + qlen :]) if flags & 4 else None,
            max_length=max_length if flags & 8 else None,
            default_ttl=ttl if flags & 16 else None,
            overflow=_OVERFLOW_NAMES[(flags >> 5) & 3],
        )
        return (DECLARE, queue, options)
    if kind in (K_BIND, K_UNBIND):
        return (BIND if kind == K_BIND else UNBIND, *_unpair(payload))
    if kind == K_DELETE_QUEUE:
        return (DELETE_QUEUE, bytes(payload[1:]))
    if kind == K_COMMIT:
        count, next_seq = _COMMIT.unpack_from(payload, 1)
        return ("commit", count, next_seq)
    if kind == K_PUT:
        namespace, key, value = _put_fields(payload)
        return (PUT, namespace, key, value)
    if kind == K_DELETE:
        return (DELETE, *_unpair(payload))
    raise FormatError(f"unknown record kind {kind}")


def _put_fields(payload: Any) -> tuple[bytes, bytes, bytes]:
    nlen, klen = _TWO_LENGTHS.unpack_from(payload, 1)
    start = 1 + _TWO_LENGTHS.size
    split = start + nlen
    return (bytes(payload[start:split]), bytes(payload[split : split + klen]),
            bytes(payload[split + klen :]))


def record_key(payload: Any) -> Any:
    """What a kept record is the live copy of.

    (queue, seq) for a message, queue for a DECLARE, (queue, event) for a
    BIND, (namespace, key) for a PUT.
    """
    kind = payload[0]
    if kind in MESSAGE_KINDS:
        return message_key(payload)
    if kind == K_DECLARE:
        qlen = _OPTIONS.unpack_from(payload, 1)[4]
        start = 1 + _OPTIONS.size
        return bytes(payload[start : start + qlen])
    if kind == K_PUT:
        return _put_fields(payload)[:2]
    return _unpair(payload)
