"""The ZMTP 3 frame decoder: frames, whole messages per chunk, shared first frames."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.zmtp import codec
from mqserver.zmtp.codec import COMMAND, LONG, MORE, TooLargeError, ZMTPError
from mqserver.zmtp.decoder import MessageDecoder


def frames_of(data: bytes, max_frame: int = 100_000) -> list[tuple[int, bytes]]:
    """Every whole ``(flags, body)`` frame in ``data``, one ``MessageDecoder.frame`` at a time."""
    decoder = MessageDecoder(max_frame, 64)
    found, frame = [], decoder.frame(data)
    while frame is not None:
        found.append(frame)
        frame = decoder.frame()
    return found


def fed(decoder: MessageDecoder, *chunks: bytes) -> list[list[bytes] | bytes]:
    """What ``feed`` returns over ``chunks``, failing on a decoder error."""
    got: list[list[bytes] | bytes] = []
    for chunk in chunks:
        got += decoder.feed(chunk)
        assert decoder.error is None, decoder.error
    return got


def test_decoder_edges_around_255_and_256_bytes():
    sizes = [0, 1, 254, 255, 256, 257, 70000]
    frames = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    data = codec.encode_message(frames)
    decoded = frames_of(data)
    assert [body for _, body in decoded] == frames
    assert [flags & MORE for flags, _ in decoded] == [MORE] * 6 + [0]
    assert [bool(flags & LONG) for flags, _ in decoded] == [False] * 4 + [True] * 3


def test_decoder_at_every_split_point():
    message = [b"", b"eMQP/1.0", b"x" * 256, b"y" * 255]
    data = codec.encode_message(message) + codec.ping_command()
    ping = frames_of(codec.ping_command())[0][1]
    for split in range(len(data) + 1):
        decoder = MessageDecoder(1000, 64)
        assert fed(decoder, data[:split], data[split:]) == [message, ping], split
        assert decoder.buffered() == 0


def test_decoder_byte_at_a_time():
    data = codec.encode_message([b"a" * 300, b"b"])
    decoder = MessageDecoder(1000, 64)
    assert fed(decoder, *(data[i : i + 1] for i in range(len(data)))) == [[b"a" * 300, b"b"]]


def test_a_huge_announced_frame_is_refused_before_its_body_arrives():
    decoder = MessageDecoder(1024, 64)
    assert decoder.feed(b"\x02" + (2**31).to_bytes(8, "big")) == []
    assert isinstance(decoder.error, TooLargeError)
    assert decoder.buffered() == 0


@pytest.mark.parametrize("flags", [0x08, 0x80, COMMAND | MORE])
def test_bad_flags_are_errors(flags):
    decoder = MessageDecoder(100, 64)
    assert decoder.feed(bytes((flags, 0))) == []
    assert isinstance(decoder.error, ZMTPError)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(st.binary(max_size=600), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=8),
)
def test_encode_then_decode_with_any_chunking(frames, cuts):
    data = codec.encode_message(frames)
    points = sorted({min(c, len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    decoder = MessageDecoder(10_000, 64)
    assert fed(decoder, *(data[a:b] for a, b in itertools.pairwise(bounds))) == [frames]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_the_decoder_never_fails_except_with_zmtp_errors(data):
    decoder = MessageDecoder(64, 8)
    items = decoder.feed(data)  # a broken rule is kept in decoder.error, never raised
    assert decoder.error is None or isinstance(decoder.error, ZMTPError)
    bodies = [body for item in items for body in (item if isinstance(item, list) else [item])]
    assert all(len(body) <= 64 for body in bodies)
    assert all(len(item) <= 8 for item in items if isinstance(item, list))
    assert decoder.buffered() + decoder.in_progress() <= len(data)


# -- MessageDecoder: whole messages per chunk ---------------------------------


def _stream() -> tuple[bytes, list[list[bytes] | bytes]]:
    """Short and long frames, an empty frame, commands between messages."""
    items: list[list[bytes] | bytes] = [
        [b"", b"eMQP/1.0", b"REQUEST", b"1", b"q", b"", b"x" * 100],
        b"\x04PING\x00\x01c",
        [b"y" * 255, b"z" * 256, b""],
        [b"last"],
    ]
    data = b"".join(
        codec.encode_command(item[1:5], item[5:]) if isinstance(item, bytes)
        else codec.encode_message(item) for item in items
    )
    return data, items


def test_message_decoder_returns_messages_and_commands_in_wire_order():
    data, items = _stream()
    decoder = MessageDecoder(10000, 64)
    assert decoder.feed(data) == items
    assert decoder.error is None and decoder.buffered() == 0


def test_message_decoder_split_at_every_byte_gives_the_same_items():
    data, items = _stream()
    for split in range(len(data) + 1):
        decoder = MessageDecoder(10000, 64)
        assert decoder.feed(data[:split]) + decoder.feed(data[split:]) == items


def test_message_decoder_long_frame_in_many_chunks_waits_until_complete():
    data = codec.encode_message([b"a", b"b" * 5000])
    decoder = MessageDecoder(10000, 64)
    got = [decoder.feed(data[i:i + 7]) for i in range(0, len(data), 7)]
    assert [item for items in got for item in items] == [[b"a", b"b" * 5000]]
    assert decoder.buffered() == 0


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (codec.encode_message([b"a" * 600, b"b" * 383]), "message over the 1000 byte limit"),
        # short frames only, whole or still in progress at the chunk's end
        (codec.encode_message([b"c" * 250] * 4 + [b""]), "message over the 1000 byte limit"),
        (codec.encode_message([b"c" * 250] * 5)[:-252], "message over the 1000 byte limit"),
        (b"\x02" + (2000).to_bytes(8, "big"), "frame of 2000 bytes is over"),
        (b"\x01\x00" * 64, "more than 64 frames"),
        (b"\x08", "reserved frame flag bits"),
        (b"\x05\x00", "command frame cannot have MORE"),
    ],
)
def test_message_decoder_keeps_the_first_error_and_returns_what_came_before(data, error):
    decoder = MessageDecoder(1000, 64)
    before = codec.encode_message([b"ok"])
    assert decoder.feed(before + data) == [[b"ok"]]
    assert isinstance(decoder.error, ZMTPError)
    assert error in str(decoder.error)


def test_message_decoder_frame_at_a_time_then_feed_the_rest():
    data = codec.ready_command(b"DEALER") + codec.encode_message([b"m"])
    decoder = MessageDecoder(1000, 64)
    assert decoder.frame(data[:3]) is None
    flags, body = decoder.frame(data[3:])
    assert flags == COMMAND and body.startswith(b"\x05READY")
    assert decoder.frame() == (0, b"m")
    assert decoder.frame() is None
    assert decoder.feed(b"") == []


def long_headers(frames: list[bytes]) -> bytes:
    """A message whose frames all have 8-byte sizes, however short."""
    return b"".join(
        bytes([LONG | (MORE if n < len(frames) - 1 else 0)]) + len(frame).to_bytes(8, "big")
        + frame for n, frame in enumerate(frames)
    )


_LEADS = [[b"", b"eMQP/1.0", b"REQUEST"], [b"", b"eMQP/1.0", b"READY"], [b"", b"x" * 300, b"y"]]


# what may follow a lead and a frame of the message's own (eMQP's queue and headers)
_MIDDLES = [[b"default", b""], [b"q", b"guarantee"], [b"x" * 300, b""], [b"default"]]


_REPEATS = [
    [b"", b"eMQP/1.0", b"READY", b"r"],
    [b"", b"eMQP/1.0", b"READY", b"r", b""],
    [b"", b"eMQP/1.0", b"READY", b"r2"],
    [b"", b"eMQP/1.0", b"READY", b"r" * 20],
    [b"", b"eMQP/1.0", b"READY"],
]


@settings(max_examples=300, deadline=None)
@given(
    stream=st.lists(
        st.one_of(
            # a message that starts like others (eMQP's first frames), or not
            st.tuples(st.sampled_from(range(len(_LEADS))),
                      st.lists(st.binary(max_size=40), max_size=4)),
            st.lists(st.binary(max_size=40), min_size=1, max_size=5),
            st.binary(max_size=20).map(lambda data: codec.ping_command(0, data)),
            # messages that repeat whole, or all but their end (READYs)
            st.sampled_from(_REPEATS),
            # a lead, a frame of its own (a msgid), a middle shared with others, a tail
            st.tuples(st.sampled_from(range(len(_LEADS))), st.binary(max_size=300),
                      st.sampled_from(range(len(_MIDDLES))),
                      st.lists(st.binary(max_size=40), max_size=2)).map(
                lambda t: ("middle", _LEADS[t[0]] + [t[1]] + _MIDDLES[t[2]] + t[3])),
            # short frames sent with 8-byte sizes, which ZMTP allows
            st.lists(st.binary(max_size=40), min_size=1, max_size=5).map(
                lambda frames: ("long headers", frames)),
        ),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
    max_frames=st.integers(min_value=2, max_value=8),
)
def test_messages_sharing_first_frames_decode_alike_whatever_the_chunking(stream, cuts,
                                                                          max_frames):
    # the decoder takes first frames equal to the previous message's in one
    # comparison: it must give what decoding frame by frame gives
    wire, expected = [], []
    for item in stream:
        if isinstance(item, bytes):
            wire.append(item)
            expected.append(frames_of(item)[0][1])
            continue
        if isinstance(item, tuple) and item[0] == "long headers":
            frames = item[1]
            wire.append(long_headers(frames))
            expected.append(frames)
            continue
        if isinstance(item, tuple) and item[0] == "middle":
            wire.append(codec.encode_message(item[1]))
            expected.append(item[1])
            continue
        frames = _LEADS[item[0]] + item[1] if isinstance(item, tuple) else item
        wire.append(codec.encode_message(frames))
        expected.append(frames)
    data = b"".join(wire)
    points = sorted({min(c, len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    decoder = MessageDecoder(10_000, max_frames)
    got: list[list[bytes] | bytes] = []
    for a, b in itertools.pairwise(bounds):
        got += decoder.feed(data[a:b])
        if decoder.error is not None:
            break
    too_long = [n for n, frames in enumerate(expected)
                if isinstance(frames, list) and len(frames) > max_frames]
    if too_long:
        # everything before the first message over the limit, then the error
        assert got == expected[:len(got)] and len(got) <= too_long[0]
        assert isinstance(decoder.error, TooLargeError)
    else:
        assert got == expected and decoder.error is None and decoder.buffered() == 0


def test_a_command_inside_a_message_is_never_taken_as_part_of_a_lead():
    ping = codec.ping_command()
    message = codec.encode_message([b"", b"v", b"cmd", b"1"])
    inside = 2 + 0 + 2 + 1  # after the first two frames
    with_ping = message[:inside] + ping + message[inside:]
    decoder = MessageDecoder(1000, 64)
    ping_body = frames_of(ping)[0][1]
    frames = [b"", b"v", b"cmd", b"1"]
    assert decoder.feed(with_ping + with_ping) == [ping_body, frames, ping_body, frames]
    assert decoder.feed(message + with_ping + message) == [frames, ping_body, frames, frames]


def test_readys_with_a_fresh_msgid_each_share_only_their_first_frames():
    # what eventmq's job manager sends: a new uuid4 msgid in every READY
    ids = [b"%036x" % n for n in range(5)]
    decoder = MessageDecoder(1000, 64)
    got = decoder.feed(b"".join(codec.encode_message([b"", b"eMQP/1.0", b"READY", i])
                                for i in ids))
    assert got == [[b"", b"eMQP/1.0", b"READY", i] for i in ids]
    assert len({id(frames[2]) for frames in got}) == 1  # the lead's bodies, shared


def test_requests_with_a_fresh_msgid_share_their_lead_and_their_queue_and_headers():
    # what eventmq's client sends: REQUESTs to one queue, a new msgid and body each
    requests = [[b"", b"eMQP/1.0", b"REQUEST", b"%036x" % n, b"default", b"", b"job %d" % n]
                for n in range(4)]
    decoder = MessageDecoder(1000, 64)
    got = decoder.feed(b"".join(map(codec.encode_message, requests)))
    assert got == requests
    assert len({id(frames[4]) for frames in got[1:]}) == 1  # the middle's bodies, shared
    # another queue: taken frame by frame, and remembered for the next
    other = [b"", b"eMQP/1.0", b"REQUEST", b"m", b"email", b"", b"x"]
    assert decoder.feed(codec.encode_message(other) * 2) == [other, other]
    # a message the middle takes past the size limit is refused there
    small = MessageDecoder(60, 64)
    short = [b"", b"eMQP/1.0", b"REQUEST", b"m", b"default", b"", b"x"]
    long_own = [b"", b"eMQP/1.0", b"REQUEST", b"m" * 40, b"default", b"", b"x"]
    assert small.feed(codec.encode_message(short) * 2) == [short, short]
    assert small.feed(codec.encode_message(long_own)[:-3]) == []
    assert isinstance(small.error, TooLargeError)


def test_a_message_that_repeats_whole_is_a_list_of_its_own():
    ready = [b"", b"eMQP/1.0", b"READY", b"r"]
    decoder = MessageDecoder(1000, 64)
    got = decoder.feed(codec.encode_message(ready) * 4)
    assert got == [ready] * 4
    assert len({id(frames) for frames in got}) == 4  # a handler may keep or change its list
    ping = codec.ping_command()
    inside = codec.encode_message(ready)[:-3] + ping + codec.encode_message(ready)[-3:]
    ping_body = frames_of(ping)[0][1]
    assert decoder.feed(inside + codec.encode_message(ready)) == [ping_body, ready, ready]
    # a command inside is never remembered as part of a message
    assert decoder.feed(inside * 3) == [ping_body, ready] * 3
