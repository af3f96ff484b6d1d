# -*- test-case-name: tests.unit.test_phpmq_codec -*-
"""PHPMQ frames: pure encoding, values, and (re-exported) the format and decoding.

The format (headers, types, ``Frame``) is described in ``frames``; the
incremental decoder is in ``decoder``.  Everything PHPMQ code needs is
importable from here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

from mqserver.protocols.phpmq.decoder import FrameDecoder, decode
from mqserver.protocols.phpmq.frames import (
    ACK,
    CONSUME,
    CONTENT,
    COUNT,
    DEAD_LETTER,
    DEFAULT_MAX_CONTENT,
    DISPATCH,
    LAYOUTS,
    MAX_NUMBER_DIGITS,
    MESSAGE_HEADER_SIZE,
    MESSAGE_ID,
    PACKAGE_HEADER_CACHE,
    PACKAGE_HEADER_SIZE,
    PUBLISH,
    QUEUE,
    R2018_ONLY,
    REQUEUE,
    TTL,
    TYPE_NAMES,
    VERSION,
    Frame,
    PHPMQError,
    Run,
)

__all__ = [
    "ACK", "CONSUME", "CONTENT", "COUNT", "DEAD_LETTER", "DEFAULT_MAX_CONTENT", "DISPATCH",
    "LAYOUTS", "MAX_NUMBER_DIGITS", "MESSAGE_HEADER_SIZE", "MESSAGE_ID", "PACKAGE_HEADER_CACHE",
    "PACKAGE_HEADER_SIZE", "PUBLISH", "QUEUE", "R2018_ONLY", "REQUEUE", "TTL", "TYPE_NAMES",
    "VERSION", "Frame", "FrameDecoder", "PHPMQError", "PackageHeaders", "Run", "ack", "consume",
    "dead_letter", "decode", "dispatch", "dispatch_head", "encode", "encode_frame",
    "message_header", "message_ids", "package_header", "parse_number", "publish",
    "remaining_ttl", "requeue",
]


# -- encoding -----------------------------------------------------------------


def message_header(msg_type: int, count: int, version: int = VERSION) -> bytes:
    return b"H%02d%03d%02d" % (version, msg_type, count)


def package_header(pkg_type: int, length: int) -> bytes:
    return b"P%02d%029d" % (pkg_type, length)


def encode(msg_type: int, packages: Iterable[tuple[int, bytes]]) -> bytes:
    """A frame with the packages in the order given."""
    packages = list(packages)
    parts = [message_header(msg_type, len(packages))]
    for pkg_type, content in packages:
        parts.append(b"P%02d%029d" % (pkg_type, len(content)))
        parts.append(content)
    return b"".join(parts)


def encode_frame(frame: Frame) -> bytes:
    """A decoded frame back to bytes, packages in the order the original sends them."""
    layout = LAYOUTS.get((frame.type, len(frame.packages)), sorted(frame.packages))
    return encode(frame.type, [(p, frame.packages[p]) for p in layout])


def publish(queue: bytes, body: bytes, ttl: int | None = None) -> bytes:
    """001; with a TTL (revision 2018) or without (2017)."""
    packages = [(QUEUE, queue), (CONTENT, body)]
    if ttl is not None:
        packages.append((TTL, b"%d" % ttl))
    return encode(PUBLISH, packages)


def consume(queue: bytes, count: int) -> bytes:
    return encode(CONSUME, [(QUEUE, queue), (COUNT, b"%d" % count)])


def dispatch_head(queue: bytes, with_ttl: bool) -> bytes:
    """The message header and queue package every 003 of ``queue`` starts with
    (4 packages with a TTL, revision 2018, else 3)."""
    return b"H01003%02dP01%029d%s" % (4 if with_ttl else 3, len(queue), queue)


class PackageHeaders(dict[int, bytes]):
    """Package headers of one type by content length, each formatted once (the
    same body and id lengths come again and again); up to
    ``PACKAGE_HEADER_CACHE`` lengths, then it starts afresh."""

    def __init__(self, pkg_type: int) -> None:
        super().__init__()
        self.pkg_type = pkg_type

    def __missing__(self, length: int) -> bytes:
        if len(self) >= PACKAGE_HEADER_CACHE:
            self.clear()
        header = self[length] = package_header(self.pkg_type, length)
        return header


_CONTENT_HEADERS = PackageHeaders(CONTENT)
_MESSAGE_ID_HEADERS = PackageHeaders(MESSAGE_ID)


def dispatch(
    queue: bytes, body: bytes, message_id: bytes, ttl: int | None = None,
    head: bytes | None = None,
) -> bytes:
    """003, the only frame the server sends: 3 packages for 2017, 4 with a TTL for 2018.

    Put together from kept pieces because it is the per-message hot path (a
    join is about twice as fast as formatting the lengths each time); a caller
    that keeps ``dispatch_head(queue, ttl is not None)`` passes it as ``head``.
    """
    if head is None:
        head = dispatch_head(queue, ttl is not None)
    content_header = _CONTENT_HEADERS[len(body)]
    id_header = _MESSAGE_ID_HEADERS[len(message_id)]
    if ttl is None:
        return b"".join((head, content_header, body, id_header, message_id))
    ttl_text = b"%d" % ttl
    return b"".join((
        head, content_header, body, id_header, message_id, package_header(TTL, len(ttl_text)),
        ttl_text,
    ))


def ack(queue: bytes, message_id: bytes) -> bytes:
    return encode(ACK, [(QUEUE, queue), (MESSAGE_ID, message_id)])


def requeue(queue: bytes, message_id: bytes, ttl: int) -> bytes:
    return encode(REQUEUE, [(QUEUE, queue), (MESSAGE_ID, message_id), (TTL, b"%d" % ttl)])


def dead_letter(queue: bytes, message_id: bytes) -> bytes:
    return encode(DEAD_LETTER, [(QUEUE, queue), (MESSAGE_ID, message_id)])


def message_ids(count: int) -> list[bytes]:
    """``count`` new server message ids, each ``os.urandom(16).hex()`` (32 lowercase
    hex characters, like the original's ``bin2hex(random_bytes(16))``), cut
    from one ``os.urandom`` call (``hex`` puts a space after every 16 bytes, so
    ``split`` cuts them in C)."""
    return os.urandom(16 * count).hex(" ", -16).encode("ascii").split()


# -- values -------------------------------------------------------------------


def parse_number(value: bytes, what: str) -> int:
    """An unpadded (leading zeros tolerated) ASCII decimal, as counts and TTLs are sent.

    ``int()`` alone would also take signs, spaces and underscores.
    """
    if not value or len(value) > MAX_NUMBER_DIGITS or not value.isdigit():
        raise PHPMQError(f"{what} is not a decimal number: {value[:40]!r}")
    return int(value)


def remaining_ttl(expires_at: float | None, now: float) -> int:
    """Whole seconds a dispatched message has left; 0 means it never expires.

    Rounded up, so a client never drops a message the server still considers
    alive, and never below 1, because 0 would read as "no expiry".  A
    millisecond of slack absorbs float error (3600 sent, 3300 dispatched
    exactly 300 s later, not 3301).
    """
    if expires_at is None:
        return 0
    return max(1, math.ceil(expires_at - now - 0.001))
