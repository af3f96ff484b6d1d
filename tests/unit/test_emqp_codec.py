"""eMQP frame layouts, headers, worker queue lists and eventmq's schedule hash."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqserver.model import Message
from mqserver.protocols.emqp import codec
from mqserver.protocols.emqp.codec import EMQPError
from mqserver.protocols.emqp.fields import RequestFrames, request_frames
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.decoder import MessageDecoder

RUN = json.dumps(["run", {"callable": "add", "path": "jobs", "args": [1, 2], "kwargs": {},
                          "class_args": [], "class_kwargs": {}}]).encode()


def test_parse_envelope_uppercases_the_command_and_ignores_the_version():
    envelope = codec.parse([b"", b"eMQP/9.9", b"ready", b"id", b"a", b"b"])
    assert (envelope.command, envelope.msgid, envelope.body) == (b"READY", b"id", [b"a", b"b"])


@pytest.mark.parametrize("frames", [[], [b"", b"eMQP/1.0", b"READY"], [b"x", b"v", b"C", b"i"]])
def test_malformed_envelopes(frames):
    with pytest.raises(EMQPError):
        codec.parse(frames)


def test_message_builds_frames_with_a_uuid_msgid():
    frames = codec.message(codec.ACK, b"acked")
    assert frames[:3] == [b"", b"eMQP/1.0", b"ACK"] and frames[4:] == [b"acked"]
    assert len(frames[3]) == 36 and frames[3].count(b"-") == 4
    assert codec.message(codec.KBYE, msgid=b"m") == [b"", b"eMQP/1.0", b"KBYE", b"m"]


def test_headers_flags_and_numbers():
    headers = codec.parse_headers(b"reply-requested,guarantee,retry-count:3,timeout:10, nohaste")
    assert headers.reply_requested and headers.guarantee and headers.nohaste
    assert (headers.number("retry-count"), headers.number("timeout")) == (3, 10)
    assert headers.number("run_count") is None
    assert codec.parse_headers(b"").flags == set()
    assert codec.format_headers(headers) == b"guarantee,nohaste,reply-requested,retry-count:3,timeout:10"


@pytest.mark.parametrize("frame", [b"timeout:soon", b"retry-count:-1", b"timeout:1.5"])
def test_bad_header_numbers_make_the_message_malformed(frame):
    with pytest.raises(EMQPError):
        codec.parse_headers(frame)


def test_worker_queues():
    assert codec.parse_worker_queues(b"") == [(10, b"default")]
    assert codec.parse_worker_queues(b'[[10, "default"], [5, "email"]]') == [
        (10, b"default"), (5, b"email"),
    ]


@pytest.mark.parametrize(
    "frame",
    [b"default", b"[]", b'[["10", "a"]]', b"[[10]]", b'{"a": 1}', b'[[true, "a"]]', b'[[1, ""]]',
     b"\xff\xfe"],
)
def test_bad_worker_queues(frame):
    with pytest.raises(EMQPError):
        codec.parse_worker_queues(frame)


def test_schedule_frames_eventmq_and_spec_forms():
    s = codec.parse_schedule([b"default", b"nohaste", b"60", RUN, b""])
    assert (s.queue, s.headers, s.interval, s.payload, s.cron) == (b"default", b"nohaste", 60, RUN, b"")
    s = codec.parse_schedule([b"q", b"", b"-1", RUN, b"*/5 * * * *"])
    assert (s.interval, s.cron) == (-1, b"*/5 * * * *")
    assert codec.parse_schedule([b"q", b"", RUN]).payload == RUN
    with pytest.raises(EMQPError):
        codec.parse_schedule([b"q", b"", b"often", RUN, b""])
    with pytest.raises(EMQPError):
        codec.parse_schedule([b"q"])


def test_schedule_hash_is_eventmqs():
    options = json.loads(RUN)[1]
    expected = hashlib.sha1(json.dumps(
        {k: options[k] for k in ("args", "kwargs", "class_args", "class_kwargs", "path", "callable")},
        sort_keys=True,
    ).encode()).hexdigest()
    assert codec.schedule_hash(RUN) == expected
    # what eventmq 0.3.13's Scheduler.schedule_hash returns for the same job
    assert expected == "19a0327399cce4e900124c06a150c266586c5fdf"


@pytest.mark.parametrize("payload", [b"", b"[]", b'["run"]', b'["run", {"path": "x"}]', b"\xff"])
def test_schedule_hash_needs_a_run_message(payload):
    with pytest.raises(EMQPError):
        codec.schedule_hash(payload)


def test_timeout_reply_detection():
    assert codec.is_timeout_reply(b'{"value": "TimeoutError"}')
    assert not codec.is_timeout_reply(b'{"value": 5}')
    assert not codec.is_timeout_reply(b'"TimeoutError" but not json {')


def test_text_round_trips_any_bytes():
    data = bytes(range(256))
    assert codec.raw(codec.text(data)) == data


@given(st.lists(st.binary(max_size=20), max_size=8))
def test_parse_accepts_or_rejects_any_frames_cleanly(frames):
    try:
        envelope = codec.parse(frames)
    except EMQPError:
        assert len(frames) < 4 or frames[0]
    else:
        assert envelope.body == frames[4:]


def test_new_msgid_is_a_uuid4_string_like_eventmq_sends():
    import uuid

    seen = set()
    for _ in range(200):
        msgid = codec.new_msgid().decode("ascii")
        value = uuid.UUID(msgid)
        assert str(value) == msgid
        assert value.version == 4 and value.variant == uuid.RFC_4122
        seen.add(msgid)
    assert len(seen) == 200


def test_msgids_stay_unique_and_well_formed_where_the_counter_wraps():
    import uuid

    ids = codec.MsgIds(start=(1 << 48) - 2)
    got = [ids().decode("ascii") for _ in range(4)]
    assert [g[-12:] for g in got] == ["fffffffffffe", "ffffffffffff", "000000000000",
                                      "000000000001"]
    assert all(uuid.UUID(g).version == 4 for g in got) and len(set(got)) == 4
    assert codec.MsgIds()().decode("ascii")[:24] != got[0][:24]  # another run, another prefix


@given(st.integers(min_value=0, max_value=1 << 50), st.integers(min_value=1, max_value=600))
def test_msgids_are_the_counter_in_hex_across_blocks(start, count):
    ids = codec.MsgIds(start=start)
    got = [ids() for _ in range(count)]
    prefix = got[0][:24]
    assert got == [prefix + b"%012x" % (n & ((1 << 48) - 1)) for n in range(start, start + count)]
    assert ids.between(b"<", b">") == b"<" + prefix + b"%012x" % ((start + count) & ((1 << 48) - 1)) + b">"


def test_encode_is_the_zmtp_encoding_of_message():

    for command, msgid, body in [(codec.REPLY, b"m1", ()), (codec.ACK, b"", ()),
                                 (codec.REQUEST, b"i" * 300, (b"q", b"", b"p" * 256))]:
        expected = zmtp.encode_message(codec.message(command, *body, msgid=msgid))
        assert codec.encode(command, msgid, *body) == expected


@given(st.binary(max_size=300))
def test_encode_reply_is_encode_of_a_reply_with_a_fresh_msgid(request_msgid):
    answer = codec.encode_reply(request_msgid)
    [frames] = MessageDecoder(2**20, 16).feed(answer)
    assert frames[:3] == [b"", codec.VERSION, codec.REPLY] and frames[4:] == [request_msgid]
    assert answer == codec.encode(codec.REPLY, frames[3], request_msgid)
    assert len(frames[3]) == 36
    assert codec.encode_reply(request_msgid) != answer  # a fresh msgid each time


# -- the REQUEST a worker gets: RequestFrames against request_frames ------------

_FIELDS = st.sampled_from([
    None,
    {},
    {"emqp-headers": "guarantee"},  # another protocol's (PUBLISH): the message's queue
    {"emqp-queue": "q", "emqp-headers": ""},
    {"emqp-queue": "q", "emqp-headers": "guarantee,reply-requested", "emqp-track": "1"},
    {"emqp-queue": "\xe9" * 300, "emqp-headers": "timeout:5"},
    {"emqp-queue": "", "emqp-headers": "x" * 256},
])


@given(
    messages=st.lists(
        st.tuples(st.binary(min_size=1, max_size=300), st.binary(max_size=300),
                  st.binary(max_size=300), _FIELDS, st.booleans()),
        max_size=12,
    ),
    size=st.integers(min_value=1, max_value=3),
)
def test_request_frames_with_cached_middles_agree_with_the_long_way(messages, size):
    encode = RequestFrames(size)
    shared: dict[int, dict[str, str]] = {}
    for msgid, queue, body, fields, share in messages:
        if fields is not None and share:  # many messages of one request shape
            fields = shared.setdefault(id(fields), dict(fields))
        elif fields is not None:
            fields = dict(fields)
        message = Message(msgid, queue, body, headers=fields)
        assert encode(message) == request_frames(message)


@given(st.integers(min_value=0, max_value=1 << 50),
       st.lists(st.binary(max_size=300), max_size=600))
def test_between_each_is_between_for_each_last_frame(start, bodies):
    one_by_one = codec.MsgIds(start=start)
    at_once = copy.copy(one_by_one)  # the same random prefix
    expected = b"".join(one_by_one.between(b"<", zmtp.encode_message([body]))
                        for body in bodies)
    assert at_once.between_each(b"<", bodies) == expected
    assert at_once() == one_by_one()  # the counter moved on alike


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_encode_replies_is_encode_reply_for_each(request_msgids):
    encoded = codec.encode_replies(request_msgids)
    answers = MessageDecoder(2**20, 16).feed(encoded)
    assert [frames[4:] for frames in answers] == [[m] for m in request_msgids]
    assert encoded == b"".join(codec.encode(codec.REPLY, f[3], f[4]) for f in answers)
    counters = [int(f[3][-12:], 16) for f in answers]
    # fresh and in order (the 48-bit counter may wrap)
    assert all((b - a) % (1 << 48) == 1 for a, b in itertools.pairwise(counters))
