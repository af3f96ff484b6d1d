"""PHPMQ frames: the spec's and the 2017 capture's exact bytes, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import Frame, FrameDecoder, PHPMQError

MID = b"d7e7f68761d34838494b233148b5486c"


def lines(*parts: bytes) -> bytes:
    """The spec prints one header or content per line; the wire has no separators."""
    return b"".join(parts)


# Every example of shared/specs/phpmq-protocol.txt, line for line.
SPEC_PUBLISH = lines(
    b"H0100103",
    b"P0100000000000000000000000000003", b"Foo",
    b"P0200000000000000000000000000011", b"Hello World",
    b"P0500000000000000000000000000004", b"3600",
)
SPEC_CONSUME = lines(
    b"H0100202",
    b"P0100000000000000000000000000003", b"Foo",
    b"P0400000000000000000000000000001", b"5",
)
SPEC_DISPATCH = lines(
    b"H0100304",
    b"P0100000000000000000000000000003", b"Foo",
    b"P0200000000000000000000000000011", b"Hello World",
    b"P0300000000000000000000000000032", MID,
    b"P0500000000000000000000000000004", b"3300",
)
SPEC_ACK = lines(
    b"H0100402",
    b"P0100000000000000000000000000003", b"Foo",
    b"P0300000000000000000000000000032", MID,
)
SPEC_REQUEUE = lines(
    b"H0100503",
    b"P0100000000000000000000000000003", b"Foo",
    b"P0300000000000000000000000000032", MID,
    b"P0500000000000000000000000000004", b"3600",
)
SPEC_DEAD_LETTER = lines(
    b"H0100602",
    b"P0100000000000000000000000000003", b"Foo",
    b"P0300000000000000000000000000032", MID,
)

# shared/notes/phpmq.md §3: the real client (pinned 2017 protocol): send, consume 5, ack.
CAPTURE_2017 = (
    b"H0100102P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
    b"H0100202P0100000000000000000000000000003FooP04000000000000000000000000000015"
    b"H0100402P0100000000000000000000000000003FooP0300000000000000000000000000032"
    b"d7e7f68761d34838494b233148b5486c"
)

SPEC = [
    (SPEC_PUBLISH, codec.publish(b"Foo", b"Hello World", 3600),
     Frame(codec.PUBLISH, {1: b"Foo", 2: b"Hello World", 5: b"3600"}), 2018),
    (SPEC_CONSUME, codec.consume(b"Foo", 5), Frame(codec.CONSUME, {1: b"Foo", 4: b"5"}), 2017),
    (SPEC_DISPATCH, codec.dispatch(b"Foo", b"Hello World", MID, 3300),
     Frame(codec.DISPATCH, {1: b"Foo", 2: b"Hello World", 3: MID, 5: b"3300"}), 2018),
    (SPEC_ACK, codec.ack(b"Foo", MID), Frame(codec.ACK, {1: b"Foo", 3: MID}), 2017),
    (SPEC_REQUEUE, codec.requeue(b"Foo", MID, 3600),
     Frame(codec.REQUEUE, {1: b"Foo", 3: MID, 5: b"3600"}), 2018),
    (SPEC_DEAD_LETTER, codec.dead_letter(b"Foo", MID),
     Frame(codec.DEAD_LETTER, {1: b"Foo", 3: MID}), 2018),
]


def test_headers_are_8_and_32_bytes():
    assert codec.message_header(1, 3) == b"H0100103"
    assert codec.package_header(1, 256) == b"P01" + b"0" * 26 + b"256"
    assert len(codec.package_header(5, 10**28)) == codec.PACKAGE_HEADER_SIZE


@pytest.mark.parametrize(("wire", "encoded", "frame", "revision"), SPEC)
def test_spec_examples_encode_and_decode_exactly(wire, encoded, frame, revision):
    assert encoded == wire
    assert codec.decode(wire) == [frame]
    assert codec.encode_frame(frame) == wire
    assert frame.revision == revision


def test_the_2017_capture():
    frames = codec.decode(CAPTURE_2017)
    assert frames == [
        Frame(codec.PUBLISH, {1: b"Foo", 2: b"Hello World"}),
        Frame(codec.CONSUME, {1: b"Foo", 4: b"5"}),
        Frame(codec.ACK, {1: b"Foo", 3: MID}),
    ]
    assert [f.revision for f in frames] == [2017, 2017, 2017]
    assert b"".join(codec.encode_frame(f) for f in frames) == CAPTURE_2017
    assert (
        codec.publish(b"Foo", b"Hello World") + codec.consume(b"Foo", 5) + codec.ack(b"Foo", MID)
    ) == CAPTURE_2017


def test_2017_dispatch_has_three_packages():
    wire = codec.dispatch(b"Foo", b"Hello World", MID)
    assert wire == lines(
        b"H0100303",
        b"P0100000000000000000000000000003", b"Foo",
        b"P0200000000000000000000000000011", b"Hello World",
        b"P0300000000000000000000000000032", MID,
    )
    assert codec.decode(wire)[0].revision == 2017


def test_packages_in_any_order_and_empty_content():
    wire = codec.encode(codec.PUBLISH, [(5, b"0"), (2, b""), (1, b"q")])
    assert codec.decode(wire) == [Frame(codec.PUBLISH, {1: b"q", 2: b"", 5: b"0"})]


MALFORMED = [
    (b"X0100202", "bad message header flag"),
    (b"H01x0202", "non-digit message header"),
    (b"H0200202", "unsupported protocol version 02"),
    (b"H0100902", "unknown message type 009"),
    (b"H0100000", "unknown message type 000"),
    (b"H0100205", r"message type 002 \(consume\) cannot have 05 packages"),
    (b"H0100104", r"message type 001 \(publish\) cannot have 04 packages"),
    (b"H0100502", r"message type 005 \(requeue\) cannot have 02 packages"),
    (b"H0100202Q01" + b"0" * 29, "bad package header flag"),
    (b"H0100202P01" + b"0" * 28 + b"x", "non-digit package header"),
    (b"H0100202P 1" + b"0" * 29, "non-digit package header"),
    (b"H0100202P02" + b"0" * 29, "package type 02 does not belong in message type 002"),
    (b"H0100202P07" + b"0" * 29, "package type 07 does not belong"),
    (b"H0100202P01" + b"0" * 28 + b"1q" + b"P01" + b"0" * 29, "duplicate package type 01"),
    (b"H0100102P01" + b"0" * 27 + b"65", "content length 65 above the limit of 64"),
]


@pytest.mark.parametrize(("data", "reason"), MALFORMED)
def test_malformed_frames_name_the_reason(data, reason):
    decoder = FrameDecoder(max_content=64)
    decoder.feed(data)
    with pytest.raises(PHPMQError, match=reason):
        decoder.next_frame()
    decoder.feed(SPEC_ACK)
    with pytest.raises(PHPMQError, match=reason):  # framing is lost for good
        decoder.next_frame()


def test_content_at_the_limit_is_fine():
    assert codec.decode(codec.publish(b"q", b"x" * 64), max_content=64)[0].packages[2] == b"x" * 64


def test_decode_refuses_a_truncated_stream():
    with pytest.raises(PHPMQError, match="ends inside a frame"):
        codec.decode(SPEC_ACK[:-1])
    with pytest.raises(PHPMQError, match="ends inside a frame"):
        codec.decode(SPEC_ACK[:40])


@pytest.mark.parametrize(
    ("text", "value"), [(b"0", 0), (b"5", 5), (b"0042", 42), (b"9" * 18, 10**18 - 1)]
)
def test_numbers(text, value):
    assert codec.parse_number(text, "count") == value


@pytest.mark.parametrize("text", [b"", b"-1", b"+1", b" 1", b"1_0", b"1.5", b"\xd9\xa1", b"9" * 19])
def test_bad_numbers(text):
    with pytest.raises(PHPMQError, match="count is not a decimal number"):
        codec.parse_number(text, "count")


@pytest.mark.parametrize(
    ("expires_at", "now", "ttl"),
    [
        (None, 5.0, 0),
        (3600.0, 300.0, 3300),
        (1_700_003_600.123, 1_700_000_300.123, 3300),  # float error does not make it 3301
        (100.0, 99.9, 1),  # never 0, which would mean "no expiry"
        (100.0, 98.5, 2),  # rounded up
    ],
)
def test_remaining_ttl(expires_at, now, ttl):
    assert codec.remaining_ttl(expires_at, now) == ttl


def test_a_large_content_arriving_in_small_chunks():
    body = bytes(range(256)) * 4096  # 1 MiB
    wire = codec.publish(b"big", body) + SPEC_ACK
    decoder = FrameDecoder()
    frames = []
    for i in range(0, len(wire), 1000):
        decoder.feed(wire[i : i + 1000])
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert frames == [Frame(codec.PUBLISH, {1: b"big", 2: body}), codec.decode(SPEC_ACK)[0]]
    assert decoder.buffered() == 0 and not decoder.in_frame()


# -- properties ----------------------------------------------------------------

_names = st.binary(min_size=1, max_size=40)
_numbers = st.integers(min_value=0, max_value=10**12).map(lambda n: b"%d" % n)
_values = {
    codec.QUEUE: _names,
    codec.CONTENT: st.binary(max_size=300),
    codec.MESSAGE_ID: st.binary(max_size=40),
    codec.COUNT: _numbers,
    codec.TTL: _numbers,
}


@st.composite
def frames(draw) -> Frame:
    msg_type, count = draw(st.sampled_from(sorted(codec.LAYOUTS)))
    layout = codec.LAYOUTS[(msg_type, count)]
    return Frame(msg_type, {p: draw(_values[p]) for p in layout})


@settings(max_examples=300, deadline=None)
@given(frames())
def test_round_trip(frame):
    assert codec.decode(codec.encode_frame(frame)) == [frame]


@settings(max_examples=300, deadline=None)
@given(st.lists(frames(), min_size=1, max_size=6), st.data())
def test_any_split_decodes_the_same(stream, data):
    wire = b"".join(codec.encode_frame(f) for f in stream)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(wire) - 1)), max_size=20)))
    decoder = FrameDecoder()
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        decoder.feed(wire[a:b])
        while (frame := decoder.next_frame()) is not None:
            got.append(frame)
    assert got == stream


def test_byte_at_a_time():
    wire = b"".join(w for w, *_ in SPEC) + CAPTURE_2017
    decoder = FrameDecoder()
    got = []
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
        while (frame := decoder.next_frame()) is not None:
            got.append(frame)
    assert got == codec.decode(wire)
    assert len(got) == 9


_near_valid = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from([w for w, *_ in SPEC] + [b"H01", b"P01", b"H0100102", b"P0200000"]),
        frames().map(codec.encode_frame),
    ),
    max_size=8,
).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=500), _near_valid), st.integers(1, 64))
def test_arbitrary_bytes_raise_only_the_codec_error(data, chunk):
    decoder = FrameDecoder(max_content=200)
    try:
        for i in range(0, len(data), chunk):
            decoder.feed(data[i : i + chunk])
            while (frame := decoder.next_frame()) is not None:
                assert (frame.type, len(frame.packages)) in codec.LAYOUTS
    except PHPMQError as e:
        assert str(e)
