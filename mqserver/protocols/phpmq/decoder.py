# -*- test-case-name: tests.unit.test_phpmq_codec -*-
"""PHPMQ decoding: a byte stream, split anywhere, to frames (no I/O).

``codec`` re-exports ``FrameDecoder`` and ``decode``; the format is in ``frames``.
"""

from __future__ import annotations

import functools
import struct
from collections import deque

from mqserver.protocols.phpmq.frames import (
    DEFAULT_MAX_CONTENT,
    LAYOUT_SETS,
    LAYOUTS,
    MESSAGE_HEADER_SIZE,
    PACKAGE_HEADER_CACHE,
    PACKAGE_HEADER_SIZE,
    QUEUE,
    TYPE_NAMES,
    VERSION,
    Frame,
    PHPMQError,
    Run,
)

BLOCK = 32
"""Repeats of the same length cut by one ``struct`` call (see ``_repeats``)."""


class FrameDecoder:
    """Turns a byte stream, split anywhere, into frames.

    ``read`` parses everything complete in one loop over one ``bytes`` and an
    offset (each header and content is one slice) and returns it in stream
    order.  A frame of two packages, queue first (a 2017 001, a 002, 004 or
    006), comes out as a ``Run``, and so do the frames after it that repeat
    all of its bytes up to the second package's length: those are recognised
    with one ``startswith`` (two if the length differs from the last one's)
    and their value is sliced out, while a frame that does not repeat the
    last one is parsed in full (and becomes the next one to repeat).  Every
    frame's headers are checked once; a repeat's differ only in the second
    package's length, checked like any package header.

    ``feed`` only queues what arrives.  A frame that is not complete is parsed
    again from its start once the bytes it waits for (``_need``) have arrived,
    so a large content arriving in small chunks is joined once and a stream of
    any length or chunking costs linear time.  A package's content is not
    looked at until all of it has arrived, and its length is checked against
    ``max_content`` when its header arrives, before any of it is buffered for
    long.  After an error the decoder keeps raising it: the stream has lost
    its framing.
    """

    def __init__(self, max_content: int = DEFAULT_MAX_CONTENT) -> None:
        self.max_content = max_content
        self._data = b""
        self._pos = 0
        self._queued: list[bytes] = []
        self._queued_size = 0
        self._need = MESSAGE_HEADER_SIZE
        self._parsed = 0
        self._error: PHPMQError | None = None
        self._package_headers: dict[bytes, tuple[int, int]] = {}
        self._repeat: bytes | None = None
        self._same = b""
        self._same_length = 0
        self._repeat_of: tuple[int, bytes, int] = (0, b"", 0)
        self._frames: deque[Frame] = deque()

    def feed(self, data: bytes) -> None:
        self._queued.append(data)
        self._queued_size += len(data)

    def buffered(self) -> int:
        """Bytes received and not yet consumed by a header or a whole package."""
        return len(self._data) - self._pos - self._parsed + self._queued_size

    def in_frame(self) -> bool:
        """After ``read`` or ``next_frame``: True if it waits for the rest of a frame."""
        return self._parsed > 0

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes are fed.

        :raises PHPMQError: the stream is malformed (and stays so).
        """
        frames = self._frames
        while not frames:
            items = self.read()
            if not items:
                return None
            for item in items:
                frames.extend(item.frames() if isinstance(item, Run) else (item,))
        return frames.popleft()

    def read(self) -> list[Frame | Run]:
        """Every frame complete so far, in order; [] until more bytes are fed.

        :raises PHPMQError: the stream is malformed (and stays so); frames
            complete before the fault are returned first and it is raised by
            the next call.
        """
        if self._error is not None:
            raise self._error
        if self._queued:
            if len(self._data) - self._pos + self._queued_size < self._need:
                return []
            rest = self._data[self._pos :]
            # one chunk after a whole frame (the usual case) is taken as it is
            self._data = b"".join([rest, *self._queued] if rest else self._queued)
            self._pos = 0
            self._queued = []
            self._queued_size = 0
        items: list[Frame | Run] = []
        try:
            self._parse(items)
        except PHPMQError as e:
            self._error = e
            if not items:
                raise
        return items

    def _parse(self, items: list[Frame | Run]) -> None:
        """Append the complete frames from ``_pos`` on to ``items``."""
        data, pos, end = self._data, self._pos, len(self._data)
        run: Run | None = None  # the last item, if it is the run being repeated
        while True:
            repeat = self._repeat
            if repeat is not None and data.startswith(repeat, pos):
                values = [] if run is None else run.values
                pos = self._repeats(data, pos, end, values)
                if run is None and values:
                    run = Run(*self._repeat_of, values)
                    items.append(run)
            at = pos
            parsed = self._frame(data, pos, end)
            if parsed is None:
                self._pos = pos
                return
            frame, pos, second = parsed
            if not second:
                run = None
                items.append(frame)
                continue
            # two packages, queue first: the next frames may repeat all but its value
            self._repeat = data[at : second + 3]
            self._same = data[at : second + PACKAGE_HEADER_SIZE]
            self._same_length = pos - second - PACKAGE_HEADER_SIZE
            key = self._repeat_of = (
                frame.type, frame.packages[QUEUE], _PACKAGE_TYPES[data[second : second + 3]]
            )
            if run is None or (run.type, run.queue, run.value_type) != key:
                run = Run(*key, [])
                items.append(run)
            run.values.append(frame.packages[key[2]])

    def _repeats(self, data: bytes, pos: int, end: int, values: list[bytes]) -> int:
        """Append the values of the repeats from ``pos`` on to ``values``; return
        where they end (a frame that is no repeat, or one not all here).

        ``_same`` is the repeat with the last value's length, as values often
        all have the same length (ids always do).  ``BLOCK`` such frames in a
        row are cut by one ``struct`` call and their starts checked by one
        ``count``; the rest go one at a time.
        """
        repeat, same, length = self._repeat, self._same, self._same_length
        value_at = len(same)
        stride = value_at + length
        block = BLOCK * stride
        # the last frame of the block must look right too before it is cut
        while pos + block <= end and data.startswith(same, pos + block - stride):
            parts = _block_struct(value_at, length).unpack_from(data, pos)
            if parts[0::2].count(same) != BLOCK:
                break
            values.extend(parts[1::2])
            pos += block
        headers = self._package_headers
        while True:
            if data.startswith(same, pos):
                start = pos + value_at
            elif data.startswith(repeat, pos):
                start = pos + value_at
                header = headers.get(data[start - PACKAGE_HEADER_SIZE : start])
                if header is None:
                    break  # a length not seen yet: the long way checks it
                same, length = data[pos:start], header[1]
            else:
                break
            if start + length > end:
                break  # not all here: the long way waits for it
            pos = start + length
            values.append(data[start:pos])
        self._same, self._same_length = same, length
        return pos

    def _frame(self, data: bytes, pos: int, end: int) -> tuple[Frame, int, int] | None:
        """The frame at ``pos``: (frame, where it ends, where its second package
        header starts if it has two packages and the first names the queue,
        else 0); or None if it is not complete (``_need``, ``_parsed`` set)."""
        if pos + MESSAGE_HEADER_SIZE > end:
            self._need, self._parsed = MESSAGE_HEADER_SIZE, 0
            return None
        header = data[pos : pos + MESSAGE_HEADER_SIZE]
        msg_type, expected, count = (
            _MESSAGE_HEADERS.get(header)  # every valid header, already parsed
            or _parse_message_header(header)
        )
        cursor = pos + MESSAGE_HEADER_SIZE
        headers = self._package_headers
        packages: dict[int, bytes] = {}
        last = cursor
        for _ in range(count):
            if cursor + PACKAGE_HEADER_SIZE > end:
                self._need, self._parsed = cursor + PACKAGE_HEADER_SIZE - pos, cursor - pos
                return None
            header = data[cursor : cursor + PACKAGE_HEADER_SIZE]
            pkg_type, length = headers.get(header) or self._package_header(header)
            if pkg_type not in expected or pkg_type in packages:
                raise _misplaced(pkg_type, msg_type, expected)
            last = cursor
            if cursor + PACKAGE_HEADER_SIZE + length > end:
                self._need = cursor + PACKAGE_HEADER_SIZE + length - pos
                self._parsed = cursor + PACKAGE_HEADER_SIZE - pos
                return None
            cursor += PACKAGE_HEADER_SIZE
            packages[pkg_type] = data[cursor : cursor + length]
            cursor += length
        self._need, self._parsed = MESSAGE_HEADER_SIZE, 0
        second = last if count == 2 and next(iter(packages)) == QUEUE else 0
        return Frame(msg_type, packages), cursor, second

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


@functools.lru_cache(maxsize=64)
def _block_struct(value_at: int, length: int) -> struct.Struct:
    """Cuts ``BLOCK`` repeats into (start up to the value, value) pairs."""
    return struct.Struct(f"{value_at}s{length}s" * BLOCK)


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
    expected = LAYOUT_SETS.get((msg_type, count))
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
