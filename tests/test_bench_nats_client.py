"""The bench's NATS client reads the server's protocol however TCP cuts it.

Its parser takes MSGs (the deliveries of a fetch, the JetStream API's
replies), the ``408`` status of an expired fetch (how many of its batch will
not come), and PINGs, from chunks cut anywhere.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.clients.nats import parse, pub

_bodies = st.binary(max_size=120)
_replies = st.from_regex(rb"\$JS\.ACK\.q\.c\.1\.[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,19}\.0",
                         fullmatch=True)


def msg(reply: bytes, body: bytes) -> bytes:
    return b"MSG q 1 %s %d\r\n%s\r\n" % (reply, len(body), body)


def status(headers: bytes) -> bytes:
    return b"HMSG _INBOX.x 1 %d %d\r\n%s\r\n" % (len(headers), len(headers), headers)


def expired(pending: int) -> bytes:
    return status(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: %d\r\n"
                  b"Nats-Pending-Bytes: 0\r\n\r\n" % pending)


_items = st.one_of(
    st.tuples(st.just("msg"), _replies, _bodies),
    st.tuples(st.just("ping"), st.just(b""), st.just(b"")),
    st.tuples(st.just("expired"), st.just(b""), st.integers(0, 1000).map(lambda n: b"%d" % n)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_items, max_size=12), st.data())
def test_any_chunking_reads_every_message_status_and_ping(items, data):
    wire = b"".join(msg(a, b) if kind == "msg" else b"PING\r\n" if kind == "ping"
                    else expired(int(b)) for kind, a, b in items)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=10)))
    found: list[tuple[bytes, bytes]] = []
    missed = pings = 0
    pending = b""
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got, more_missed, more_pings, pending = parse(pending + wire[a:b])
        found += got
        missed += more_missed
        pings += more_pings
    assert found == [(a, b) for kind, a, b in items if kind == "msg"]
    assert missed == sum(int(b) for kind, _, b in items if kind == "expired")
    assert pings == sum(kind == "ping" for kind, _, _ in items)
    assert pending == b""


def test_an_api_reply_without_a_reply_subject_is_read():
    payload = b'{"stream":"q", "seq":2}'
    assert parse(b"MSG _INBOX.x 1  %d\r\n%s\r\n" % (len(payload), payload)) == (
        [(b"", payload)], 0, 0, b"")


@pytest.mark.parametrize("wire", [
    b"-ERR 'Authorization Violation'\r\n",
    status(b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n"),
])
def test_errors_and_other_statuses_raise(wire):
    with pytest.raises(RuntimeError):
        parse(wire)


def test_pub_with_and_without_a_reply_subject():
    assert pub(b"q", b"hello") == b"PUB q 5\r\nhello\r\n"
    assert pub(b"q.sync", b"x", b"_INBOX.a") == b"PUB q.sync _INBOX.a 1\r\nx\r\n"
