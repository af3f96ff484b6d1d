"""The journal's encoder: flat batches of full and slim events in, JSON lines out.

The encoder is written for speed (one f-string per common record, caches of
rendered timestamps, names and deliveries).  These tests hold it to a plain
reference that builds each record as a dict and renders it with
``json.dumps``: for any stream of events, cut into batches anywhere, the
two must agree byte for byte.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqserver.journal.encode import EVENT_WIDTH, Encoder
from mqserver.journal.schema import (
    CONNECTION_OPENED,
    CONSUMER_CLOSED,
    CONSUMER_OPENED,
    DEAD_LETTERED,
    DELETED,
    EXPIRED,
    PUBLISHED,
    PUBLISHER_KEY,
    PURGED,
    REQUEUED,
    SLIM_ACKED,
    SLIM_AUTO_ACKED,
    SLIM_DELIVERED,
    SLIM_DELIVERED_FIRST,
    SLIM_KIND,
    SLIM_PUBLISHED,
    SLIM_PUBLISHED_PLAIN,
    VERSION,
)

MIDNIGHT = 1_795_046_400.0  # 2026-11-19T00:00:00Z
T0 = 1_795_000_000.25  # 2026-11-18T11:06:40.250000Z


def iso(ts: float) -> str:
    second = int(ts)
    prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{prefix}.{int((ts - second) * 1_000_000):06d}Z"


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Reference:
    """The journal's record rules, spelled out plainly."""

    def __init__(self, node: str, bodies: bool, next_seq: int) -> None:
        self.node, self.bodies, self.seq = node, bodies, next_seq
        self.consumers: dict[int, tuple[Any, ...]] = {}
        self.held: dict[int, dict[bytes, tuple[Any, ...]]] = {}

    def full(self, record: tuple[Any, ...]) -> tuple[Any, ...]:
        """The full event a slim or full record stands for."""
        tag = record[0]
        if not isinstance(tag, int):
            if tag == PUBLISHER_KEY:
                if record[2] is None:
                    self.consumers.pop(record[13], None)
                else:
                    self.consumers[record[13]] = (record[2], None, None, record[8])
                return ()
            if tag in (CONSUMER_OPENED, CONSUMER_CLOSED, REQUEUED):
                key = record[13]
                if tag == CONSUMER_OPENED:
                    self.consumers[key] = (record[2], record[6], record[7], record[8])
                    self.held[key] = {}
                elif tag == CONSUMER_CLOSED:
                    self.consumers.pop(key, None)
                    self.held.pop(key, None)
                else:
                    self.held.get(key, {}).pop(record[3], None)
                return (*record[:13], None)
            return record if tag == PUBLISHED else (*record[:13], None)
        kind, key = tag & SLIM_KIND, tag - (tag & SLIM_KIND)
        queue, consumer, connection, protocol = self.consumers.get(key, (None,) * 4)
        if kind == SLIM_PUBLISHED_PLAIN:
            _, ts, message_id, size = record
            return (PUBLISHED, ts, queue, message_id, ts, 0, consumer, connection, protocol,
                    size, None, None, None, None)
        if kind == SLIM_PUBLISHED:
            _, ts, queue, message_id, protocol, size, expires_at, headers, body = record
            return (PUBLISHED, ts, queue, message_id, ts, 0, None, None, protocol, size,
                    expires_at, None, headers, body)
        if kind in (SLIM_DELIVERED_FIRST, SLIM_DELIVERED):
            if kind == SLIM_DELIVERED_FIRST:
                _, ts, message_id, publish_ts, size = record
                count, expires_at = 1, None
            else:
                _, ts, message_id, publish_ts, count, size, expires_at = record
            self.held.setdefault(key, {})[message_id] = (publish_ts, count, size, expires_at)
            return ("delivered", ts, queue, message_id, publish_ts, count, consumer, connection,
                    protocol, size, expires_at, None, None, None)
        _, ts, message_id = record
        found = self.held.get(key, {}).pop(message_id, None)
        publish_ts, count, size, expires_at = found or (ts, 0, 0, None)
        return ("acked", ts, queue, message_id, publish_ts, count, consumer, connection,
                protocol, size, expires_at, "auto_ack" if kind == SLIM_AUTO_ACKED else None,
                None, None)

    def line(self, record: tuple[Any, ...]) -> tuple[str, str] | None:
        full = self.full(record)
        if not full:
            return None
        (event, ts, queue, message_id, publish_ts, count, consumer, connection, protocol, size,
         expires_at, reason, headers, body) = full
        out: dict[str, Any] = {"v": VERSION, "node": self.node, "seq": self.seq, "ts": iso(ts),
                               "event": event}
        self.seq += 1
        if queue is not None:
            out["queue"] = text(queue)
        if protocol is not None:
            out["protocol"] = text(protocol)
        if connection is not None:
            out["connection"] = connection
            if consumer is not None:
                out["consumer"] = f"{connection}/{text(consumer)}"
        if message_id is not None:
            out.update(message_id=message_id.decode("utf-8", "replace"),
                       publish_ts=iso(publish_ts), delivery_count=count, size=size)
            if expires_at is not None:
                out["ttl_ms"] = round((expires_at - publish_ts) * 1000)
            if headers:
                out["headers"] = {str(k): str(v) for k, v in headers.items()}
            if self.bodies and body:
                out["body"] = base64.b64encode(body).decode("ascii")
        if reason is not None:
            out["reason"] = text(reason)
        return iso(ts)[:10], json.dumps(out, separators=(",", ":")) + "\n"


