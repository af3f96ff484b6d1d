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


_SHORT_MORE = [bytes((MORE, size)) for size in range(MAX_SHORT + 1)]
_SHORT_LAST = [bytes((0, size)) for size in range(MAX_SHORT + 1)]


def encode_message(frames: list[bytes] | tuple[bytes, ...]) -> bytes:
    """A multipart message: MORE on every frame but the last.

    Short headers come from tables: this runs for every message sent."""
    if not frames:
        return b""
    parts = []
    for body in frames:
        size = len(body)
        parts.append(_SHORT_MORE[size] if size <= MAX_SHORT else frame_header(size, MORE))
        parts.append(body)
    size = len(frames[-1])
    parts[-2] = _SHORT_LAST[size] if size <= MAX_SHORT else frame_header(size)
    return b"".join(parts)


def more_header(size: int) -> bytes:
    """``frame_header(size, MORE)``, from the table when short."""
    return _SHORT_MORE[size] if size <= MAX_SHORT else frame_header(size, MORE)


def last_header(size: int) -> bytes:
    """``frame_header(size)`` for a message's last frame, from the table when short."""
    return _SHORT_LAST[size] if size <= MAX_SHORT else frame_header(size)


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


LEAD_FRAMES = 3
"""Frames a message may share with the one before, taken in one comparison."""
MAX_LEAD = 256
"""Wire bytes of those frames beyond which they are not remembered."""
MAX_REST = 16
"""Wire bytes of the frames after them remembered too (a message repeating whole)."""


