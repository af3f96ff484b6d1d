"""Runs: frames that repeat the last two-package frame but for its value (issue 8).

The decoder recognises them with one ``startswith`` and hands them over as a
``codec.Run``; the protocol publishes or acks a run in one loop and dispatches
at the end of each received chunk.  Each shortcut must answer exactly as the
frame-by-frame way would.  The ``phpmq`` harness fixture lives in
tests/unit/conftest.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.limits import Limits
from mqserver.model import QueueOptions
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import Frame, FrameDecoder, PHPMQError, Run
from mqserver.protocols.phpmq.decoder import BLOCK
from mqserver.protocols.phpmq.protocol import ID_BATCH

MID = b"0123456789abcdef0123456789abcdef"


def read_all(decoder: FrameDecoder) -> list[Frame | Run]:
    items = []
    while got := decoder.read():
        items.extend(got)
    return items


def in_pieces(decoder: FrameDecoder, wire: bytes, cuts: list[int]) -> list[Frame | Run]:
    """What ``decoder`` reads from ``wire`` fed in pieces cut at ``cuts`` (sorted)."""
    items: list[Frame | Run] = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        decoder.feed(wire[a:b])
        items.extend(read_all(decoder))
    return items


def expand(items: list[Frame | Run]) -> list[Frame]:
    return [f for item in items for f in (item.frames() if isinstance(item, Run) else [item])]


# -- the decoder ---------------------------------------------------------------------


def test_repeated_publishes_come_out_as_one_run():
    decoder = FrameDecoder()
    decoder.feed(b"".join(codec.publish(b"q", b"body %d" % n) for n in range(12)))
    assert decoder.read() == [Run(codec.PUBLISH, b"q", codec.CONTENT, [b"body %d" % n for n in range(12)])]


def test_runs_follow_the_stream_order():
    wire = [
        codec.publish(b"q1", b"a"), codec.publish(b"q1", b"bb"),
        codec.publish(b"q2", b"c"),
        codec.ack(b"q1", MID),
        codec.publish(b"q1", b"d", 60),  # 3 packages: a frame of its own
        codec.publish(b"q1", b"e"),
        codec.encode(codec.ACK, [(codec.MESSAGE_ID, MID), (codec.QUEUE, b"q1")]),  # id first
        codec.ack(b"q1", MID), codec.ack(b"q1", b"other id"),
    ]
    decoder = FrameDecoder()
    decoder.feed(b"".join(wire))
    assert decoder.read() == [
        Run(codec.PUBLISH, b"q1", codec.CONTENT, [b"a", b"bb"]),
        Run(codec.PUBLISH, b"q2", codec.CONTENT, [b"c"]),
        Run(codec.ACK, b"q1", codec.MESSAGE_ID, [MID]),
        Frame(codec.PUBLISH, {1: b"q1", 2: b"d", 5: b"60"}),
        Run(codec.PUBLISH, b"q1", codec.CONTENT, [b"e"]),
        Frame(codec.ACK, {3: MID, 1: b"q1"}),
        Run(codec.ACK, b"q1", codec.MESSAGE_ID, [MID, b"other id"]),
    ]


def test_repeats_whose_value_length_changes():
    bodies = [b"a", b"b", b"cc", b"dd", b"e", b"", b"fff" * 40, b"g"]
    decoder = FrameDecoder()
    decoder.feed(b"".join(codec.publish(b"q", body) for body in bodies))
    assert decoder.read() == [Run(codec.PUBLISH, b"q", codec.CONTENT, bodies)]


def test_a_repeat_whose_length_is_over_the_limit_is_refused():
    decoder = FrameDecoder(max_content=8)
    decoder.feed(codec.publish(b"q", b"12345678") + codec.publish(b"q", b"123456789"))
    assert decoder.read() == [Run(codec.PUBLISH, b"q", codec.CONTENT, [b"12345678"])]
    with pytest.raises(PHPMQError, match="content length 9 above the limit of 8"):
        decoder.read()
    with pytest.raises(PHPMQError):  # and it stays so
        decoder.next_frame()


def test_a_repeat_with_a_mangled_length_is_refused():
    good = codec.publish(b"q", b"abc")
    bad = good[:-4] + b"x" + good[-3:]  # last length digit is now 'x'
    decoder = FrameDecoder()
    decoder.feed(good + bad)
    assert decoder.read() == [Run(codec.PUBLISH, b"q", codec.CONTENT, [b"abc"])]
    with pytest.raises(PHPMQError, match="non-digit package header"):
        decoder.read()


def test_waiting_inside_a_repeat_counts_only_the_unconsumed_bytes():
    first, second = codec.publish(b"q", b"a" * 50), codec.publish(b"q", b"b" * 50)
    decoder = FrameDecoder()
    decoder.feed(first + second[:-10])
    assert len(decoder.read()[0].values) == 1
    # the headers and the queue package are consumed, 40 of the 50 content bytes wait
    assert decoder.in_frame() and decoder.buffered() == 40
    decoder.feed(second[-10:])
    assert decoder.read() == [Run(codec.PUBLISH, b"q", codec.CONTENT, [b"b" * 50])]
    assert decoder.buffered() == 0 and not decoder.in_frame()


_queues = st.sampled_from([b"q", b"q2", b"a-longer-queue-name"])
_repeatable = st.one_of(
    st.builds(codec.publish, _queues, st.binary(max_size=60)),
    st.builds(codec.ack, _queues, st.sampled_from([MID, b"id", b""])),
    st.builds(codec.consume, _queues, st.integers(0, 1000)),
    st.builds(codec.dead_letter, _queues, st.sampled_from([MID, b"id"])),
)
_others = st.one_of(
    st.builds(codec.publish, _queues, st.binary(max_size=20), st.integers(0, 99)),
    st.builds(codec.requeue, _queues, st.just(MID), st.integers(0, 99)),
    st.builds(lambda q, b: codec.encode(codec.PUBLISH, [(codec.CONTENT, b), (codec.QUEUE, q)]),
              _queues, st.binary(max_size=20)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_repeatable, _repeatable, _others), min_size=1, max_size=30), st.data())
def test_any_chunking_decodes_like_one_shot(frames, data):
    wire = b"".join(frames)
    one_shot = codec.decode(wire)
    # each frame alone takes the long way: no run to repeat
    assert one_shot == [codec.decode(f)[0] for f in frames]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(wire) - 1)), max_size=25)))
    decoder = FrameDecoder()
    assert expand(in_pieces(decoder, wire, cuts)) == one_shot
    assert decoder.buffered() == 0 and not decoder.in_frame()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.just(b"x" * 7), st.just(b"y" * 7), st.binary(max_size=9)),
             min_size=BLOCK - 2, max_size=3 * BLOCK),
    st.lists(st.tuples(st.integers(0, 3 * BLOCK), _others), max_size=3),
    st.data(),
)
def test_long_runs_cut_in_blocks_decode_like_one_shot(bodies, inserts, data):
    """Blocks of ``BLOCK`` same-length repeats are cut at once: a frame of another
    length, queue or shape anywhere in one, or a cut through it, changes nothing."""
    frames = [codec.publish(b"q", body) for body in bodies]
    for at, frame in inserts:
        frames.insert(at, frame)
    wire = b"".join(frames)
    expected = [codec.decode(f)[0] for f in frames]
    assert expand(in_pieces(FrameDecoder(), wire, [])) == expected
    cuts = sorted(data.draw(st.sets(st.integers(1, len(wire) - 1), max_size=6)))
    assert expand(in_pieces(FrameDecoder(), wire, cuts)) == expected


@pytest.mark.parametrize("missing", [1, 2, 40])
def test_a_block_not_all_here_waits_for_its_last_frame(missing):
    bodies = [b"%07d" % n for n in range(BLOCK + 1)]  # the first one takes the long way
    wire = b"".join(codec.publish(b"q", body) for body in bodies)
    decoder = FrameDecoder()
    decoder.feed(wire[:-missing])
    assert expand(read_all(decoder)) == [codec.decode(codec.publish(b"q", b))[0] for b in bodies[:-1]]
    decoder.feed(wire[-missing:])
    assert decoder.read() == [Run(codec.PUBLISH, b"q", codec.CONTENT, bodies[-1:])]


@settings(max_examples=200, deadline=None)
@given(st.lists(_repeatable, min_size=1, max_size=10), st.binary(max_size=60), st.integers(1, 50))
def test_garbage_after_runs_raises_only_the_codec_error(frames, garbage, chunk):
    wire = b"".join(frames) + garbage
    decoder = FrameDecoder(max_content=40)
    try:
        for i in range(0, len(wire), chunk):
            decoder.feed(wire[i : i + chunk])
            for frame in expand(read_all(decoder)):
                assert (frame.type, len(frame.packages)) in codec.LAYOUTS
                assert all(len(v) <= 40 for v in frame.packages.values())
    except PHPMQError as e:
        assert str(e)


# -- the protocol ---------------------------------------------------------------------


def test_a_run_of_publishes_to_a_full_queue_drops_only_what_does_not_fit(phpmq):
    h = phpmq()
    h.broker.declare_queue(b"q", QueueOptions(max_length=2, overflow="reject-publish"))
    c = h.connect()
    c.publish(b"q", b"1", b"2", b"3", b"4")
    assert h.ready(b"q") == [b"1", b"2"]
    assert h.broker.queues[b"q"].refused == 2
    assert not c.transport.disconnecting


def test_a_run_of_publishes_gets_the_dead_letter_queue(phpmq):
    h = phpmq(dead_letter_suffix=b"-dlq")
    c = h.connect()
    c.publish(b"q", b"1", b"2")
    assert h.broker.queues[b"q"].options.dead_letter == b"q-dlq"
    assert h.ready(b"q") == [b"1", b"2"]


def test_ids_of_a_run_longer_than_a_batch_are_all_fresh(phpmq):
    h = phpmq()
    c = h.connect()
    c.publish(b"q", b"x")  # the batch is now partly used
    c.publish(b"q", *[b"%d" % n for n in range(2 * ID_BATCH + 5)])
    ids = [m.id for m in h.broker.queues[b"q"].ready]
    assert len(set(ids)) == len(ids) == 2 * ID_BATCH + 6


def test_a_run_of_acks_settles_held_ids_and_checks_the_others(phpmq):
    h = phpmq(limits=Limits(max_id=32))
    c, other = h.connect(), h.connect()
    c.publish(b"q", b"a", b"b", b"c")
    c.send(codec.consume(b"q", 2))
    held = c.ids()
    other.send(codec.consume(b"q", 1))
    [elsewhere] = other.ids()
    # held by this connection, held by another one, unknown, held again
    c.send(codec.ack(b"q", held[0]), codec.ack(b"q", elsewhere),
           codec.ack(b"q", b"f" * 32), codec.ack(b"q", held[1]))
    assert h.broker.queues[b"q"].acked == 3
    c.publish(b"q", b"d")
    assert c.bodies() == [b"d"]
    assert "message id of 33 bytes" in c.close_reason(codec.ack(b"q", b"f" * 33))


def test_a_run_of_acks_from_a_connection_that_consumes_another_queue(phpmq):
    h = phpmq()
    c, acker = h.connect(), h.connect()
    c.publish(b"q", b"a", b"b")
    c.send(codec.consume(b"q", 2))
    ids = c.ids()
    acker.send(codec.consume(b"elsewhere", 1))
    acker.send(*(codec.ack(b"q", i) for i in ids))
    assert h.broker.queues[b"q"].acked == 2


def test_a_bad_frame_after_a_run_closes_once_the_run_is_handled(phpmq):
    h = phpmq()
    c = h.connect()
    reason = c.close_reason(codec.publish(b"q", b"1") + codec.publish(b"q", b"2") + b"X" * 8)
    assert "bad message header flag" in reason
    assert h.ready(b"q") == [b"1", b"2"]


def test_deliveries_an_ack_frees_are_written_in_the_same_chunk(phpmq):
    h = phpmq()
    c = h.connect()
    c.publish(b"q", b"a", b"b", b"c")
    c.send(codec.consume(b"q", 1))
    [first] = c.ids()
    c.protocol.dataReceived(codec.ack(b"q", first))  # no turn of the clock
    assert codec.decode(c.transport.value())[0].packages[codec.CONTENT] == b"b"
    assert not h.clock.getDelayedCalls()


def test_a_run_of_consumes_keeps_the_last(phpmq):
    h = phpmq()
    c = h.connect()
    c.publish(b"q", b"a", b"b", b"c")
    c.send(codec.consume(b"q", 5), codec.consume(b"q", 0), codec.consume(b"q", 2))
    assert c.bodies() == [b"a", b"b"]
