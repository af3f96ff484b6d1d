# -*- test-case-name: tests.unit.test_zmtp_codec -*-
"""ZMTP 3.x wire format: pure functions (the incremental decoder is in ``decoder``).

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
RESERVED = 0xF8  # flag bits no frame may set

NULL = b"NULL"
MAX_SHORT = 255
MAX_PING_CONTEXT = 16

U64 = struct.Struct(">Q")
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
        return bytes((flags | LONG,)) + U64.pack(size)
    return bytes((flags, size))


def encode_frame(body: bytes, more: bool = False) -> bytes:
    return frame_header(len(body), MORE if more else 0) + body


SHORT_MORE = [bytes((MORE, size)) for size in range(MAX_SHORT + 1)]
"""The header of a short frame with MORE, by its size (0-255): encoders index it
instead of calling ``more_header`` per frame."""
SHORT_LAST = [bytes((0, size)) for size in range(MAX_SHORT + 1)]
"""The header of a message's short last frame, by its size."""


def encode_message(frames: list[bytes] | tuple[bytes, ...]) -> bytes:
    """A multipart message: MORE on every frame but the last.

    Short headers come from tables: this runs for every message sent."""
    if not frames:
        return b""
    parts = []
    for body in frames:
        size = len(body)
        parts.append(SHORT_MORE[size] if size <= MAX_SHORT else frame_header(size, MORE))
        parts.append(body)
    size = len(frames[-1])
    parts[-2] = SHORT_LAST[size] if size <= MAX_SHORT else frame_header(size)
    return b"".join(parts)


def more_header(size: int) -> bytes:
    """``frame_header(size, MORE)``, from the table when short."""
    return SHORT_MORE[size] if size <= MAX_SHORT else frame_header(size, MORE)


def last_header(size: int) -> bytes:
    """``frame_header(size)`` for a message's last frame, from the table when short."""
    return SHORT_LAST[size] if size <= MAX_SHORT else frame_header(size)


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


def describe(identity: bytes) -> str:
    """An identity for logs and JSON: its text if printable UTF-8, else ``0x`` and hex."""
    try:
        text = identity.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + identity.hex()
    return text if text.isprintable() and text else "0x" + identity.hex()
