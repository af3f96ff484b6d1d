"""Property tests that fill the gaps of the per-codec test modules.

For each codec: what it builds, it parses back unchanged (round trip), and
arbitrary input only ever raises the codec's own error (a protocol turns
that error into its reply or a close; anything else would be a crash).
Covers MQKS request arguments, ZMTP commands/properties/greetings, eMQP
headers/worker queues/schedules/REQUESTs, the HTTP field checkers and the
shared name rules.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqserver.limits import LimitError, Limits, find_control
from mqserver.protocols.emqp import codec as emqp
from mqserver.protocols.emqp.codec import EMQPError
from mqserver.protocols.mqks import codec as mqks
from mqserver.protocols.mqks.codec import MQKSError
from mqserver.web import fields
from mqserver.web.router import APIError
from mqserver.zmtp import codec as zmtp
from mqserver.zmtp.codec import ZMTPError
from mqserver.zmtp.decoder import MessageDecoder

# an MQKS token: no space or line break, and not a flag
token = st.binary(min_size=1, max_size=12).filter(
    lambda b: b" " not in b and b"\n" not in b and not b.startswith(b"--")
)
tokens = st.lists(token, max_size=4)
limits = Limits(max_name=16, max_id=16, max_headers=4)

# -- MQKS ---------------------------------------------------------------------


@given(st.booleans(), token, tokens, tokens, st.booleans(), st.booleans())
def test_mqks_consume_arguments_round_trip(confirm, queue, replace, add, manual, dqwu):
    parts = [b"--confirm"] if confirm else []
    parts += [queue, *replace]
    if add:
        parts += [b"--add", *add]
    if manual:
        parts.append(mqks.MANUAL_ACK)
    if dqwu:
        parts.append(mqks.DQWU + b"=2.5")
    args = mqks.parse_consume(b" ".join(parts))
    assert (args.confirm, args.queue, args.replace, args.add) == (confirm, queue, replace, add)
    assert args.manual_ack == manual and args.delete_when_unused == (2.5 if dqwu else None)


@given(st.booleans(), token, tokens, tokens, tokens, tokens)
def test_mqks_rebind_arguments_round_trip(confirm, queue, replace, remove, masks, add):
    parts = ([b"--confirm"] if confirm else []) + [queue, *replace]
    for flag, group in ((b"--remove", remove), (b"--remove-mask", masks), (b"--add", add)):
        if group:
            parts += [flag, *group]
    args = mqks.parse_rebind(b" ".join(parts))
    assert (args.confirm, args.queue, args.replace) == (confirm, queue, replace)
    assert (args.remove, args.remove_mask, args.add) == (remove, masks, add)


@given(st.booleans(), token, st.one_of(token, st.just(mqks.ALL)))
def test_mqks_settle_arguments_round_trip(confirm, consumer, message):
    data = (b"--confirm " if confirm else b"") + consumer + b" " + message
    assert mqks.parse_settle(data) == (confirm, consumer, message)


@given(st.binary(max_size=200))
def test_mqks_single_and_seconds_only_raise_mqks_error(data):
    with contextlib.suppress(MQKSError):
        mqks.parse_single(data, "queue")
    with contextlib.suppress(MQKSError):
        assert mqks.parse_seconds(data) >= 0


# -- ZMTP ---------------------------------------------------------------------

names = st.binary(min_size=1, max_size=255)


@given(names, st.binary(max_size=300))
def test_zmtp_commands_round_trip(name, data):
    # a command comes out of the decoder as its bytes body, a message as a list
    [body] = MessageDecoder(1 << 20, 64).feed(zmtp.encode_command(name, data))
    assert isinstance(body, bytes)
    assert zmtp.parse_command(body) == (name, data)


@given(st.dictionaries(names.map(bytes.lower), st.binary(max_size=300), max_size=5))
def test_zmtp_properties_round_trip(properties):
    encoded = zmtp.encode_properties(list(properties.items()))
    assert zmtp.parse_properties(encoded) == properties


@given(st.binary(max_size=200))
def test_zmtp_command_properties_greeting_and_ping_only_raise_zmtp_errors(data):
    for parse in (zmtp.parse_command, zmtp.parse_properties, zmtp.parse_greeting,
                  zmtp.parse_ping, zmtp.check_signature):
        with contextlib.suppress(ZMTPError):
            parse(data)


@given(st.binary(min_size=64, max_size=64))
def test_zmtp_any_64_bytes_are_a_greeting_or_a_zmtp_error(data):
    with contextlib.suppress(ZMTPError):
        greeting = zmtp.parse_greeting(data)
        assert greeting.major >= 3 and len(greeting.mechanism) <= 20


# -- eMQP ---------------------------------------------------------------------

header_name = st.text("abcdefghijklmnopqrstuvwxyz-_", min_size=1, max_size=12)


@given(st.sets(header_name, max_size=4), st.dictionaries(header_name, st.integers(0, 10**12),
                                                          max_size=4))
def test_emqp_headers_round_trip(flags, values):
    headers = emqp.Headers(flags - set(values), values)
    assert emqp.parse_headers(emqp.format_headers(headers)) == headers


@given(st.lists(st.tuples(st.integers(-(10**6), 10**6), st.text(min_size=1, max_size=16)),
                min_size=1, max_size=5))
def test_emqp_worker_queues_round_trip(queues):
    frame = json.dumps([[w, n] for w, n in queues]).encode()
    expected = [(w, n.encode("utf-8", "surrogateescape")) for w, n in queues]
    assert emqp.parse_worker_queues(frame) == expected


@given(st.lists(st.binary(max_size=40), max_size=8), st.binary(max_size=200))
def test_emqp_parsers_only_raise_emqp_errors(frames, data):
    checks = [
        lambda: emqp.parse(frames, limits), lambda: emqp.parse_request(frames, limits),
        lambda: emqp.parse_schedule(frames, limits), lambda: emqp.parse_headers(data),
        lambda: emqp.parse_worker_queues(data, limits), lambda: emqp.schedule_hash(data),
    ]
    for check in checks:
        with contextlib.suppress(EMQPError):
            check()
    assert emqp.is_timeout_reply(data) in (True, False)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10))
def test_emqp_any_json_worker_queues_or_run_message_is_accepted_or_an_emqp_error(value):
    encoded = json.dumps(value).encode()
    for parse in (emqp.parse_worker_queues, emqp.schedule_hash):
        with contextlib.suppress(EMQPError):
            parse(encoded)


# -- HTTP fields ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(["v", "body", "body_base64"]), json_values, max_size=3))
def test_http_field_checkers_only_answer_400(obj):
    checks = [
        lambda: fields.number(obj, "v", 1.0, 0, 100),
        lambda: fields.number(obj, "v", 1, 0, 100, integer=True),
        lambda: fields.boolean(obj, "v"),
        lambda: fields.string(obj, "v"),
        lambda: fields.names(obj, "v", limits),
        lambda: fields.names(obj, "v", limits, ids=True),
        lambda: fields.headers(obj, "v", limits),
        lambda: fields.checked(obj, "v", limits),
        lambda: fields.message_body(obj),
    ]
    for check in checks:
        try:
            check()
        except APIError as e:
            assert e.status == 400


@given(st.dictionaries(st.sampled_from(["queue", "event", "id"]), st.binary(max_size=30)))
def test_http_path_parameters_pass_or_answer_400(params):
    try:
        fields.check_params(limits, params)
    except APIError as e:
        assert e.status == 400


# -- the shared name rules --------------------------------------------------------


@given(st.binary(max_size=24))
def test_a_name_passes_exactly_when_it_is_short_non_empty_and_control_free(value):
    valid = 0 < len(value) <= 16 and not any(b < 0x20 or b == 0x7F for b in value)
    try:
        assert limits.check_name(value) == value
        assert valid
    except LimitError:
        assert not valid


def _worker_queues_as_json_reads_them(value):
    """What the eMQP worker-queue list means when all of it is read with ``json``."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for entry in value:
        if (not isinstance(entry, list) or len(entry) != 2 or type(entry[0]) is not int
                or not isinstance(entry[1], str) or not entry[1]):
            return None
        out.append((entry[0], entry[1].encode("utf-8", "surrogateescape")))
    return out