def lines(chunks: list[tuple[str, str, int, int]]) -> list[tuple[str, str]]:
    """Every line of ``encode``'s chunks with its chunk's date, checking the counts."""
    out = []
    for date, chunk, first, count in chunks:
        got = chunk.splitlines(keepends=True)
        assert len(got) == count
        assert [json.loads(line)["seq"] for line in got] == list(range(first, first + count))
        out += [(date, line) for line in got]
    return out


def flat(records: list[tuple[Any, ...]]) -> list[Any]:
    return [value for record in records for value in record]


# few keys and ids, so that deliveries, acks, requeues and closes meet
KEYS = [8, 40 * (SLIM_KIND + 1)]  # a key past the small-int cache too
IDS = st.sampled_from([b"m1", b'q"\\x\xc3\xa9\xe2\x9c\x93', b"\xff\xfe"])
TIMES = st.sampled_from([T0, T0 + 0.000001, T0 + 0.5, MIDNIGHT - 0.000001, MIDNIGHT,
                         MIDNIGHT + 0.999999, MIDNIGHT + 86400.25])
SIZES = st.integers(0, 10**6)
EXPIRY = st.none() | st.sampled_from([T0 + 5, MIDNIGHT + 30.5])
HEADERS = st.none() | st.just({}) | st.just({"h": "1", "ü": 'a"b'})
QUEUES = st.sampled_from([b"q", b"other", b'q\n"'])
PROTOCOLS = st.sampled_from([b"mqks", "emqp", None])


def full_record(event: str, ts: float, queue: Any, message_id: Any, count: int,
                consumer: Any, connection: Any, protocol: Any, size: Any, expires_at: Any,
                reason: Any, headers: Any, extra: Any) -> tuple[Any, ...]:
    publish_ts = None if message_id is None else ts
    return (event, ts, queue, message_id, publish_ts, count, consumer, connection, protocol,
            size, expires_at, reason, headers, extra)


