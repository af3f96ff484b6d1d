"""Every copy that leaves a queue gets exactly one terminal journal record.

The broker runs on ``task.Clock`` with a real ``Journal`` writing segments
in-process; each test reads the JSON lines back.  ``ledger`` is the
integrity report's arithmetic done by hand: per queue, published = acked +
dead-lettered + expired + moved + purged + deleted + still there, where
"still there" is read from the broker itself (ready + in flight).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.journal.schema import TERMINAL_EVENTS
from mqserver.journal.writer import Journal
from mqserver.model import QueueOptions
from mqserver.storage.memory import MemoryStore
from mqserver.testing import RecordingSink

T0 = 1_795_000_000.25


def make(path: Path) -> tuple[Broker, Journal, Clock]:
    clock = Clock()
    clock.advance(T0)
    broker = Broker(MemoryStore(), clock)
    journal = Journal(str(path), clock, node="n1")
    broker.journal = journal
    journal.startService()
    return broker, journal, clock


def read(journal: Journal) -> list[dict[str, Any]]:
    journal.flush()
    out = []
    for segment in sorted(Path(journal.directory).glob("date=*/*.jsonl*")):
        out += [json.loads(line) for line in segment.read_text().splitlines()]
    return out


def copy(record: dict[str, Any]) -> tuple[str, str, str]:
    return record["queue"], record["message_id"], record["publish_ts"]


def ledger(records: list[dict[str, Any]]) -> dict[str, Counter]:
    """Per queue, the count of each message event; asserts that no copy ended
    more often than it was published (copies of one id dead-lettered from two
    queues into one share their key, so keys are counted, not deduplicated)."""
    published = Counter(copy(r) for r in records if r["event"] == "published")
    ended = Counter(copy(r) for r in records if r["event"] in TERMINAL_EVENTS)
    assert ended - published == Counter(), "a copy ended twice or without being published"
    out: dict[str, Counter] = {}
    for r in records:
        if "message_id" in r:
            out.setdefault(r["queue"], Counter())[r["event"]] += 1
    return out


def still_there(broker: Broker, name: bytes) -> int:
    queue = broker.queues.get(name)
    return 0 if queue is None else len(queue.ready) + queue.in_flight()


def assert_balanced(broker: Broker, records: list[dict[str, Any]]) -> dict[str, Counter]:
    counts = ledger(records)
    for queue, c in counts.items():
        ended = sum(c[event] for event in TERMINAL_EVENTS)
        assert c["published"] == ended + still_there(broker, queue.encode()), (queue, c)
    return counts


def terminal(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["event"], r["queue"], r["message_id"], r.get("reason"), r.get("consumer"),
             r["delivery_count"]) for r in records if r["event"] in TERMINAL_EVENTS]


def test_acks_of_every_kind_end_their_copy_once(tmp_path):
    broker, journal, clock = make(tmp_path)
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    manual = broker.consume(conn, b"c", b"q")
    for n in range(5):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    clock.advance(0)
    assert broker.ack(manual, b"m0")
    assert broker.ack_run(manual, [b"m1", b"m2", b"m1"]) == 2
    assert broker.ack_any(b"q", b"m3")
    assert broker.ack_all(manual) == 1
    sent = broker.connection_opened("emqp", "p", RecordingSink(settled_on_send=True))
    broker.consume(sent, b"w", b"s")
    auto = broker.consume(conn, b"a", b"auto", manual_ack=False)
    broker.publish_to_queue(b"s", b"m5", b"x")
    broker.publish_to_queue(b"auto", b"m6", b"x")
    clock.advance(0)
    assert auto.unacked == {}
    got = read(journal)
    assert terminal(got) == [("acked", "q", f"m{n}", None, f"{conn.id}/c", 1) for n in range(5)] \
        + [("acked", "s", "m5", None, f"{sent.id}/w", 1),
           ("acked", "auto", "m6", "auto_ack", f"{conn.id}/a", 1)]
    assert_balanced(broker, got)


def test_dead_letters_expiries_and_drop_head(tmp_path):
    broker, journal, clock = make(tmp_path)
    broker.declare_queue(b"q", QueueOptions(dead_letter=b"dlq", max_length=2))
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    consumer = broker.consume(conn, b"c", b"q", window=1)
    broker.publish_to_queue(b"q", b"bad", b"x", source="mqks")
    clock.advance(0)  # delivered
    broker.publish_to_queue(b"q", b"late", b"x", ttl=1.0, source="mqks")
    broker.publish_to_queue(b"q", b"m1", b"x", source="mqks")
    broker.publish_to_queue(b"q", b"m2", b"x", source="mqks")  # over max_length: drops "late"
    broker.publish_to_queue(b"t", b"old", b"x", ttl=1.0, source="phpmq")
    clock.advance(2)
    assert broker.expire_due() == 1  # "old"
    assert broker.dead_letter(consumer, b"bad", b"poison")
    clock.advance(0)  # m1 delivered
    broker.publish_to_queue(b"q", b"soon", b"x", ttl=0.5)
    broker.cancel(consumer)  # m1 back to the head, ahead of m2 and "soon"
    clock.advance(1)
    broker.consume(conn, b"d", b"q")
    clock.advance(0)  # "soon" expires as dispatch reaches it
    got = read(journal)
    assert terminal(got) == [
        ("dead_lettered", "q", "late", "maxlen", None, 0),
        ("expired", "t", "old", "expired", None, 0),
        ("dead_lettered", "q", "bad", "poison", None, 1),
        ("expired", "q", "soon", "expired", None, 0),
    ]
    counts = assert_balanced(broker, got)
    # the dead letters and the expiry of q went on to dlq as new copies
    assert counts["dlq"]["published"] == 3 and still_there(broker, b"dlq") == 3


def test_retries_running_out_dead_letter_once_from_a_reject_or_a_cancel(tmp_path):
    broker, journal, clock = make(tmp_path)
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    consumer = broker.consume(conn, b"c", b"q")
    once = {"x-max-retries": "0"}
    broker.publish_to_queue(b"q", b"r", b"x", headers=once)
    broker.publish_to_queue(b"q", b"g", b"x", headers=once)
    clock.advance(0)
    assert broker.reject(consumer, b"r")
    broker.cancel(consumer)
    got = read(journal)
    assert terminal(got) == [("dead_lettered", "q", "r", "retries", None, 1),
                             ("dead_lettered", "q", "g", "retries", None, 1)]
    assert [(r["event"], r.get("reason")) for r in got if r.get("message_id") == "g"][-2:] == [
        ("requeued", "consumer_gone"), ("dead_lettered", "retries")]
    assert_balanced(broker, got)


def test_a_cancel_without_requeue_deletes_what_the_consumer_held(tmp_path):
    broker, journal, clock = make(tmp_path)
    conn = broker.connection_opened("phpmq", "p", RecordingSink())
    consumer = broker.consume(conn, b"c", b"q", window=2)
    for n in range(3):
        broker.publish_to_queue(b"q", b"m%d" % n, b"x", source="mqks")
    clock.advance(0)
    broker.cancel(consumer, requeue=False)
    got = read(journal)
    assert terminal(got) == [("deleted", "q", f"m{n}", "consumer_gone", f"{conn.id}/c", 1)
                             for n in range(2)]
    deleted = [r for r in got if r["event"] == "deleted"]
    assert {r["protocol"] for r in deleted} == {"phpmq"}  # the consumer's, as it is named
    assert got[-1]["event"] == "consumer_closed" and "reason" not in got[-1]
    assert_balanced(broker, got)


def test_purge_ends_each_ready_copy_and_leaves_deliveries_alone(tmp_path):
    broker, journal, clock = make(tmp_path)
    broker.pack_ready_after = 4  # purge reads packed chunks too
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    consumer = broker.consume(conn, b"c", b"q", window=1)
    for n in range(12):
        broker.publish_to_queue(b"q", b"m%d" % n, b"body", ttl=60 if n % 2 else None,
                                source="mqks")
    clock.advance(0)
    assert broker.purge(b"q") == 11
    assert broker.purge(b"nope") == 0
    got = read(journal)
    assert terminal(got) == [("purged", "q", f"m{n}", None, None, 0) for n in range(1, 12)]
    purged = [r for r in got if r["event"] == "purged"]
    assert {(r["protocol"], r["size"]) for r in purged} == {("mqks", 4)}
    assert [r.get("ttl_ms") for r in purged[:2]] == [60000, None]
    assert broker.ack(consumer, b"m0")
    got = read(journal)
    assert assert_balanced(broker, got)["q"] == Counter(published=12, delivered=1, acked=1,
                                                       purged=11)


def test_deleting_a_queue_with_consumers_ends_every_copy_and_closes_each_consumer(tmp_path):
    broker, journal, clock = make(tmp_path)
    first = broker.connection_opened("mqks", "p", RecordingSink())
    second = broker.connection_opened("emqp", "p", RecordingSink())
    a = broker.consume(first, b"a", b"q", window=1)
    broker.consume(second, b"b", b"q", window=2)
    broker.reconfigure(b"q", add=[b"ev"])
    for n in range(5):
        broker.publish_event(b"ev", b"m%d" % n, b"x", source="mqks")
    clock.advance(0)  # m0 to a, m1 and m2 to b
    assert broker.reject(a, b"m0")  # its second delivery waits behind m3 and m4
    clock.advance(0)
    assert broker.delete_queue(b"q")
    assert not broker.delete_queue(b"q")
    got = read(journal)
    ended = terminal(got)
    assert ended == [
        ("deleted", "q", "m3", "queue_deleted", f"{first.id}/a", 1),
        ("deleted", "q", "m1", "queue_deleted", f"{second.id}/b", 1),
        ("deleted", "q", "m2", "queue_deleted", f"{second.id}/b", 1),
        ("deleted", "q", "m4", "queue_deleted", None, 0),
        ("deleted", "q", "m0", "queue_deleted", None, 1),
    ]
    closed = [(r["consumer"], r["reason"]) for r in got if r["event"] == "consumer_closed"]
    assert closed == [(f"{first.id}/a", "queue_deleted"), (f"{second.id}/b", "queue_deleted")]
    broker.connection_closed(first)
    broker.connection_closed(second)
    got = read(journal)
    assert sum(r["event"] == "consumer_closed" for r in got) == 2  # no second close
    assert assert_balanced(broker, got)["q"] == Counter(published=5, delivered=4, requeued=1,
                                                        deleted=5)


def test_a_move_ends_the_copy_in_its_source_and_publishes_one_in_its_target(tmp_path):
    broker, journal, clock = make(tmp_path)
    broker.declare_queue(b"to")
    for n in range(3):
        broker.publish_to_queue(b"from", b"m%d" % n, b"x")
    moving = broker.move(b"from", b"to", limit=2)
    while not moving.called:  # a move takes reactor turns (IBroker.move)
        clock.advance(0)
    assert moving.result.moved == 2
    got = read(journal)
    assert terminal(got) == [("moved", "from", f"m{n}", "moved", None, 0) for n in range(2)]
    counts = assert_balanced(broker, got)
    assert (counts["from"], counts["to"]) == (Counter(published=3, moved=2),
                                              Counter(published=2))


def test_queues_deleted_when_unused_end_their_ready_copies(tmp_path):
    broker, journal, clock = make(tmp_path)
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    broker.declare_queue(b"now", QueueOptions(delete_when_unused=0))
    broker.declare_queue(b"later", QueueOptions(delete_when_unused=5))
    now = broker.consume(conn, b"n", b"now")
    broker.consume(conn, b"l", b"later")
    broker.publish_to_queue(b"now", b"a", b"x")
    broker.publish_to_queue(b"later", b"b", b"x")
    clock.advance(0)
    broker.publish_to_queue(b"later", b"c", b"x")  # not dispatched before the close
    assert broker.reject(now, b"a")  # ready again, delivered once
    broker.connection_closed(conn)
    assert b"now" not in broker.queues and b"later" in broker.queues
    clock.advance(5)
    assert b"later" not in broker.queues
    got = read(journal)
    assert terminal(got) == [("deleted", "now", "a", "unused", None, 1),
                             ("deleted", "later", "b", "unused", None, 1),
                             ("deleted", "later", "c", "unused", None, 0)]
    assert_balanced(broker, got)


OPS = st.lists(st.tuples(
    st.sampled_from(["publish", "publish_ttl", "publish_event", "dispatch", "ack", "reject",
                     "dead_letter", "cancel", "cancel_drop", "consume", "expire", "purge",
                     "delete", "options", "move"]),
    st.integers(0, 2), st.integers(0, 3)), max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_any_mix_of_operations_balances_every_queue(tmp_path_factory, ops):
    broker, journal, clock = make(tmp_path_factory.mktemp("j"))
    broker.pack_ready_after = 3
    names = [b"q0", b"q1", b"q2"]
    broker.reconfigure(b"q0", add=[b"ev"])
    broker.reconfigure(b"q1", add=[b"ev"])
    conn = broker.connection_opened("mqks", "p", RecordingSink())
    consumers: list[Any] = []
    serial = 0
    for op, q, n in ops:
        name = names[q]
        live = [c for c in consumers if c.active]
        if op.startswith("publish"):
            serial += 1
            headers = {"x-max-retries": str(n)} if n < 2 else None
            if op == "publish_event":
                broker.publish_event(b"ev", b"m%d" % serial, b"x", headers=headers)
            else:
                broker.publish_to_queue(name, b"m%d" % serial, b"x", headers=headers,
                                        ttl=1.0 + n if op == "publish_ttl" else None)
        elif op == "dispatch":
            clock.advance(0.5 * n)
        elif op == "consume":
            consumers.append(broker.consume(conn, b"c%d" % len(consumers), name,
                                            window=n or None, manual_ack=n != 3))
        elif op in ("ack", "reject", "dead_letter", "cancel", "cancel_drop") and live:
            consumer = live[n % len(live)]
            held = list(consumer.unacked)
            if op == "cancel" or op == "cancel_drop":
                broker.cancel(consumer, requeue=op == "cancel")
            elif held:
                message_id = held[0]
                if op == "ack":
                    broker.ack(consumer, message_id)
                elif op == "reject":
                    broker.reject(consumer, message_id)
                else:
                    broker.dead_letter(consumer, message_id, b"bad")
        elif op == "expire":
            clock.advance(n)
            broker.expire_due()
        elif op == "purge":
            broker.purge(name)
        elif op == "delete":
            broker.delete_queue(name)
        elif op == "move" and name in broker.queues and names[n % 3] in broker.queues \
                and names[n % 3] != name:
            moving = broker.move(name, names[n % 3], limit=n or None)
            while not moving.called:
                clock.advance(0)
        elif op == "options":
            broker.declare_queue(name, QueueOptions(
                dead_letter=names[(q + 1) % 3] if n else None, max_length=n or None,
                delete_when_unused=0 if n == 3 else None))
    assert_balanced(broker, read(journal))
    journal.stopService()
