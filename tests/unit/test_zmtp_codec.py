"""ZMTP 3 wire format: greeting, frames, commands and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.zmtp import codec
from mqserver.zmtp.codec import COMMAND, ZMTPError


def one_frame(data: bytes) -> tuple[int, bytes]:
    """``(flags, body)`` of ``data``, one short frame and nothing else."""
    assert len(data) >= 2 and len(data) == 2 + data[1]
    return data[0], data[2:]


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
    flags, body = one_frame(command)
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
    _, body = one_frame(codec.ping_command(30, b"ctx"))
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


@settings(max_examples=100, deadline=None)
@given(padding=st.binary(min_size=8, max_size=8), minor=st.integers(0, 255),
       filler=st.binary(min_size=32, max_size=32))
def test_any_greeting_padding_and_filler_parse(padding, minor, filler):
    data = b"\xff" + padding + b"\x7f\x03" + bytes((minor,)) + b"NULL".ljust(20, b"\x00") + filler
    greeting = codec.parse_greeting(data)
    assert (greeting.major, greeting.minor, greeting.mechanism) == (3, minor, b"NULL")


def test_encode_message_matches_frame_by_frame_encoding():
    frames = [b"", b"a" * 255, b"b" * 256, b"c"]
    expected = b"".join(codec.encode_frame(f, more=i < 3) for i, f in enumerate(frames))
    assert codec.encode_message(frames) == expected
    assert codec.encode_message([]) == b""