RECORDS = st.one_of(
    st.builds(lambda k, ts, q, p: full_record(CONSUMER_OPENED, ts, q, None, 0, b"c", 3, p, 0,
                                              None, None, None, k),
              st.sampled_from(KEYS), TIMES, QUEUES, PROTOCOLS),
    st.builds(lambda k, ts, r: full_record(CONSUMER_CLOSED, ts, b"q", None, 0, b"c", 3, b"mqks",
                                           0, None, r, None, k),
              st.sampled_from(KEYS), TIMES, st.sampled_from([None, "queue_deleted"])),
    st.builds(lambda k, ts, i, e: full_record(REQUEUED, ts, b"q", i, 1, b"c", 3, "mqks", 7, e,
                                              "rejected", None, k),
              st.sampled_from(KEYS), TIMES, IDS, EXPIRY),
    st.builds(lambda ts, i, e, r: full_record(r, ts, b"q", i, 2, None, None, "mqks", 5, e,
                                              b"expired", None, None),
              TIMES, IDS, EXPIRY, st.sampled_from([EXPIRED, DEAD_LETTERED, PURGED])),
    # a copy dropped with its queue, in flight (naming its consumer) or ready
    st.builds(lambda ts, i, e, held, r: full_record(DELETED, ts, b"q", i, 1,
                                                    b"c" if held else None, 3 if held else None,
                                                    "emqp", 5, e, r, None, None),
              TIMES, IDS, EXPIRY, st.booleans(),
              st.sampled_from(["queue_deleted", "unused", "consumer_gone"])),
    st.builds(lambda ts, i, h, b: full_record(PUBLISHED, ts, b"dlq", i, 0, None, None, "mqks",
                                              3, None, "maxlen", h, b),
              TIMES, IDS, HEADERS, st.sampled_from([b"abc", False, None])),
    st.builds(lambda ts: full_record(CONNECTION_OPENED, ts, None, None, 0, None, 3, "mqks", None,
                                     None, None, None, None), TIMES),
    st.builds(lambda k, ts, q, p: full_record(PUBLISHER_KEY, ts, q, None, 0, None, None, p, None,
                                              None, None, None, k),
              st.sampled_from(KEYS), TIMES, st.none() | QUEUES, PROTOCOLS),
    st.builds(lambda k, ts, i, s: (k + SLIM_PUBLISHED_PLAIN, ts, i, s),
              st.sampled_from([*KEYS, 24]), TIMES, IDS, SIZES),
    st.builds(lambda ts, q, i, p, s, e, h, b: (SLIM_PUBLISHED, ts, q, i, p, s, e, h, b),
              TIMES, QUEUES, IDS, PROTOCOLS, SIZES, EXPIRY, HEADERS,
              st.sampled_from([b"body", b"", False])),
    st.builds(lambda k, ts, i, p, s: (k + SLIM_DELIVERED_FIRST, ts, i, p, s),
              st.sampled_from([*KEYS, 24]), TIMES, IDS, TIMES, SIZES),
    st.builds(lambda k, ts, i, p, c, s, e: (k + SLIM_DELIVERED, ts, i, p, c, s, e),
              st.sampled_from(KEYS), TIMES, IDS, TIMES, st.integers(1, 9), SIZES, EXPIRY),
    st.builds(lambda k, ts, i, auto: (k + (SLIM_AUTO_ACKED if auto else SLIM_ACKED), ts, i),
              st.sampled_from([*KEYS, 24]), TIMES, IDS, st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(RECORDS, max_size=40), bodies=st.booleans(),
       cuts=st.lists(st.integers(0, 40), max_size=3), next_seq=st.integers(1, 10**12))
def test_encoder_agrees_with_the_reference_in_batches_cut_anywhere(records, bodies, cuts,
                                                                   next_seq):
    reference = Reference("node-1", bodies, next_seq)
    expected = [line for record in records if (line := reference.line(record))]
    encoder = Encoder("node-1", bodies, next_seq)
    got = []
    start = 0
    for cut in sorted({min(c, len(records)) for c in cuts} | {len(records)}):
        got += lines(encoder.encode(flat(records[start:cut])))
        start = cut
    assert got == expected
    assert encoder.next_seq == next_seq + len(expected)


def _opened(key: int) -> tuple[Any, ...]:
    return full_record(CONSUMER_OPENED, T0, b"q", None, 0, b"c", 3, "mqks", 0, None, None, None,
                       key)


@pytest.mark.parametrize(("records", "acked_sizes"), [
    # an ack after its consumer closed, or after its delivery was requeued, joins nothing
    ([_opened(8), (8 + SLIM_DELIVERED_FIRST, T0, b"m1", T0, 5),
     full_record(CONSUMER_CLOSED, T0, b"q", None, 0, b"c", 3, "mqks", 0, None, None, None, 8),
     (8 + SLIM_ACKED, T0 + 1, b"m1")], [0]),
    ([_opened(8), (8 + SLIM_DELIVERED, T0, b"m1", T0, 2, 5, T0 + 9),
      full_record(REQUEUED, T0, b"q", b"m1", 2, b"c", 3, "mqks", 5, None, "rejected", None, 8),
      (8 + SLIM_ACKED, T0 + 1, b"m1")], [0]),
    # one id delivered to two consumers: each ack joins its own delivery
    ([_opened(8), _opened(16), (8 + SLIM_DELIVERED_FIRST, T0, b"m1", T0, 5),
      (16 + SLIM_DELIVERED, T0, b"m1", T0 - 1, 3, 6, None), (16 + SLIM_ACKED, T0, b"m1"),
      (8 + SLIM_AUTO_ACKED, T0, b"m1")], [6, 5]),
], ids=["closed", "requeued", "two-consumers"])
def test_acks_join_only_the_delivery_their_consumer_still_holds(records, acked_sizes):
    reference = Reference("n", False, 1)
    expected = [reference.line(r) for r in records]
    assert lines(Encoder("n").encode(flat(records))) == expected
    acks = [json.loads(line) for _, line in expected if '"event":"acked"' in line]
    assert [ack["size"] for ack in acks] == acked_sizes


def test_slim_records_are_joined_with_their_consumer_and_delivery():
    key = 7 * (SLIM_KIND + 1)  # the broker's seventh consumer
    opened = (CONSUMER_OPENED, T0, b"q", None, None, 0, b"c", 4, "mqks", 0, None, None, None, key)
    publisher = full_record(PUBLISHER_KEY, T0, b"q", None, 0, None, None, b"mqks", None, None,
                            None, None, 16)
    slim = [
        publisher,
        (SLIM_PUBLISHED, T0, b"q", b"m1", b"mqks", 3, T0 + 5, None, False),
        (key + SLIM_DELIVERED, T0 + 1, b"m1", T0, 2, 3, T0 + 5),
        (key + SLIM_ACKED, T0 + 2, b"m1"),
        (16 + SLIM_PUBLISHED_PLAIN, T0 + 3, b"m2", 4),
        (key + SLIM_DELIVERED_FIRST, T0 + 3, b"m2", T0 + 3, 4),
        (key + SLIM_AUTO_ACKED, T0 + 3, b"m2"),
    ]
    (chunk,) = Encoder("n").encode(flat([opened, *slim]))
    got = [json.loads(line) for line in chunk[1].splitlines()][1:]
    consumer = {"queue": "q", "protocol": "mqks", "connection": 4, "consumer": "4/c"}
    assert [{k: r.get(k) for k in ("event", *consumer, "delivery_count", "size", "ttl_ms",
                                   "reason")} for r in got] == [
        {"event": "published", "queue": "q", "protocol": "mqks", "connection": None,
         "consumer": None, "delivery_count": 0, "size": 3, "ttl_ms": 5000, "reason": None},
        {"event": "delivered", **consumer, "delivery_count": 2, "size": 3, "ttl_ms": 5000,
         "reason": None},
        {"event": "acked", **consumer, "delivery_count": 2, "size": 3, "ttl_ms": 5000,
         "reason": None},
        {"event": "published", "queue": "q", "protocol": "mqks", "connection": None,
         "consumer": None, "delivery_count": 0, "size": 4, "ttl_ms": None, "reason": None},
        {"event": "delivered", **consumer, "delivery_count": 1, "size": 4, "ttl_ms": None,
         "reason": None},
        {"event": "acked", **consumer, "delivery_count": 1, "size": 4, "ttl_ms": None,
         "reason": "auto_ack"},
    ]
    assert {r["publish_ts"] for r in got[:3]} == {"2026-11-18T11:06:40.250000Z"}


def test_a_batch_that_ends_inside_a_record_or_holds_an_unknown_tag_is_refused():
    record = (CONNECTION_OPENED, T0, None, None, None, 0, None, 1, "mqks", None, None, None,
              None, None)
    assert len(record) == EVENT_WIDTH
    with pytest.raises(ValueError, match="ends inside"):
        Encoder("n").encode(list(record[:-1]))
    with pytest.raises(ValueError, match="unknown slim"):
        Encoder("n").encode([6, T0, b"x"])
