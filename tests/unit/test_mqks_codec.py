"""MQKS formats and argument parsing."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqserver.model import Message
from mqserver.protocols.mqks import codec
from mqserver.protocols.mqks.codec import MQKSError


def test_error_id_is_24_characters_date_then_random():
    eid = codec.error_id(0.5, b"\x00\x01\x02\x03")
    assert eid == b"19700101000000500000" + b"0123"
    assert len(codec.error_id(1.7e9)) == 24


def test_delivery_line_with_and_without_retry():
    message = Message(b"m1", b"q", b"d 1  x", event=b"e1")
    assert codec.delivery(b"c1", message) == b"c1 ok m1 event=e1 d 1  x\n"
    message.retry = 2
    assert codec.delivery(b"c1", message) == b"c1 ok m1 event=e1,retry=2 d 1  x\n"


def test_delivery_of_a_queue_message_with_newlines_stays_one_line():
    message = Message(b"m1", b"jobs", b"a\nb\\c\r")
    assert codec.delivery(b"c", message) == b"c ok m1 event=jobs a\\nb\\\\c\\r\n"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ((set(), None, False, False), b"c ok --update q\n"),
        (({b"e2", b"e1"}, 5.0, False, True), b"c ok --update q e1 e2 --delete-queue-when-unused=5.0 --manual-ack\n"),
        (({b"e"}, 0.0, True, False), b"c ok --update q e --delete-queue-when-unused\n"),
        (({b"e"}, 0.0, False, False), b"c ok --update q e --delete-queue-when-unused=0.0\n"),
    ],
)
def test_update_line(args, line):
    assert codec.update_line(b"c", b"q", *args) == line


def test_parse_consume_full():
    args = codec.parse_consume(
        b"--confirm q1 e1 e2 --add e3 --delete-queue-when-unused=5 --manual-ack"
    )
    assert (args.confirm, args.queue, args.replace, args.add) == (True, b"q1", [b"e1", b"e2"], [b"e3"])
    assert (args.delete_when_unused, args.bare, args.manual_ack, args.has_add) == (5.0, False, True, True)


def test_parse_consume_flags_anywhere_and_bare_auto_delete():
    args = codec.parse_consume(b"--manual-ack q --delete-queue-when-unused e")
    assert (args.queue, args.replace, args.delete_when_unused, args.bare) == (b"q", [b"e"], 0.0, True)


@pytest.mark.parametrize(
    "data",
    [b"q --bogus", b"q e --confirm", b"", b"--manual-ack", b"q --delete-queue-when-unused=x",
     b"q --delete-queue-when-unused=-1", b"q --delete-queue-when-unused=inf",
     b"q --delete-queue-when-unused=nan"],
)
def test_parse_consume_errors(data):
    with pytest.raises(MQKSError):
        codec.parse_consume(data)


def test_parse_rebind_collects_each_list():
    args = codec.parse_rebind(b"--confirm q a b --remove c --remove-mask d.* --add e f --remove g")
    assert (args.confirm, args.queue) == (True, b"q")
    assert (args.replace, args.remove, args.remove_mask, args.add) == (
        [b"a", b"b"], [b"c", b"g"], [b"d.*"], [b"e", b"f"]
    )
    assert codec.parse_rebind(b"q").remove_all


@pytest.mark.parametrize("data", [b"", b"--add x", b"q --nope x"])
def test_parse_rebind_errors(data):
    with pytest.raises(MQKSError):
        codec.parse_rebind(data)


def test_parse_settle_and_single():
    assert codec.parse_settle(b"--confirm c1 --all") == (True, b"c1", b"--all")
    assert codec.parse_settle(b"c1 m1") == (False, b"c1", b"m1")
    assert codec.parse_single(b"--confirm q", "queue") == (True, b"q")
    # the fast path (two parts, no --confirm) and what it must leave to the slow one
    assert codec.parse_settle(b"--confirm c1 m1") == (True, b"c1", b"m1")
    assert codec.parse_settle(b"--confirmx m1") == (False, b"--confirmx", b"m1")
    for bad in (b"c1", b"c1 m1 x", b"", b"--confirm c1", b"c1 ", b" m1", b"--confirm  m1"):
        with pytest.raises(MQKSError):
            codec.parse_settle(bad)
    with pytest.raises(MQKSError):
        codec.parse_single(b"a b", "queue")


def test_parse_eval():
    assert codec.parse_eval(b"--worker=0 len(state.queues)") == (0, "len(state.queues)")
    assert codec.parse_eval(b"WORKERS") == (None, "WORKERS")
    with pytest.raises(MQKSError):
        codec.parse_eval(b"--worker=x 1")


@given(st.binary(max_size=200))
def test_parsers_only_ever_raise_mqks_error(data):
    for parse in (codec.parse_consume, codec.parse_rebind, codec.parse_settle, codec.parse_eval):
        with contextlib.suppress(MQKSError):
            parse(data)


@given(st.binary(max_size=300))
def test_escaped_body_never_contains_a_line_break(body):
    escaped = codec.escape_body(body)
    assert b"\n" not in escaped and b"\r" not in escaped


WORDS = st.lists(st.sampled_from([b"c1", b"m1", b"--confirm", b"--all", b"", b"a b"]), max_size=4)


@given(WORDS)
def test_settle_words_parse_as_the_data_does(args):
    """``ack``/``reject`` parse the words ``_request`` split; the answer is the data's."""
    line = b" ".join([b"r", b"ack", *args])
    words = line.split(b" ", 3)
    if len(words) < 3:
        assert len(line.split(b" ", 2)) < 3  # a short line: _request answers it
        return
    data = line.split(b" ", 2)[2]
    assert codec.request_data(words) == data
    try:
        expected = codec.parse_settle(data)
    except MQKSError:
        with pytest.raises(MQKSError):
            codec.parse_settle_words(words)
    else:
        assert codec.parse_settle_words(words) == expected