class MessageDecoder:
    """Turns a byte stream (after the greeting) into whole multipart messages.

    ``feed`` decodes every complete frame of a chunk in one loop and returns,
    in wire order, each complete message as a ``list`` of frame bodies and
    each command frame as its ``bytes`` body.  A message's frames are its
    own until its last one arrives, so a message split over chunks comes
    back once, whole.  ``frame`` takes one frame at a time, for the
    handshake (before it, a message frame is an error, not part of a message).

    Limits, checked as the frames arrive: a frame over ``max_message`` bytes
    as soon as its header is in (a peer cannot make us hold 2 GiB by
    announcing it), a message over ``max_message`` bytes on the wire (headers
    included: a flood of empty frames counts too) and a message of more than
    ``max_frames`` frames.  The first broken rule is kept in ``error`` and
    ``feed`` returns what came before it, so those are still handled.
    Bytes of an incomplete frame wait in a list until enough are in to
    finish it (``_need``): a long frame in many chunks costs O(n), not O(n^2).

    A message whose first ``LEAD_FRAMES`` frames are, byte for byte, those of
    the message before it (eMQP's ``'' | eMQP/1.0 | REQUEST`` again and
    again) takes them in one ``startswith`` and shares their bodies, and so
    does the short rest of one that repeats whole (the bench's READY).
    """

    def __init__(self, max_message: int, max_frames: int) -> None:
        self.max_message = max_message
        self.max_frames = max_frames
        self.error: ZMTPError | None = None
        self._waiting: list[bytes] = []  # the unparsed tail of the stream
        self._waiting_size = 0
        self._need = 0  # bytes the first incomplete frame needs in all
        self._parts: list[bytes] = []  # frames of the message in progress
        self._size = 0  # its wire size so far
        # the wire bytes of the last message's first LEAD_FRAMES frames and
        # those frames, and of the rest of the last one that took them if short
        self._lead = self._rest = b""
        self._lead_parts: list[bytes] = []
        self._rest_parts: list[bytes] = []

    def buffered(self) -> int:
        """Bytes of an incomplete frame held."""
        return self._waiting_size

    def in_progress(self) -> int:
        """Wire bytes of the incomplete message's frames so far."""
        return self._size

    def _take(self, data: bytes) -> bytes:
        """``data`` after what waited, or b"" while the frame is still incomplete."""
        if not self._waiting:
            return data
        self._waiting.append(data)
        self._waiting_size += len(data)
        if self._waiting_size < self._need:
            return b""
        data = b"".join(self._waiting)
        self._waiting, self._waiting_size = [], 0
        return data

    def _keep(self, data: bytes, offset: int, need: int) -> None:
        """Keep ``data[offset:]``, the start of a frame that needs ``need`` bytes in all."""
        if offset >= len(data):
            self._waiting, self._waiting_size = [], 0
            return
        rest = data[offset:] if offset else data
        self._waiting, self._waiting_size, self._need = [rest], len(rest), need

    def frame(self, data: bytes = b"") -> tuple[int, bytes] | None:
        """The next whole frame as ``(flags, body)``, or None until it is in."""
        if data:
            self._waiting.append(data)
        data = b"".join(self._waiting)
        found = _header(data, 0, self.max_message)
        if found is None or found[2] > len(data):
            self._keep(data, 0, found[2] if found else _header_size(data))
            return None
        flags, start, stop = found
        self._keep(data, stop, 0)
        return flags, data[start:stop]

    def feed(self, data: bytes) -> list[list[bytes] | bytes]:
        """Every whole message and command in what arrived so far (see the class doc)."""
        data = self._take(data)
        out: list[list[bytes] | bytes] = []
        if not data:
            return out
        parts, size = self._parts, self._size
        max_message, max_frames = self.max_message, self.max_frames
        lead, lead_parts = self._lead, self._lead_parts
        rest, rest_parts = self._rest, self._rest_parts
        lead_size, rest_size = len(lead), len(rest)
        offset, end = 0, len(data)
        # where this chunk holds the message in progress from its first frame
        # to its LEAD_FRAMES-th, to remember as the next lead (-1: it does not),
        # and where its frames after a lead taken start (to remember the rest)
        first = lead_end = after_lead = -1
        try:
            while end - offset >= 2:
                if not parts and lead and data.startswith(lead, offset):
                    offset += lead_size
                    if rest and data.startswith(rest, offset):
                        # the whole message again (the bench's READY, say)
                        offset += rest_size
                        out.append(lead_parts + rest_parts)
                        continue
                    parts, size = lead_parts.copy(), lead_size
                    after_lead = offset
                    continue
                flags = data[offset]
                if flags <= MORE:
                    # the common case: a short message frame (0-255 bytes)
                    start = offset + 2
                    stop = start + data[offset + 1]
                    if stop > end:
                        break
                else:
                    found = _header(data, offset, max_message)
                    if found is None:
                        break
                    flags, start, stop = found
                    if stop > end:
                        break
                    if flags & COMMAND:
                        out.append(data[start:stop])
                        offset = stop
                        if parts:  # inside a message: its frames are not contiguous
                            first = after_lead = -1
                        continue
                if not parts:
                    first = offset
                size += stop - offset
                offset = stop
                if size > max_message:
                    raise TooLargeError(f"message over the {max_message} byte limit")
                parts.append(data[start:stop])
                if flags & MORE:
                    count = len(parts)
                    if count >= max_frames:
                        raise TooLargeError(f"message of more than {max_frames} frames")
                    if count == LEAD_FRAMES and first >= 0:
                        lead_end = offset
                    continue
                out.append(parts)
                if (lead_end > first >= 0 and lead_end - first <= MAX_LEAD
                        and data[first:lead_end] != lead):
                    lead, lead_parts = data[first:lead_end], parts[:LEAD_FRAMES]
                    lead_size = len(lead)
                    rest, rest_size = b"", 0  # it followed another lead
                elif (after_lead >= 0 and offset - after_lead <= MAX_REST
                        and data[after_lead:offset] != rest):
                    rest, rest_parts = data[after_lead:offset], parts[LEAD_FRAMES:]
                    rest_size = len(rest)
                parts, size = [], 0
                first = lead_end = after_lead = -1
            # the incomplete frame left, if any: its flags and size are checked now
            found = _header(data, offset, max_message)
        except ZMTPError as e:
            self.error = e
            return out
        self._parts, self._size = parts, size
        self._lead, self._lead_parts = lead, lead_parts
        self._rest, self._rest_parts = rest, rest_parts
        self._keep(data, offset, found[2] - offset if found else _header_size(data[offset:]))
        return out


def _header_size(data: bytes) -> int:
    """Bytes the frame header at the start of ``data`` takes (2, or 9 with LONG)."""
    return 9 if data and data[0] & LONG else 2


def _header(data: bytes | bytearray, offset: int, max_frame: int) -> tuple[int, int, int] | None:
    """``(flags, body start, body end)`` of the frame at ``offset``, or None while
    its header is incomplete; raises for reserved flags or a frame over ``max_frame``."""
    end = len(data)
    if end <= offset:
        return None
    flags = data[offset]
    if flags & _RESERVED:
        raise ZMTPError(f"reserved frame flag bits set: {flags:#04x}")
    if flags & COMMAND and flags & MORE:
        raise ZMTPError("a command frame cannot have MORE set")
    if flags & LONG:
        if end - offset < 9:
            return None
        (size,) = _U64.unpack_from(data, offset + 1)
        start = offset + 9
    else:
        if end - offset < 2:
            return None
        size = data[offset + 1]
        start = offset + 2
    if size > max_frame:
        raise TooLargeError(f"frame of {size} bytes is over the {max_frame} limit")
    return flags, start, start + size


def describe(identity: bytes) -> str:
    """An identity for logs and JSON: its text if printable UTF-8, else ``0x`` and hex."""
    try:
        text = identity.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + identity.hex()
    return text if text.isprintable() and text else "0x" + identity.hex()
