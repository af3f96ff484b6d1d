"""Ack runs: ``Broker.ack_run`` is ``ack`` for each id in turn (issue 8).

The property test drives two brokers through the same publishes, turns,
held chunks and acks, one acking by runs and one id at a time, and wants
the same answers, queues, consumers, deliveries, scheduled calls, store
ops and journal records.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from mqserver.broker.core import Broker
from mqserver.journal.writer import Journal
from mqserver.storage.memory import MemoryStore
from mqserver.testing import DurableMemoryStore, RecordingSink

T0 = 1_795_000_000.25
IDS = [b"a", b"b", b"c", b"d", b"e", b"zz"]  # "zz" is never published
# consumer -> (queue, window): two share q0, one with a window of 2
CONSUMERS = [(b"c0", b"q0", None), (b"c1", b"q0", 2), (b"c2", b"q1", None)]

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from([b"q0", b"q1"]),
                  st.lists(st.sampled_from(IDS[:-1]), max_size=6)),
        st.tuples(st.just("acks"), st.integers(0, len(CONSUMERS) - 1),
                  st.lists(st.sampled_from(IDS), max_size=8)),
        st.tuples(st.just("chunk"), st.integers(0, len(CONSUMERS) - 1),
                  st.lists(st.sampled_from(IDS), max_size=8)),
        st.tuples(st.just("turn"), st.sampled_from([0.0, 0.25])),
    ),
    max_size=25,
)


def scenario(steps: list[Any], durable: bool, journal_on: bool, as_runs: bool) -> Any:
    """Everything ``steps`` leave behind and every ack's answer."""
    clock = Clock()
    clock.advance(T0)
    store = DurableMemoryStore() if durable else MemoryStore()
    broker = Broker(store, clock)
    with tempfile.TemporaryDirectory() as directory:
        journal = None
        if journal_on:
            journal = Journal(str(Path(directory) / "j"), clock, node="n1")
            broker.journal = journal
            journal.startService()
        sink = RecordingSink()
        conn = broker.connection_opened("test", "peer", sink)
        consumers = [broker.consume(conn, cid, queue, window=window, manual_ack=True)
                     for cid, queue, window in CONSUMERS]
        answers: list[Any] = []
        for number, step in enumerate(steps):
            kind = step[0]
            if kind == "publish":
                for message_id in step[2]:
                    broker.publish_to_queue(step[1], message_id, b"body %d" % number)
            elif kind == "turn":
                clock.advance(step[1])
            else:
                if kind == "chunk":  # acks within a received chunk: the chunk's time
                    broker.hold_pump()
                    clock.advance(0.125)
                consumer = consumers[step[1]]
                if as_runs:
                    answers.append(broker.ack_run(consumer, iter(step[2])))
                else:
                    answers.append(sum(broker.ack(consumer, m) for m in step[2]))
                answers.append([call.getTime() for call in clock.getDelayedCalls()])
                if kind == "chunk":
                    broker.pump_now()
        clock.advance(0)
        records = []
        if journal is not None:
            journal.stopService()
            for path in sorted((Path(directory) / "j").glob("date=*/*.jsonl")):
                records += [json.loads(line) for line in path.read_text().splitlines()]
    queues = {name: ([m.id for m in q.ready], q.enqueued, q.delivered, q.acked)
              for name, q in broker.queues.items()}
    held = [(c.id, [(m.id, m.seq) for m in c.unacked.values()], c.delivered, c.acked)
            for c in consumers]
    ops = store.ops if durable else None
    return (answers, queues, held, sink.seen, ops, records,
            (broker.published, broker.queued, broker.delivered))


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, durable=st.booleans(), journal_on=st.booleans())
def test_an_ack_run_is_each_ack_in_turn(steps, durable, journal_on):
    """Unknown and repeated ids, ids held twice (the second delivery waits),
    acks that make room under a window, held chunks and turns between them."""
    runs = scenario(steps, durable, journal_on, as_runs=True)
    assert runs == scenario(steps, durable, journal_on, as_runs=False)


def test_an_ack_run_kicks_its_queue_once_and_counts_what_it_settled(broker, clock):
    conn = broker.connection_opened("test", "peer", RecordingSink())
    consumer = broker.consume(conn, b"c", b"q", window=2, manual_ack=True)
    for message_id in (b"a", b"b", b"c"):
        broker.publish_to_queue(b"q", message_id, b"x")
    clock.advance(0)
    assert list(consumer.unacked) == [b"a", b"b"]
    assert broker.ack_run(consumer, [b"a", b"nope", b"b", b"a"]) == 2
    assert len(clock.getDelayedCalls()) == 1  # one pump for the run
    assert (consumer.acked, consumer.queue.acked) == (2, 2)
    clock.advance(0)
    assert list(consumer.unacked) == [b"c"]


def test_a_failing_store_op_stops_the_run_with_what_was_settled_counted(clock):
    broker = Broker(DurableMemoryStore(), clock)
    conn = broker.connection_opened("test", "peer", RecordingSink())
    consumer = broker.consume(conn, b"c", b"q", manual_ack=True)
    for message_id in (b"a", b"b", b"c"):
        broker.publish_to_queue(b"q", message_id, b"x")
    clock.advance(0)
    removes: list[Any] = []

    def add(op: tuple[Any, ...]) -> None:
        removes.append(op)
        if len(removes) == 2:
            raise OSError("disk full")

    broker.writer.add = add
    with pytest.raises(OSError):
        broker.ack_run(consumer, [b"a", b"b", b"c"])
    # as acks one by one: a's and b's are settled and counted, c is still held
    assert (consumer.acked, consumer.queue.acked, list(consumer.unacked)) == (2, 2, [b"c"])