def test_with_data_hands_over_everything_after_the_action():
    seen = []
    handler = codec.with_data(lambda protocol, request_id, data:
                              seen.append((protocol, request_id, data)))
    handler("p", b"r", b"r consume q  a b".split(b" ", 3))
    assert seen == [("p", b"r", b"q  a b")]


@given(st.binary(max_size=100))
def test_strip_confirm_takes_only_a_first_confirm_with_its_space(data):
    """The original's rule for every action (``startswith('--confirm ')``)."""
    assert codec.strip_confirm(b"--confirm " + data) == (True, data)
    if not data.startswith(b"--confirm "):
        assert codec.strip_confirm(data) == (False, data)
    assert codec.strip_confirm(b"--confirm") == (False, b"--confirm")


NAME_WORDS = st.lists(st.sampled_from([b"e", b"e.x", b"--add", b"--manual-ack", b"--confirm",
                                       b"--delete-queue-when-unused=5", b"", b"--remove",
                                       b"--remove-mask", b"--max-length=3"]), max_size=30)


@given(NAME_WORDS, st.integers(1, 12))
def test_the_name_count_precheck_refuses_exactly_what_the_count_refuses(words, max_names):
    """``check_names`` (before the split) refuses a request exactly when its parsed
    names are over the limit, whatever flags (repeated ones too) stand between them."""
    data = b" ".join([b"q", *words])
    for parse, names in (
        (codec.parse_consume, lambda a: len(a.replace) + len(a.add)),
        (codec.parse_rebind,
         lambda a: len(a.replace) + len(a.remove) + len(a.remove_mask) + len(a.add)),
    ):
        try:
            expected = parse(data)
        except MQKSError:
            continue
        if names(expected) > max_names:
            with pytest.raises(MQKSError, match="--max-names-per-request"):
                parse(data, max_names)
        else:
            assert parse(data, max_names) == expected
