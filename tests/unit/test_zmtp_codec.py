"""ZMTP 3 wire format: greeting, commands, properties and the frame decoder."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.zmtp import codec
from mqserver.zmtp.codec import COMMAND, LONG, MORE, MessageDecoder, TooLargeError, ZMTPError


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


def peer_greeting(minor: int = 1, padding: bytes = b"\x00" * 8, mechanism: bytes = b"NULL",
                  major: int = 3) -> bytes:
    return (b"\xff" + padding + b"\x7f" + bytes((major, minor)) + mechanism.ljust(20, b"\x00")
            + b"\x00" * 32)


def test_our_greeting_is_64_bytes_zmtp_31_null_client():
    data = codec.greeting()
    assert len(data) == 64
    assert data[0] == 0xFF and data[9] == 0x7F
    assert data[10:12] == b"\x03\x01"
    assert data[12:32] == b"NULL" + b"\x00" * 16
    assert data[32] == 0 and data[33:] == b"\x00" * 31


@pytest.mark.parametrize("minor", [0, 1, 7])
@pytest.mark.parametrize("padding", [b"\x00" * 8, b"\x00" * 7 + b"\x09", b"\xaa" * 8])
def test_any_padding_and_minor_version_is_accepted(minor, padding):
    greeting = codec.parse_greeting(peer_greeting(minor, padding))
    assert (greeting.major, greeting.minor, greeting.mechanism) == (3, minor, b"NULL")
    assert not greeting.as_server


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n" + b"x" * 48,  # another protocol
        b"\xff" + b"\x00" * 8 + b"\x7e" + b"\x00" * 54,  # ZMTP 1.0: bit 0 of byte 9 clear
        peer_greeting(major=2),
    ],
)
def test_non_zmtp3_peers_are_refused(data):
    with pytest.raises(ZMTPError):
        codec.parse_greeting(data)


def test_signature_is_checked_from_ten_bytes():
    codec.check_signature(b"\xff\x00")  # not enough yet
    with pytest.raises(ZMTPError):
        codec.check_signature(b"\x01" + b"\x00" * 9)


@pytest.mark.parametrize(
    ("size", "header"),
    [
        (0, b"\x00\x00"),
        (255, b"\x00\xff"),
        (256, b"\x02" + (256).to_bytes(8, "big")),
        (2**31, b"\x02" + (2**31).to_bytes(8, "big")),
        (2**32 + 1, b"\x02" + (2**32 + 1).to_bytes(8, "big")),
    ],
)
def test_frame_header_short_and_long_edges(size, header):
    assert codec.frame_header(size) == header


def test_message_sets_more_on_all_but_the_last_frame():
    data = codec.encode_message([b"", b"a", b"x" * 300])
    assert data == b"\x01\x00" + b"\x01\x01a" + b"\x02" + (300).to_bytes(8, "big") + b"x" * 300


def test_ready_properties_round_trip_with_case_insensitive_names():
    command = codec.ready_command(b"ROUTER", b"id")
    [(flags, body)] = frames_of(command)
    assert flags == COMMAND
    name, data = codec.parse_command(body)
    assert name == b"READY"
    assert codec.parse_properties(data) == {b"socket-type": b"ROUTER", b"identity": b"id"}
    assert codec.parse_properties(b"\x0bSOCKET-TYPE\x00\x00\x00\x06DEALER") == {
        b"socket-type": b"DEALER"
    }


@pytest.mark.parametrize(
    "data",
    [b"\x00", b"\x05ab", b"\x02ab\x00\x00", b"\x02ab\x00\x00\x00\x09short"],
)
def test_malformed_properties_are_errors(data):
    with pytest.raises(ZMTPError):
        codec.parse_properties(data)


def test_ping_and_pong():
    [(_, body)] = frames_of(codec.ping_command(30, b"ctx"))
    name, data = codec.parse_command(body)
    assert name == b"PING"
    assert codec.parse_ping(data) == (30, b"ctx")
    assert codec.pong_command(b"c" * 40) == codec.encode_command(b"PONG", b"c" * 16)
    with pytest.raises(ZMTPError):
        codec.parse_ping(b"\x00")


def test_error_command_carries_a_short_reason():
    data = codec.error_command(b"invalid socket type")
    assert data == b"\x04\x1a\x05ERROR\x13invalid socket type"


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x09READY"])
def test_malformed_commands(body):
    with pytest.raises(ZMTPError):
        codec.parse_command(body)


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


@settings(max_examples=100, deadline=None)
@given(padding=st.binary(min_size=8, max_size=8), minor=st.integers(0, 255),
       filler=st.binary(min_size=32, max_size=32))
def test_any_greeting_padding_and_filler_parse(padding, minor, filler):
    data = b"\xff" + padding + b"\x7f\x03" + bytes((minor,)) + b"NULL".ljust(20, b"\x00") + filler
    greeting = codec.parse_greeting(data)
    assert (greeting.major, greeting.minor, greeting.mechanism) == (3, minor, b"NULL")


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
    decoder = codec.MessageDecoder(10000, 64)
    assert decoder.feed(data) == items
    assert decoder.error is None and decoder.buffered() == 0


def test_message_decoder_split_at_every_byte_gives_the_same_items():
    data, items = _stream()
    for split in range(len(data) + 1):
        decoder = codec.MessageDecoder(10000, 64)
        assert decoder.feed(data[:split]) + decoder.feed(data[split:]) == items


def test_message_decoder_long_frame_in_many_chunks_waits_until_complete():
    data = codec.encode_message([b"a", b"b" * 5000])
    decoder = codec.MessageDecoder(10000, 64)
    got = [decoder.feed(data[i:i + 7]) for i in range(0, len(data), 7)]
    assert [item for items in got for item in items] == [[b"a", b"b" * 5000]]
    assert decoder.buffered() == 0


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (codec.encode_message([b"a" * 600, b"b" * 383]), "message over the 1000 byte limit"),
        (b"\x02" + (2000).to_bytes(8, "big"), "frame of 2000 bytes is over"),
        (b"\x01\x00" * 64, "more than 64 frames"),
        (b"\x08", "reserved frame flag bits"),
        (b"\x05\x00", "command frame cannot have MORE"),
    ],
)
def test_message_decoder_keeps_the_first_error_and_returns_what_came_before(data, error):
    decoder = codec.MessageDecoder(1000, 64)
    before = codec.encode_message([b"ok"])
    assert decoder.feed(before + data) == [[b"ok"]]
    assert isinstance(decoder.error, ZMTPError)
    assert error in str(decoder.error)


def test_message_decoder_frame_at_a_time_then_feed_the_rest():
    data = codec.ready_command(b"DEALER") + codec.encode_message([b"m"])
    decoder = codec.MessageDecoder(1000, 64)
    assert decoder.frame(data[:3]) is None
    flags, body = decoder.frame(data[3:])
    assert flags == COMMAND and body.startswith(b"\x05READY")
    assert decoder.frame() == (0, b"m")
    assert decoder.frame() is None
    assert decoder.feed(b"") == []


def test_encode_message_matches_frame_by_frame_encoding():
    frames = [b"", b"a" * 255, b"b" * 256, b"c"]
    expected = b"".join(codec.encode_frame(f, more=i < 3) for i, f in enumerate(frames))
    assert codec.encode_message(frames) == expected
    assert codec.encode_message([]) == b""


_LEADS = [[b"", b"eMQP/1.0", b"REQUEST"], [b"", b"eMQP/1.0", b"READY"], [b"", b"x" * 300, b"y"]]
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
            # messages that repeat whole (the bench's READY), or all but their end
            st.sampled_from(_REPEATS),
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
