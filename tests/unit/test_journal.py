"""The event journal: what the broker records, how segments are written and sealed."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock

from mqserver import tap
from mqserver.broker.core import Broker
from mqserver.journal.encode import Encoder
from mqserver.journal.schema import (
    FIELD_NAMES,
    PUBLISHER_KEY,
    SLIM_KIND,
    SLIM_PUBLISHED,
    SLIM_PUBLISHED_PLAIN,
    SPARK_DDL,
    VERSION,
    parse_segment_name,
    segment_name,
)
from mqserver.journal.writer import Journal
from mqserver.model import QueueOptions
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink

T0 = 1_795_000_000.25  # 2026-11-18T11:06:40.250000Z


def make(tmp_path: Path, **kw) -> tuple[Broker, Journal, Clock]:
    clock = Clock()
    clock.advance(T0)
    broker = Broker(MemoryStore(), clock)
    journal = Journal(str(tmp_path / "j"), clock, node="n1", **kw)
    broker.journal = journal
    journal.startService()
    return broker, journal, clock


def records(tmp_path: Path, suffix: str = ".jsonl") -> list[dict]:
    out = []
    for path in sorted((tmp_path / "j").glob(f"date=*/*{suffix}")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def test_message_lifecycle_is_journaled_with_values_of_the_moment(tmp_path):
    broker, journal, clock = make(tmp_path)
    broker.declare_queue(b"q", QueueOptions(dead_letter=b"dlq"))
    conn = broker.connection_opened("mqks", "127.0.0.1:1", RecordingSink())
    consumer = broker.consume(conn, b"c1", b"q")
    broker.publish_to_queue(b"q", b"m1", b"hello", headers={"k": "v"}, source="phpmq")
    clock.advance(0.5)
    assert broker.reject(consumer, b"m1")
    clock.advance(0)
    assert broker.dead_letter(consumer, b"m1", b"bad")
    broker.publish_to_queue(b"q", b"m2", b"x", ttl=2.0, source="mqks")
    clock.advance(0)
    assert broker.ack(consumer, b"m2")
    broker.connection_closed(conn)
    journal.stopService()
    got = records(tmp_path)
    assert [r["seq"] for r in got] == list(range(1, len(got) + 1))
    assert {r["node"] for r in got} == {"n1"} and {r["v"] for r in got} == {VERSION}
    events = [(r["event"], r.get("queue"), r.get("message_id"), r.get("delivery_count"),
               r.get("reason")) for r in got]
    assert events == [
        ("connection_opened", None, None, None, None),
        ("consumer_opened", "q", None, None, None),
        ("published", "q", "m1", 0, None),
        ("delivered", "q", "m1", 1, None),
        ("requeued", "q", "m1", 1, "rejected"),
        ("delivered", "q", "m1", 2, None),
        ("dead_lettered", "q", "m1", 2, "bad"),
        ("published", "dlq", "m1", 0, "bad"),
        ("published", "q", "m2", 0, None),
        ("delivered", "q", "m2", 1, None),
        ("acked", "q", "m2", 1, None),
        ("consumer_closed", "q", None, None, None),
        ("connection_closed", None, None, None, None),
    ]
    published = got[2]
    assert published["protocol"] == "phpmq" and published["size"] == 5
    assert published["headers"] == {"k": "v"} and "body" not in published
    assert published["ts"] == "2026-11-18T11:06:40.250000Z" == published["publish_ts"]
    assert got[3]["consumer"] == f"{conn.id}/c1" and got[3]["protocol"] == "mqks"
    assert got[8]["ttl_ms"] == 2000
    assert set().union(*got) <= set(FIELD_NAMES)


def test_records_name_the_right_consumer_among_many(tmp_path):
    # consumer keys are multiples of 8 added to the slim records' tags:
    # past the 32nd consumer they are no longer Python's cached small ints
    broker, journal, clock = make(tmp_path)
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    consumers = [broker.consume(conn, b"c%d" % n, b"q%d" % n) for n in range(40)]
    assert all(c.key % (SLIM_KIND + 1) == 0 for c in consumers)
    assert len({c.key for c in consumers}) == 40
    for n in range(40):
        broker.publish_to_queue(b"q%d" % n, b"m%d" % n, b"x")
    clock.advance(0)
    for n, consumer in enumerate(consumers):
        assert broker.ack(consumer, b"m%d" % n)
    journal.stopService()
    settled = [(r["event"], r["consumer"], r["message_id"]) for r in records(tmp_path)
               if r["event"] in ("delivered", "acked")]
    assert sorted(settled) == sorted(
        (event, f"{conn.id}/c{n}", f"m{n}") for n in range(40) for event in ("delivered", "acked"))


def test_expiry_cancel_and_auto_ack(tmp_path):
    broker, journal, clock = make(tmp_path)
    broker.publish_to_queue(b"t", b"old", b"x", ttl=1.0)
    clock.advance(2)
    assert broker.expire_due() == 1
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    c = broker.consume(conn, b"c", b"q")
    broker.publish_to_queue(b"q", b"m", b"x")
    clock.advance(0)
    broker.cancel(c)
    auto = broker.consume(conn, b"auto", b"q", manual_ack=False)
    clock.advance(0)
    broker.cancel(auto)
    journal.flush()
    got = [(r["event"], r.get("message_id"), r.get("reason")) for r in records(tmp_path, ".open")]
    assert ("expired", "old", "expired") in got
    assert ("requeued", "m", "consumer_gone") in got
    assert got[-3:] == [("delivered", "m", None), ("acked", "m", "auto_ack"),
                        ("consumer_closed", None, None)]


def test_a_delivery_settled_on_send_is_journaled_as_an_ack_at_its_delivery_time(tmp_path):
    broker, journal, clock = make(tmp_path)
    conn = broker.connection_opened("emqp", "p", RecordingSink(settled_on_send=True))
    broker.consume(conn, b"w", b"q")
    broker.publish_to_queue(b"q", b"m", b"x")
    clock.advance(0.25)
    journal.flush()
    got = [(r["event"], r.get("message_id"), r.get("reason"), r["ts"])
           for r in records(tmp_path, ".open")]
    delivered, acked = got[-2:]
    assert (delivered[:3], acked[:3]) == (("delivered", "m", None), ("acked", "m", None))
    assert acked[3] == delivered[3]


def test_bodies_are_base64_when_asked(tmp_path):
    broker, journal, _ = make(tmp_path, bodies=True)
    broker.publish_to_queue(b"q", b"m", b"\x00\xffbin")
    journal.stopService()
    [record] = records(tmp_path)
    assert base64.b64decode(record["body"]) == b"\x00\xffbin"


def test_flush_runs_on_the_clock_and_segments_seal_by_size_time_and_stop(tmp_path):
    broker, journal, clock = make(tmp_path, segment_bytes=400, segment_seconds=60)
    folder = tmp_path / "j" / "date=2026-11-18"
    broker.publish_to_queue(b"q", b"m1", b"x")
    assert not folder.exists()  # nothing written on the hot path
    clock.advance(0.5)
    assert [p.name for p in folder.iterdir()] == [segment_name("n1", 1) + ".open"]
    for n in range(5):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    clock.advance(0.5)  # over 400 bytes: sealed
    assert sorted(p.name for p in folder.iterdir()) == [segment_name("n1", 1)]
    broker.publish_to_queue(b"q", b"late", b"x")
    clock.advance(0.5)
    clock.advance(60)  # old enough: sealed
    assert sorted(p.name for p in folder.iterdir()) == [segment_name("n1", 1),
                                                       segment_name("n1", 7)]
    broker.publish_to_queue(b"q", b"last", b"x")
    journal.stopService()
    assert not list(folder.glob("*.open"))
    assert [r["seq"] for r in records(tmp_path)] == list(range(1, 9))


def test_restart_seals_a_leftover_open_segment_and_continues_seq(tmp_path):
    broker, journal, _ = make(tmp_path)
    broker.publish_to_queue(b"q", b"m1", b"x")
    broker.publish_to_queue(b"q", b"m2", b"x")
    journal.flush()  # a crash now leaves the segment open, with a torn line
    [open_path] = (tmp_path / "j").glob("date=*/*.open")
    with open_path.open("a") as f:
        f.write('{"v":1,"seq":3,"ev')
    broker2, journal2, _ = make(tmp_path)
    assert not list((tmp_path / "j").glob("date=*/*.open"))
    broker2.publish_to_queue(b"q", b"m3", b"x")
    journal2.stopService()
    names = sorted(p.name for p in (tmp_path / "j").glob("date=*/*.jsonl"))
    assert names == [segment_name("n1", 1), segment_name("n1", 4)]


def test_a_failing_flush_is_logged_and_the_timer_keeps_running(tmp_path, monkeypatch):
    broker, journal, clock = make(tmp_path)
    broker.publish_to_queue(b"q", b"m1", b"x")

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(journal.writer, "_open", broken)
    clock.advance(0.5)
    monkeypatch.undo()
    broker.publish_to_queue(b"q", b"m2", b"x")
    clock.advance(0.5)
    journal.stopService()
    assert [r["message_id"] for r in records(tmp_path)] == ["m2"]


def test_encoder_splits_a_batch_at_midnight_and_keeps_microseconds():
    encoder = Encoder("n", next_seq=10)
    midnight = 1_795_046_400.0  # 2026-11-19T00:00:00Z
    rest = (None, None, 0, None, None, None, None, None, None, None, None)
    events = [("consumer_opened", midnight - 0.000001, b"q", *rest),
              ("consumer_closed", midnight + 0.5, b"q\n\"", *rest)]
    chunks = encoder.encode([value for event in events for value in event])
    assert [(date, first, count) for date, _, first, count in chunks] == [
        ("2026-11-18", 10, 1), ("2026-11-19", 11, 1)]
    first, second = (json.loads(text) for _, text, _, _ in chunks)
    assert first["ts"] == "2026-11-18T23:59:59.999999Z"
    assert second["queue"] == 'q\n"' and encoder.next_seq == 12


def test_segment_names_round_trip_and_ddl_names_every_field():
    assert parse_segment_name(segment_name("node-a", 42)) == ("node-a", 42)
    assert parse_segment_name(segment_name("n", 7) + ".open") == ("n", 7)
    assert parse_segment_name("other.txt") is None
    assert all(f"`{name}`" in SPARK_DDL for name in FIELD_NAMES)


@pytest.mark.parametrize("on", [True, False])
def test_journal_option_wires_the_journal_into_broker_and_service(tmp_path, on):
    args = ["--protocol", "mqks:tcp:0", "--no-gc-tuning", "--storage=memory", "--no-http"]
    if on:
        args += ["--journal", str(tmp_path / "j"), "--journal-node", "a b",
                 "--journal-segment-bytes", "1000", "--journal-bodies"]
    options = tap.Options()
    options.parseOptions(args)
    service = tap.makeService(options, reactor=MemoryReactorClock())
    journal = service.broker.journal
    if on:
        assert (journal.node, journal.segment_bytes, journal.bodies) == ("a_b", 1000, True)
        assert journal.parent is service
    else:
        assert journal is None


def test_plain_published_records_name_queue_and_protocol_by_a_key_told_once(tmp_path):
    broker, journal, _ = make(tmp_path)
    broker.connection_opened("mqks", "peer", RecordingSink())
    del journal.pending[:]  # connection_opened
    broker.publish_to_queue(b"q", b"m1", b"x", source="mqks")
    broker.publish_to_queue(b"q", b"m2", b"xy", source="mqks")
    broker.publish_to_queue(b"q", b"m3", b"x", source="other")
    broker.publish_to_queue(b"q", b"m4", b"x", headers={"h": "1"}, source="mqks")
    pending = journal.pending
    # (key + tag, ts, message id, size), after a PUBLISHER_KEY record the first time
    told, first, second = pending[:14], pending[14:18], pending[18:22]
    assert (told[0], told[2], told[8]) == (PUBLISHER_KEY, b"q", b"mqks")
    assert first[0] == second[0] == told[13] + SLIM_PUBLISHED_PLAIN
    assert (first[2:], second[2:]) == ([b"m1", 1], [b"m2", 2])
    told_other, third = pending[22:36], pending[36:40]
    assert (told_other[8], third[0]) == ("other", told_other[13] + SLIM_PUBLISHED_PLAIN)
    assert pending[40] == SLIM_PUBLISHED and pending[44] == b"mqks"  # with headers: in full
    assert len(pending) == 49
    broker.delete_queue(b"q")  # the journal process forgets both keys
    assert [(r[0], r[2], r[13]) for r in (pending[49:63], pending[63:77])] == [
        (PUBLISHER_KEY, None, told[13]), (PUBLISHER_KEY, None, told_other[13])]
    journal.stopService()
    assert [(r["event"], r["message_id"], r.get("queue"), r.get("protocol"), r["size"],
             r.get("headers")) for r in records(tmp_path)] == [
        ("published", "m1", "q", "mqks", 1, None), ("published", "m2", "q", "mqks", 2, None),
        ("published", "m3", "q", "other", 1, None),
        ("published", "m4", "q", "mqks", 1, {"h": "1"}),
        # full records, which need no key
        ("deleted", "m1", "q", "mqks", 1, None), ("deleted", "m2", "q", "mqks", 2, None),
        ("deleted", "m3", "q", "other", 1, None), ("deleted", "m4", "q", "mqks", 1, None)]


def test_journal_keeps_values_not_tuples_so_they_cost_no_garbage_collections(tmp_path):
    import gc

    broker, journal, _ = make(tmp_path)
    broker.publish_to_queue(b"q", b"m1", b"x")
    assert journal.pending and not any(gc.is_tracked(value) for value in journal.pending)
    journal.stopService()
    assert [r["event"] for r in records(tmp_path)] == ["published"]


def test_runs_are_journaled_as_their_publishes_one_by_one(tmp_path):
    broker, journal, _ = make(tmp_path)
    broker.bindings.bind(b"a", b"ev")
    broker.bindings.bind(b"b", b"ev")
    broker.publish_event_run(b"ev", [(b"m1", b"x"), (b"m2", b"xy")], source="mqks")
    broker.publish_to_queue_run(b"a", [(b"m3", b"x")], headers={"h": "1"}, source="emqp")
    broker.publish_to_queue_run(b"b", [(b"m4", b"x"), (b"m5", b"x")], ttl=5.0, source="emqp")
    journal.stopService()
    assert [(r["message_id"], r["queue"], r["protocol"], r["size"], r.get("headers"),
             "ttl_ms" in r) for r in records(tmp_path)] == [
        ("m1", "a", "mqks", 1, None, False), ("m1", "b", "mqks", 1, None, False),
        ("m2", "a", "mqks", 2, None, False), ("m2", "b", "mqks", 2, None, False),
        ("m3", "a", "emqp", 1, {"h": "1"}, False),
        ("m4", "b", "emqp", 1, None, True), ("m5", "b", "emqp", 1, None, True)]
