"""Edge cases of the PHPMQ hot path's shortcuts (issue 8): each remembers or
batches something, and must answer exactly as the long way would.

The ``phpmq`` harness fixture lives in tests/unit/conftest.py.
"""

from __future__ import annotations

import re

import pytest

from mqserver.limits import Limits
from mqserver.protocols.phpmq import codec
from mqserver.protocols.phpmq.codec import Frame, FrameDecoder, PHPMQError
from mqserver.protocols.phpmq.protocol import ID_BATCH

HEX_ID = re.compile(rb"^[0-9a-f]{32}$")
SMALL = Limits(max_name=8, max_id=6)


# -- message ids: one os.urandom call per batch ------------------------------------


def test_message_ids_are_distinct_32_hex_characters():
    ids = codec.message_ids(50)
    assert len(ids) == len(set(ids)) == 50
    assert all(HEX_ID.match(i) for i in ids)


def test_ids_stay_fresh_past_one_batch(phpmq):
    h = phpmq()
    c = h.connect()
    c.publish(b"q", *[b"%d" % n for n in range(ID_BATCH + 3)])
    ids = [m.id for m in h.broker.queues[b"q"].ready]
    assert len(set(ids)) == ID_BATCH + 3
    assert all(HEX_ID.match(i) for i in ids)


# -- the remembered queue name --------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"", "empty queue name"),
        (b"q\n", "control character"),
        (b"q" * 9, "queue name of 9 bytes"),
    ],
)
def test_a_bad_name_after_a_good_one_still_closes(phpmq, bad, reason):
    h = phpmq(limits=SMALL)
    c = h.connect()
    c.publish(b"q", b"fine")
    assert reason in c.close_reason(codec.publish(bad, b"x"))
    assert h.ready(b"q") == [b"fine"]


def test_a_bad_name_in_an_ack_after_a_good_publish_closes(phpmq):
    h = phpmq(limits=SMALL)
    c = h.connect()
    c.publish(b"q", b"fine")
    assert "control character" in c.close_reason(codec.ack(b"q\x00", b"m1"))


# -- acks: names and ids are checked only when the own consumer does not hold them ----


def test_an_ack_for_a_held_message_under_another_queue_name_is_checked(phpmq):
    h = phpmq(limits=SMALL)
    c = h.connect()
    c.publish(b"q", b"x")
    c.send(codec.consume(b"q", 1))
    [held] = c.ids()
    assert "control character" in c.close_reason(codec.ack(b"q\x7f", held))


def test_an_ack_for_an_id_nobody_holds_is_checked(phpmq):
    h = phpmq(limits=SMALL)
    c = h.connect()
    c.publish(b"q", b"x")
    c.send(codec.consume(b"q", 1))
    assert "message id of 7 bytes" in c.close_reason(codec.ack(b"q", b"1234567"))
    assert h.broker.queues[b"q"].in_flight() == 1  # nothing was acked


# -- dispatch heads kept per queue ------------------------------------------------------


def test_dispatches_name_their_queue_across_many_queues(phpmq):
    h = phpmq()
    c = h.connect()
    for n in range(40):  # more queues than the connection keeps heads for
        queue = b"q%d" % n
        c.publish(queue, b"body %d" % n)
        c.send(codec.consume(queue, 1))
        [frame] = c.frames()
        assert frame.packages[codec.QUEUE] == queue
        assert frame.packages[codec.CONTENT] == b"body %d" % n


def test_dispatch_with_and_without_a_kept_head_is_the_same():
    head = codec.dispatch_head(b"Foo", with_ttl=True)
    assert codec.dispatch(b"Foo", b"b", b"id", 5, head) == codec.dispatch(b"Foo", b"b", b"id", 5)
    head = codec.dispatch_head(b"Foo", with_ttl=False)
    assert codec.dispatch(b"Foo", b"b", b"id", None, head) == codec.dispatch(b"Foo", b"b", b"id")


# -- the decoder's remembered package headers ----------------------------------------


def test_a_remembered_package_header_is_still_checked_against_its_frame():
    decoder = FrameDecoder()
    decoder.feed(codec.consume(b"q", 1))
    assert decoder.next_frame() == Frame(codec.CONSUME, {1: b"q", 4: b"1"})
    # P04...1 is remembered from the 002, but has no place in a 001
    decoder.feed(b"H0100102" + codec.package_header(codec.COUNT, 1) + b"1")
    with pytest.raises(PHPMQError, match="package type 04 does not belong in message type 001"):
        decoder.next_frame()


def test_decoding_is_unchanged_after_the_remembered_headers_start_afresh():
    frames = [
        Frame(codec.PUBLISH, {1: b"q", 2: b"x" * n})
        for n in range(codec.PACKAGE_HEADER_CACHE + 10)
    ]
    wire = b"".join(codec.encode_frame(f) for f in frames * 2)
    assert codec.decode(wire) == frames * 2
