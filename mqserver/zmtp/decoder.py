# -*- test-case-name: tests.unit.test_zmtp_decoder -*-
"""ZMTP 3.x: the incremental decoder of a frame stream (after the greeting).

No I/O, like ``mqserver.zmtp.codec``: a connection feeds it what arrives
and gets whole messages and commands back.  Apart from the codec because
it is the one piece of ZMTP that runs per frame, and is written for that.
"""

from __future__ import annotations

from mqserver.zmtp.codec import COMMAND, LONG, MORE, RESERVED, U64, TooLargeError, ZMTPError

LEAD_FRAMES = 3
"""Frames a message may share with the one before, taken in one comparison."""
MAX_LEAD = 256
"""Wire bytes of those frames beyond which they are not remembered."""
MIDDLE_FRAMES = 2
"""Frames after the lead and one frame of the message's own (eMQP's msgid) that it
may share with an earlier message too (a REQUEST's queue and headers), when
at least one more frame follows them."""


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
    ``max_frames`` frames.  Short frames are taken in a tight loop and
    checked where it stops: within the chunk that holds them (so what they
    cost is bounded by the chunk), before their message is handed on or
    kept.  The first broken rule is kept in ``error`` and ``feed`` returns
    what came before it, so those are still handled.
    Bytes of an incomplete frame wait in a list until enough are in to
    finish it (``_need``): a long frame in many chunks costs O(n), not O(n^2).

    A message whose first ``LEAD_FRAMES`` frames are, byte for byte, those of
    the message before it (eMQP's ``'' | eMQP/1.0 | REQUEST`` again and
    again) takes them in one ``startswith`` and shares their bodies.  After
    them comes a frame of its own (the msgid: real peers, eventmq's client
    and job manager, put a fresh one in every message, so none repeats
    whole): when it is short and the last (a job manager's READY) the
    message is handed on at once; else maybe ``MIDDLE_FRAMES`` frames
    equal to an earlier message's follow it (a client's REQUESTs to one
    queue with the same headers), taken the same way.
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
        # the wire bytes of the last message's first LEAD_FRAMES frames and those
        # frames; and of the MIDDLE_FRAMES after its own frame, if it had them
        self._lead = self._middle = b""
        self._lead_parts: list[bytes] = []
        self._middle_parts: list[bytes] = []

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
        middle, middle_parts = self._middle, self._middle_parts
        lead_size, middle_size = len(lead), len(middle)
        offset, end = 0, len(data)
        # where the message in progress starts in this chunk, if all of its
        # frames are here and contiguous (-1: not), so its first frames can be
        # remembered as the next lead; where its frames after a lead start, if
        # a lead was taken and no middle (so its middle can be remembered)
        first = led = -1
        try:
            while end - offset >= 2:
                if not parts:
                    if lead and data.startswith(lead, offset):
                        offset += lead_size
                        led = offset
                        if end - offset >= 2:  # its own frame's header is here
                            flags = data[offset]
                            own = offset + 2 + data[offset + 1]
                            if not flags and own <= end:
                                # short and its last (a READY): the message, whole
                                if max_frames <= LEAD_FRAMES:
                                    raise TooLargeError(
                                        f"message of more than {max_frames} frames")
                                if lead_size + own - offset > max_message:
                                    raise TooLargeError(
                                        f"message over the {max_message} byte limit")
                                out.append([*lead_parts, data[offset + 2:own]])
                                offset = own
                                led = -1
                                continue
                            # short with MORE, then the middle again?
                            if flags == MORE and middle and data.startswith(middle, own):
                                parts = [*lead_parts, data[offset + 2:own], *middle_parts]
                                size = lead_size + own + middle_size - offset
                                offset = own + middle_size
                                led = -1  # the middle is the one remembered
                                if size > max_message:  # (its frames passed before)
                                    raise TooLargeError(
                                        f"message over the {max_message} byte limit")
                                continue
                        parts, size = lead_parts.copy(), lead_size
                        continue
                    first = offset
                # the common frames, short message frames (0-255 bytes), in a
                # tight loop; the limits are checked where it stops, before
                # anything of the message is handed on or kept
                begin = offset
                while True:
                    flags = data[offset]
                    if flags > MORE:
                        break
                    start = offset + 2
                    stop = start + data[offset + 1]
                    if stop > end:
                        break
                    parts.append(data[start:stop])
                    offset = stop
                    if not flags or end - offset < 2:
                        break
                size += offset - begin
                if size > max_message:
                    raise TooLargeError(f"message over the {max_message} byte limit")
                # stopped after the last frame of a message (offset == stop: that
                # frame was taken), or before a frame it does not take
                complete = not flags and offset == stop
                if not complete:
                    if len(parts) >= max_frames:
                        raise TooLargeError(f"message of more than {max_frames} frames")
                    if flags <= MORE:
                        break  # the chunk ends inside a frame or a frame header
                    # a long frame or a command, the general way
                    found = _header(data, offset, max_message)
                    if found is None:
                        break
                    flags, start, stop = found
                    if stop > end:
                        break
                    if flags & COMMAND:
                        out.append(data[start:stop])
                        offset = stop
                        first = led = -1  # a message around it is not contiguous
                        continue
                    size += stop - offset
                    offset = stop
                    if size > max_message:
                        raise TooLargeError(f"message over the {max_message} byte limit")
                    parts.append(data[start:stop])
                    if flags & MORE:
                        if len(parts) >= max_frames:
                            raise TooLargeError(f"message of more than {max_frames} frames")
                        continue
                if len(parts) > max_frames:
                    raise TooLargeError(f"message of more than {max_frames} frames")
                out.append(parts)
                if first >= 0 and len(parts) > LEAD_FRAMES:
                    led = _frames_end(data, first, LEAD_FRAMES)
                    if led - first <= MAX_LEAD and data[first:led] != lead:
                        lead, lead_parts = data[first:led], parts[:LEAD_FRAMES]
                        lead_size = len(lead)
                if led >= 0 and len(parts) > LEAD_FRAMES + 1 + MIDDLE_FRAMES:
                    own = _frames_end(data, led, 1)
                    middle_end = _frames_end(data, own, MIDDLE_FRAMES)
                    if middle_end - own <= MAX_LEAD:
                        middle, middle_size = data[own:middle_end], middle_end - own
                        middle_parts = parts[LEAD_FRAMES + 1:LEAD_FRAMES + 1 + MIDDLE_FRAMES]
                parts, size = [], 0
                first = led = -1
            # the incomplete frame left, if any: its flags and size are checked now
            found = _header(data, offset, max_message)
        except ZMTPError as e:
            self.error = e
            return out
        self._parts, self._size = parts, size
        self._lead, self._lead_parts = lead, lead_parts
        self._middle, self._middle_parts = middle, middle_parts
        self._keep(data, offset, found[2] - offset if found else _header_size(data[offset:]))
        return out


def _frames_end(data: bytes, offset: int, count: int) -> int:
    """Where the ``count`` whole frames at ``offset`` end (their headers were checked)."""
    for _ in range(count):
        if data[offset] & LONG:
            (size,) = U64.unpack_from(data, offset + 1)
            offset += 9 + size
        else:
            offset += 2 + data[offset + 1]
    return offset


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
    if flags & RESERVED:
        raise ZMTPError(f"reserved frame flag bits set: {flags:#04x}")
    if flags & COMMAND and flags & MORE:
        raise ZMTPError("a command frame cannot have MORE set")
    if flags & LONG:
        if end - offset < 9:
            return None
        (size,) = U64.unpack_from(data, offset + 1)
        start = offset + 9
    else:
        if end - offset < 2:
            return None
        size = data[offset + 1]
        start = offset + 2
    if size > max_frame:
        raise TooLargeError(f"frame of {size} bytes is over the {max_frame} limit")
    return flags, start, start + size
