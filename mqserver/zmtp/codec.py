# -*- test-case-name: tests.unit.test_zmtp_codec -*-
"""ZMTP 3.x wire format: pure functions and an incremental frame decoder.

RFC 23 (ZMTP 3.0) and RFC 37 (ZMTP 3.1), NULL mechanism only.  Nothing here
does I/O, so every edge (a greeting with odd padding, a frame exactly 255 or
256 bytes long, a header split anywhere) is tested without sockets.

Wire summary::

    greeting  FF pad[8] 7F | major minor | mechanism[20] | as-server | filler[31]
    frame     flags | size (1 byte, or 8 bytes big-endian with LONG) | body
    command   frame with COMMAND set: u8 name-length | name | data
    READY     properties: u8 name-length | name | u32 value-length | value
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

GREETING_SIZE = 64
SIGNATURE_SIZE = 10

MORE = 0x01
LONG = 0x02
COMMAND = 0x04
_RESERVED = 0xF8

NULL = b"NULL"
MAX_SHORT = 255
MAX_PING_CONTEXT = 16

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


class ZMTPError(ValueError):
    """The peer broke the wire protocol; the connection must be closed."""


class TooLargeError(ZMTPError):
    """A frame or message is larger than the configured maximum."""


@dataclass(frozen=True, slots=True)
class Greeting:
    major: int
    minor: int
    mechanism: bytes
    as_server: bool


def greeting(minor: int = 1, mechanism: bytes = NULL, as_server: bool = False) -> bytes:
    """Our 64-byte greeting.  Padding is zero: peers must not look at it."""
    return (
        b"\xff" + b"\x00" * 8 + b"\x7f"
        + bytes((3, minor))
        + mechanism.ljust(20, b"\x00")
        + (b"\x01" if as_server else b"\x00")
        + b"\x00" * 31
    )


def check_signature(data: bytes) -> None:
    """Reject a peer that is not ZMTP 3 as soon as its first 10 bytes are in.

    Only byte 0 and bit 0 of byte 9 are checked: the 8 bytes between are
    padding (libzmq 4.3 puts the identity length there) and must be ignored.
    """
    if len(data) < SIGNATURE_SIZE:
        return
    if data[0] != 0xFF or not data[9] & 0x01:
        raise ZMTPError("not a ZMTP 3 greeting (ZMTP 1.0 peer or another protocol)")


def parse_greeting(data: bytes) -> Greeting:
    """Parse the peer's 64-byte greeting (any padding, minor version >= 0)."""
    if len(data) != GREETING_SIZE:
        raise ZMTPError(f"greeting must be {GREETING_SIZE} bytes, got {len(data)}")
    check_signature(data)
    major, minor = data[10], data[11]
    if major < 3:
        raise ZMTPError(f"ZMTP {major}.{minor} peer; only ZMTP 3.x is spoken here")
    mechanism = data[12:32].rstrip(b"\x00")
    return Greeting(major, minor, mechanism, bool(data[32]))


def frame_header(size: int, flags: int = 0) -> bytes:
    """Flags and size for a frame of ``size`` bytes (LONG above 255 bytes)."""
    if size > MAX_SHORT:
        return bytes((flags | LONG,)) + _U64.pack(size)
    return bytes((flags, size))


def encode_frame(body: bytes, more: bool = False) -> bytes:
    return frame_header(len(body), MORE if more else 0) + body


def encode_message(frames: list[bytes]) -> bytes:
    """A multipart message: MORE on every frame but the last."""
    last = len(frames) - 1
    parts = []
    for i, body in enumerate(frames):
        parts.append(frame_header(len(body), MORE if i < last else 0))
        parts.append(body)
    return b"".join(parts)


def encode_command(name: bytes, data: bytes = b"") -> bytes:
    body = bytes((len(name),)) + name + data
    return frame_header(len(body), COMMAND) + body


def parse_command(body: bytes) -> tuple[bytes, bytes]:
    """Split a command frame's body into (name, data)."""
    if not body:
        raise ZMTPError("empty command frame")
    size = body[0]
    if len(body) < 1 + size or size == 0:
        raise ZMTPError("command name runs past the frame")
    return body[1 : 1 + size], body[1 + size :]


def encode_properties(properties: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(
        bytes((len(name),)) + name + _U32.pack(len(value)) + value
        for name, value in properties
    )


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    """READY metadata; names are case-insensitive, so they come back lowercased."""
    properties: dict[bytes, bytes] = {}
    i, end = 0, len(data)
    while i < end:
        size = data[i]
        i += 1
        if size == 0 or i + size + 4 > end:
            raise ZMTPError("malformed READY property name")
        name = data[i : i + size].lower()
        i += size
        (length,) = _U32.unpack_from(data, i)
        i += 4
        if i + length > end:
            raise ZMTPError("READY property value runs past the command")
        properties[name] = data[i : i + length]
        i += length
    return properties


def ready_command(socket_type: bytes, identity: bytes | None = None) -> bytes:
    properties = [(b"Socket-Type", socket_type)]
    if identity is not None:
        properties.append((b"Identity", identity))
    return encode_command(b"READY", encode_properties(properties))


def error_command(reason: bytes) -> bytes:
    reason = reason[:255]
    return encode_command(b"ERROR", bytes((len(reason),)) + reason)


def parse_ping(data: bytes) -> tuple[int, bytes]:
    """(TTL in deciseconds, context) of a PING; the context is at most 16 bytes."""
    if len(data) < 2:
        raise ZMTPError("PING without a TTL")
    (ttl,) = _U16.unpack_from(data)
    return ttl, data[2 : 2 + MAX_PING_CONTEXT]


def ping_command(ttl: int = 0, context: bytes = b"") -> bytes:
    return encode_command(b"PING", _U16.pack(ttl) + context[:MAX_PING_CONTEXT])


def pong_command(context: bytes = b"") -> bytes:
    return encode_command(b"PONG", context[:MAX_PING_CONTEXT])


class FrameDecoder:
    """Turns a byte stream (after the greeting) into ``(flags, body)`` frames.

    Bytes accumulate in one ``bytearray`` and the consumed prefix is dropped
    once per ``feed``, so a long frame arriving in many chunks costs O(n),
    not O(n^2).  A frame's size is checked against ``max_frame`` as soon as
    its header is complete, before its body is buffered: a peer cannot make
    us hold 2 GiB by announcing it.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self._buffer
        buffer += data
        frames: list[tuple[int, bytes]] = []
        offset, end = 0, len(buffer)
        while offset < end:
            flags = buffer[offset]
            if flags & _RESERVED:
                raise ZMTPError(f"reserved frame flag bits set: {flags:#04x}")
            if flags & COMMAND and flags & MORE:
                raise ZMTPError("a command frame cannot have MORE set")
            if flags & LONG:
                if end - offset < 9:
                    break
                (size,) = _U64.unpack_from(buffer, offset + 1)
                start = offset + 9
            else:
                if end - offset < 2:
                    break
                size = buffer[offset + 1]
                start = offset + 2
            if size > self.max_frame:
                raise TooLargeError(f"frame of {size} bytes is over the {self.max_frame} limit")
            if end - start < size:
                break
            frames.append((flags, bytes(buffer[start : start + size])))
            offset = start + size
        if offset:
            del buffer[:offset]
        return frames

    def buffered(self) -> int:
        return len(self._buffer)
