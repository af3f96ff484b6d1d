# -*- test-case-name: tests.unit.test_phpmq_codec -*-
"""PHPMQ frames: pure encoding and incremental decoding, no I/O.

A frame is an 8-byte message header ``H`` + 2-digit version + 3-digit type +
2-digit package count, followed by that many packages, each a 32-byte
package header ``P`` + 2-digit package type + 29-digit zero-padded content
length, then the raw content.  Nothing separates them: the line breaks in the
upstream README are display only, and its 36-byte package header example is
wrong (see docs/protocols/phpmq.md).

Two revisions share version ``01``; the only way to tell them apart is the
package count, so unlike the original parser this one honours it: every
(type, count) pair has one fixed set of package types (``LAYOUTS``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import NoReturn

VERSION = 1
MESSAGE_HEADER_SIZE = 8
PACKAGE_HEADER_SIZE = 32
DEFAULT_MAX_CONTENT = 16 * 1024 * 1024
MAX_NUMBER_DIGITS = 18
"""Counts and TTLs longer than this are refused before ``int()`` sees them."""
PACKAGE_HEADER_CACHE = 1024
"""Parsed package headers a decoder remembers (then it starts afresh)."""

# message types
PUBLISH = 1
CONSUME = 2
DISPATCH = 3
ACK = 4
REQUEUE = 5
DEAD_LETTER = 6

# package types
QUEUE = 1
CONTENT = 2
MESSAGE_ID = 3
COUNT = 4
TTL = 5

TYPE_NAMES = {
    PUBLISH: "publish",
    CONSUME: "consume",
    DISPATCH: "dispatch",
    ACK: "ack",
    REQUEUE: "requeue",
    DEAD_LETTER: "dead letter",
}

LAYOUTS: dict[tuple[int, int], tuple[int, ...]] = {
    (PUBLISH, 2): (QUEUE, CONTENT),
    (PUBLISH, 3): (QUEUE, CONTENT, TTL),
    (CONSUME, 2): (QUEUE, COUNT),
    (DISPATCH, 3): (QUEUE, CONTENT, MESSAGE_ID),
    (DISPATCH, 4): (QUEUE, CONTENT, MESSAGE_ID, TTL),
    (ACK, 2): (QUEUE, MESSAGE_ID),
    (REQUEUE, 3): (QUEUE, MESSAGE_ID, TTL),
    (DEAD_LETTER, 2): (QUEUE, MESSAGE_ID),
}
"""Package types in the order they are sent, for every valid (type, count)."""

R2018_ONLY = frozenset({(PUBLISH, 3), (DISPATCH, 4), (REQUEUE, 3), (DEAD_LETTER, 2)})
"""Frames that exist only in revision 2018: seeing one tells us what a client speaks."""

_LAYOUT_SETS = {key: frozenset(layout) for key, layout in LAYOUTS.items()}


class PHPMQError(ValueError):
    """A malformed frame.  PHPMQ has no error frame, so this ends the connection."""


@dataclass(slots=True)
class Frame:
    """One decoded message: its type and its packages by package type."""

    type: int
    packages: dict[int, bytes]

    @property
    def revision(self) -> int:
        """2018 for a frame only revision 2018 has, else 2017 (which 2018 also accepts)."""
        return 2018 if (self.type, len(self.packages)) in R2018_ONLY else 2017


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


def dispatch(
    queue: bytes, body: bytes, message_id: bytes, ttl: int | None = None,
    head: bytes | None = None,
) -> bytes:
    """003, the only frame the server sends: 3 packages for 2017, 4 with a TTL for 2018.

    Written out by hand because it is the per-message hot path; a caller that
    keeps ``dispatch_head(queue, ttl is not None)`` passes it as ``head``.
    """
    if head is None:
        head = dispatch_head(queue, ttl is not None)
    if ttl is None:
        return b"%sP02%029d%sP03%029d%s" % (
            head, len(body), body, len(message_id), message_id,
        )
    ttl_text = b"%d" % ttl
    return b"%sP02%029d%sP03%029d%sP05%029d%s" % (
        head, len(body), body, len(message_id), message_id, len(ttl_text), ttl_text,
    )


def ack(queue: bytes, message_id: bytes) -> bytes:
    return encode(ACK, [(QUEUE, queue), (MESSAGE_ID, message_id)])


def requeue(queue: bytes, message_id: bytes, ttl: int) -> bytes:
    return encode(REQUEUE, [(QUEUE, queue), (MESSAGE_ID, message_id), (TTL, b"%d" % ttl)])


def dead_letter(queue: bytes, message_id: bytes) -> bytes:
    return encode(DEAD_LETTER, [(QUEUE, queue), (MESSAGE_ID, message_id)])


def message_ids(count: int) -> list[bytes]:
    """``count`` new server message ids, each ``os.urandom(16).hex()`` (32 lowercase
    hex characters, like the original's ``bin2hex(random_bytes(16))``), cut
    from one ``os.urandom`` call."""
    random = os.urandom(16 * count).hex().encode("ascii")
    return [random[i : i + 32] for i in range(0, len(random), 32)]


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


# -- decoding -----------------------------------------------------------------


class FrameDecoder:
    """Turns a byte stream, split anywhere, into ``Frame``s.

    The parser is one generator (``_read``) that keeps its place in the
    stream in local variables and yields each frame as soon as it is
    complete, or None when it needs more bytes: handing over a frame costs a
    generator resumption instead of saving and reloading a state machine.
    The unread bytes are one immutable ``bytes`` object read at a moving
    offset, so every header and content is one slice.  ``feed`` only queues
    what arrives; the queue is joined to the unread bytes when it completes
    the header or content being waited for (``_more``), so a large content
    arriving in small chunks is joined once and a stream of any length or
    chunking costs linear time.  A package's content is not looked at until
    all of it has arrived, and its length is checked against ``max_content``
    when its header arrives, before any of it is buffered for long.  After an
    error the decoder keeps raising it: the stream has lost its framing.
    """

    def __init__(self, max_content: int = DEFAULT_MAX_CONTENT) -> None:
        self.max_content = max_content
        self._data = b""
        self._pos = 0
        self._queued: list[bytes] = []
        self._queued_size = 0
        self._inside = False
        self._error: PHPMQError | None = None
        self._package_headers: dict[bytes, tuple[int, int]] = {}
        self._reader = self._read()

    def feed(self, data: bytes) -> None:
        self._queued.append(data)
        self._queued_size += len(data)

    def buffered(self) -> int:
        """Bytes received and not yet consumed by a header or a whole package."""
        return len(self._data) - self._pos + self._queued_size

    def in_frame(self) -> bool:
        """After ``next_frame`` returned None: True if it waits for the rest of a frame."""
        return self._inside

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes are fed.

        :raises PHPMQError: the stream is malformed (and stays so).
        """
        if self._error is not None:
            raise self._error
        try:
            return next(self._reader)
        except PHPMQError as e:
            self._error = e
            raise

    def _read(self) -> Generator[Frame | None, None, NoReturn]:
        """Every frame of the stream, with None wherever it must wait for bytes."""
        data = b""
        pos = end = 0
        headers = self._package_headers
        while True:
            if pos + MESSAGE_HEADER_SIZE > end:
                data, pos, end = yield from self._more(data, pos, MESSAGE_HEADER_SIZE, False)
            header = data[pos : pos + MESSAGE_HEADER_SIZE]
            msg_type, expected, count = (
                _MESSAGE_HEADERS.get(header)  # every valid header, already parsed
                or _parse_message_header(header)
            )
            pos += MESSAGE_HEADER_SIZE
            packages: dict[int, bytes] = {}
            for _ in range(count):
                if pos + PACKAGE_HEADER_SIZE > end:
                    data, pos, end = yield from self._more(data, pos, PACKAGE_HEADER_SIZE)
                header = data[pos : pos + PACKAGE_HEADER_SIZE]
                pkg_type, length = headers.get(header) or self._package_header(header)
                if pkg_type not in expected or pkg_type in packages:
                    raise _misplaced(pkg_type, msg_type, expected)
                pos += PACKAGE_HEADER_SIZE
                if pos + length > end:
                    data, pos, end = yield from self._more(data, pos, length)
                packages[pkg_type] = data[pos : pos + length]
                pos += length
            self._pos = pos
            yield Frame(msg_type, packages)

    def _more(
        self, data: bytes, pos: int, need: int, inside: bool = True
    ) -> Generator[None, None, tuple[bytes, int, int]]:
        """Yield None until ``need`` bytes from ``pos`` have arrived, then return
        the unread bytes as one object, 0 (their new start) and their length."""
        self._data, self._pos, self._inside = data, pos, inside
        while self.buffered() < need:
            yield None
        rest = data[pos:]
        # one chunk after a whole frame (the usual case) is taken as it is
        data = b"".join([rest, *self._queued] if rest else self._queued)
        self._data, self._pos = data, 0
        self._queued = []
        self._queued_size = 0
        return data, 0, len(data)

    def _package_header(self, header: bytes) -> tuple[int, int]:
        """(type, content length) of a package header seen for the first time
        (recently): it is remembered, as the same queue names, ids and often
        body sizes come again and again."""
        pkg_type = _PACKAGE_TYPES.get(header[:3])
        if pkg_type is None or not header[3:].isdigit():
            if header[0] != 0x50:  # P
                raise PHPMQError(f"bad package header flag {header[:1]!r} in {header!r}")
            raise PHPMQError(f"non-digit package header {header!r}")
        length = int(header[3:])
        if length > self.max_content:
            raise PHPMQError(f"content length {length} above the limit of {self.max_content}")
        if len(self._package_headers) >= PACKAGE_HEADER_CACHE:
            self._package_headers.clear()
        self._package_headers[header] = pkg_type, length
        return pkg_type, length


def _misplaced(pkg_type: int, msg_type: int, expected: frozenset[int]) -> PHPMQError:
    """Why package ``pkg_type`` cannot come next in a frame expecting ``expected``."""
    if pkg_type in expected:
        return PHPMQError(f"duplicate package type {pkg_type:02d}")
    return PHPMQError(
        f"package type {pkg_type:02d} does not belong in message type "
        f"{msg_type:03d} with {len(expected):02d} packages"
    )


def _parse_message_header(header: bytes) -> tuple[int, frozenset[int], int]:
    """(type, package types, count) of a message header, or the reason it is
    malformed.  It builds ``_MESSAGE_HEADERS``, which holds every valid one,
    so the decoder calls it only to raise that reason."""
    if header[0] != 0x48:  # H
        raise PHPMQError(f"bad message header flag {header[:1]!r} in {header!r}")
    if not header[1:].isdigit():
        raise PHPMQError(f"non-digit message header {header!r}")
    version, msg_type, count = int(header[1:3]), int(header[3:6]), int(header[6:8])
    if version != VERSION:
        raise PHPMQError(f"unsupported protocol version {version:02d}")
    if msg_type not in TYPE_NAMES:
        raise PHPMQError(f"unknown message type {msg_type:03d}")
    expected = _LAYOUT_SETS.get((msg_type, count))
    if expected is None:
        raise PHPMQError(
            f"message type {msg_type:03d} ({TYPE_NAMES[msg_type]}) "
            f"cannot have {count:02d} packages"
        )
    return msg_type, expected, count


#: Every valid message header, parsed: one dict lookup per frame.
_MESSAGE_HEADERS = {
    header: _parse_message_header(header)
    for header in (b"H%02d%03d%02d" % (VERSION, msg_type, count) for msg_type, count in LAYOUTS)
}
#: Package header flag and type digits (``P00`` to ``P99``) to the type.
_PACKAGE_TYPES = {b"P%02d" % n: n for n in range(100)}


def decode(data: bytes, max_content: int = DEFAULT_MAX_CONTENT) -> list[Frame]:
    """Every frame in ``data``, which must end on a frame boundary."""
    decoder = FrameDecoder(max_content)
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    if decoder.buffered() or decoder.in_frame():
        raise PHPMQError("stream ends inside a frame")
    return frames