worker_queue_lists = st.lists(
    st.one_of(st.tuples(st.integers(-(10**30), 10**30), st.text(max_size=8)).map(list),
              st.lists(st.one_of(st.integers(), st.text(max_size=3), st.booleans(),
                                 st.floats(allow_nan=False)), max_size=3)),
    max_size=5)


@given(worker_queue_lists | st.none() | st.integers() | st.dictionaries(st.text(max_size=3),
                                                                       st.integers(), max_size=2),
       st.sampled_from([None, 0, 2]), st.sampled_from([(",", ":"), (", ", ": "), (" ,", ":")]))
def test_emqp_worker_queues_read_one_entry_at_a_time_as_json_reads_the_list(value, indent,
                                                                              separators):
    """The entry-at-a-time reader (bounded by --max-names-per-request) accepts what
    ``json`` reads as [int, non-empty str] pairs, in any JSON layout, and nothing else."""
    frame = json.dumps(value, indent=indent, separators=separators).encode()
    expected = _worker_queues_as_json_reads_them(value)
    if expected is None:
        with pytest.raises(EMQPError):
            emqp.parse_worker_queues(frame)
    else:
        assert emqp.parse_worker_queues(frame) == expected
        if any(find_control(name) for _, name in expected):
            return  # refused by the name rules, whatever the count
        many = Limits(max_names=len(expected))
        assert emqp.parse_worker_queues(frame, many) == expected
        if len(expected) > 1:
            with pytest.raises(EMQPError, match="--max-names-per-request"):
                emqp.parse_worker_queues(frame, Limits(max_names=len(expected) - 1))
