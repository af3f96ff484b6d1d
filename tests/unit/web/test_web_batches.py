"""Batch publishing and batch acks over HTTP, in memory: one broker run, one durability wait."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqserver.limits import Limits
from mqserver.model import QueueOptions
from mqserver.web.batches import parse
from mqserver.web.router import APIError

from .conftest import Web
from .test_web_metrics import web_on_slow_store

NDJSON = {"Content-Type": "application/x-ndjson"}


def runs_of(web, name: str) -> list[int]:
    """Wrap the broker's ``name`` (a publish run) to record each call's entry count."""
    sizes: list[int] = []
    real = getattr(web.broker, name)

    def spy(target, entries, *args):
        sizes.append(len(entries))
        return real(target, entries, *args)

    setattr(web.broker, name, spy)
    return sizes


def test_a_json_array_is_one_run_into_the_queue_and_answers_every_id_in_order(make_web):
    web = make_web(max_body=100_000)
    web.broker.declare_queue(b"q")
    runs = runs_of(web, "publish_to_queue_run")
    batch = [{"body": f"m{n}"} for n in range(1000)]
    batch[3]["id"] = "mine"
    status, answer = web.request("POST", "/api/queues/q/messages/batch", json=batch)
    assert status == 201, answer
    assert runs == [1000]
    ready = list(web.broker.queues[b"q"].ready)
    assert [m.body for m in ready] == [f"m{n}".encode() for n in range(1000)]
    assert answer["ids"] == [m.id.decode() for m in ready] and answer["ids"][3] == "mine"
    assert (answer["queue"], answer["count"], answer["durable"]) == ("q", 1000, False)
    assert len(set(answer["ids"])) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in answer["ids"][4:])
    assert {m.source for m in ready} == {"http"}


def test_ndjson_to_an_event_keeps_headers_ttl_and_binary_bodies(web):
    web.broker.reconfigure(b"a", replace=[b"e"])
    web.broker.reconfigure(b"b", replace=[b"e"])
    runs = runs_of(web, "publish_event_run")
    lines = [
        {"body": "plain"},
        {"body_base64": base64.b64encode(b"\xff\x00").decode(), "id": "bin"},
        {"body": "h1", "headers": {"k": "v"}, "ttl": 5},
        {"body": "h2", "headers": {"k": "v"}, "ttl": 5},
    ]
    data = "\r\n".join(json.dumps(line) for line in lines).encode() + b"\n\n"
    status, answer = web.request("POST", "/api/events/e/batch", data=data, headers=NDJSON)
    assert status == 201, answer
    assert runs == [2, 2]  # consecutive messages that share headers and ttl share a run
    assert (answer["event"], answer["count"], answer["queues"]) == ("e", 4, 2)
    for name in (b"a", b"b"):
        ready = list(web.broker.queues[name].ready)
        assert [m.body for m in ready] == [b"plain", b"\xff\x00", b"h1", b"h2"]
        assert [m.id.decode() for m in ready] == answer["ids"]
        assert (ready[2].headers, ready[2].expires_at, ready[2].event) == ({"k": "v"}, 5.0, b"e")
        assert ready[0].headers is None and ready[0].expires_at is None


def test_an_empty_batch_publishes_nothing(web):
    web.broker.declare_queue(b"q")
    assert web.request("POST", "/api/queues/q/messages/batch", json=[]) == (
        201, {"queue": "q", "count": 0, "ids": [], "durable": False})
    status, answer = web.request("POST", "/api/events/e/batch", data=b"\n", headers=NDJSON)
    assert (status, answer["ids"], answer["queues"]) == (201, [], 0)
    assert web.broker.published == 0


@pytest.mark.parametrize(("kwargs", "status", "message"), [
    ({"json": [{"body": "a"}, {"body": "b"}, {"body": "c", "ttl": -1}]}, 400,
     "message 2: 'ttl' must be at least 0"),
    ({"json": [{"body": "a"}, "b"]}, 400, "message 1 must be a JSON object"),
    ({"json": [{"body": "a"}, {"body": "\ud800"}]}, 400, "message 1: '\\ud800' is not encodable"),
    ({"json": [{"body": "a"}, {}]}, 400, "message 1: give exactly one of"),
    ({"json": [{"body": "a", "id": ""}]}, 400, "message 0: 'id' must be a non-empty string"),
    ({"json": [{"body": "a", "headers": {"x": 1}}]}, 400, "message 0: 'headers' must be"),
    ({"json": [{"body": "a", "durable": "maybe"}]}, 400, "message 0: 'durable' must be"),
    ({"json": [{"body": "a", "ttl": 10 ** 400}]}, 400, "message 0: 'ttl' must be at most"),
    ({"json": {"body": "a"}}, 400, "a batch is a JSON array"),
    ({"data": b"[{", "headers": {"Content-Type": "application/json"}}, 400,
     "request body is not valid JSON"),
    ({"data": b"[" * 100_000}, 413, "request body is larger"),
    ({"data": b'{"body": "a"}\n\n{"body": 1}\n', "headers": NDJSON}, 400,
     "message 1 (line 3): 'body' must be a string"),
    ({"data": b'{"body": "a"}\n{"body": "b"\n', "headers": NDJSON}, 400,
     "message 1 (line 2) is not valid JSON"),
    ({"data": b"a,b", "headers": {"Content-Type": "text/csv"}}, 400,
     "a batch is application/json (an array) or application/x-ndjson, not 'text/csv'"),
    ({"json": [{"body": "x"}] * 11}, 413,
     "more than 10 messages in one batch (--http-max-batch): message 10 is the first one"),
    ({"data": b'{"body": "x"}\n' * 11, "headers": NDJSON}, 413, "message 10 is the first one"),
    ({"json": [{"body": "x" * 600}, {"body": "y" * 600}]}, 413, "larger than 1000 bytes"),
])
def test_a_bad_batch_is_refused_whole_naming_the_message(web, kwargs, status, message):
    web.api.max_batch = 10
    web.broker.declare_queue(b"q")
    got, answer = web.request("POST", "/api/queues/q/messages/batch", **kwargs)
    assert (got, answer["status"]) == (status, status), answer
    assert message in answer["error"]
    assert web.broker.published == 0 and not web.broker.queues[b"q"].ready


def test_deep_nesting_is_a_400_not_a_500(make_web):
    web = make_web(max_body=1_000_000)
    web.broker.declare_queue(b"q")
    for path in ("/api/queues/q/messages/batch", "/api/queues/q/messages"):
        status, answer = web.request("POST", path, data=b"[" * 200_000,
                                     headers={"Content-Type": "application/json"})
        assert status == 400 and "not valid JSON" in answer["error"]


def test_the_queue_must_exist_and_an_event_may_route_nowhere(web):
    status, answer = web.request("POST", "/api/queues/nope/messages/batch", json=[{"body": "x"}])
    assert (status, answer["error"]) == (404, "no queue 'nope'")
    status, answer = web.request("POST", "/api/events/nobody/batch", json=[{"body": "x"}])
    assert (status, answer["queues"], answer["count"]) == (201, 0, 1)
    assert (web.broker.published, web.broker.unroutable) == (1, 1)


def test_a_full_reject_publish_queue_says_what_went_in(web):
    web.broker.declare_queue(b"q", QueueOptions(max_length=3, overflow="reject-publish"))
    web.broker.publish_to_queue(b"q", b"old", b"x")
    batch = [{"body": f"m{n}"} for n in range(4)]
    status, answer = web.request("POST", "/api/queues/q/messages/batch", json=batch)
    assert status == 507
    assert "messages 0 to 1 were published, message 2 and the rest were not" in answer["error"]
    assert [m.body for m in web.broker.queues[b"q"].ready] == [b"x", b"m0", b"m1"]
    status, answer = web.request("POST", "/api/queues/q/messages/batch", json=batch)
    assert status == 507 and "no message was published" in answer["error"]


def test_the_memory_alarm_refuses_a_batch_with_retry_after(web):
    web.broker.declare_queue(b"q")
    web.broker.flow.active = True
    pending = web.start("POST", "/api/queues/q/messages/batch", json=[{"body": "x"}])
    web.stub.flush()
    response = web.result(pending)
    assert response.code == 503 and response.headers.getRawHeaders("retry-after") == ["1"]
    assert web.broker.published == 0


def test_a_durable_batch_waits_once_for_the_store_and_answers_after_it(make_web):
    web, store = web_on_slow_store(make_web, max_body=1_000_000)
    waits = []
    real_durable = web.broker.durable
    web.broker.durable = lambda: waits.append(1) or real_durable()
    batch = [{"body": f"m{n}"} for n in range(1000)]
    pending = web.start("POST", "/api/queues/q/messages/batch?durable=true", json=batch)
    web.clock.advance(0)
    assert not web.answered(pending)
    assert waits == [1] and len(store.pending) == 1  # one wait, one commit for 1000
    store.pending.pop().callback(None)
    status, answer = web.finish(pending)
    assert (status, answer["durable"], answer["count"]) == (201, True, 1000)
    # "durable": true on one message is the same; a failed commit is a 503
    batch[7]["durable"] = True
    web.broker.reconfigure(b"q", replace=[b"e"])
    pending = web.start("POST", "/api/events/e/batch", json=batch)
    web.clock.advance(0)
    store.pending.pop().errback(OSError("disk full"))
    status, error = web.finish(pending)
    assert status == 503 and "the messages may not be durable: disk full" in error["error"]


def test_concurrent_single_durable_publishes_share_one_commit(make_web):
    """The store's group commit batches what requests of one turn published."""
    web, store = web_on_slow_store(make_web)
    pending = [web.start("POST", "/api/queues/q/messages", json={"body": f"m{n}", "durable": True})
               for n in range(50)]
    web.stub.flush()
    web.clock.advance(0)
    assert len(store.pending) == 1 and not any(web.answered(d) for d in pending)
    store.pending.pop().callback(None)
    assert [web.finish(d)[1]["durable"] for d in pending] == [True] * 50
    assert web.broker.writer.batches == 2  # the queue's declaration, then all 50


def test_batch_ack_is_one_broker_run_with_an_answer_per_id(web):
    web.broker.declare_queue(b"q")
    web.request("POST", "/api/queues/q/messages/batch",
                json=[{"body": "x", "id": f"m{n}"} for n in range(5)])
    d = web.client.consume("q", consumer="w", max=10)
    web.turn()
    assert len(web.result(d)["messages"]) == 5
    runs = []
    real = web.broker.ack_run
    web.broker.ack_run = lambda consumer, ids: runs.append(list(ids)) or real(consumer, ids)
    status, answer = web.request("POST", "/api/queues/q/ack", json={
        "consumer": "w", "ids": ["m0", "nope", "m2", "m0", "m4"]})
    assert status == 200
    assert answer == {"consumer": "w", "settled": ["m0", "m2", "m4"], "unknown": ["nope", "m0"]}
    assert runs == [[b"m0", b"m2", b"m4"]]
    queue = web.broker.queues[b"q"]
    assert (queue.acked, queue.in_flight()) == (3, 2)
    status, answer = web.request("POST", "/api/queues/q/reject", json={
        "consumer": "w", "ids": ["m1", "m1", "m3"]})
    assert answer == {"consumer": "w", "settled": ["m1", "m3"], "unknown": ["m1"]}
    assert [m.id for m in queue.ready] == [b"m1", b"m3"]


def test_ack_lists_are_bounded_and_a_bad_id_is_named(web):
    web.api.max_batch = 3
    web.broker.declare_queue(b"q")
    web.result(web.client.consume("q", consumer="w"))
    status, answer = web.request("POST", "/api/queues/q/ack",
                                 json={"consumer": "w", "ids": ["a", "b", "c", "d"]})
    assert status == 413 and "item 3 is the first one too many" in answer["error"]
    status, answer = web.request("POST", "/api/queues/q/ack",
                                 json={"consumer": "w", "ids": ["a", "", "c"]})
    assert status == 400 and "item 1 is ''" in answer["error"]
    status, answer = web.request("POST", "/api/queues/q/reject",
                                 json={"consumer": "w", "ids": ["a", "b\nc"]})
    assert status == 400 and "item 1 of 'ids' contains the control character" in answer["error"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["body", "body_base64", "id", "headers", "ttl", "durable", "x"]),
        inner, max_size=4),
    max_leaves=12,
)
ENTRIES = st.fixed_dictionaries({"body": st.text(max_size=8)}, optional={
    "id": st.text("ab\x00é", min_size=1, max_size=9), "ttl": st.integers(0, 3) | st.floats(),
    "headers": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3),
    "durable": st.booleans()})  # mostly valid: every field's edge, sometimes over it
BATCH_BYTES = st.one_of(
    st.binary(max_size=200),
    st.lists(ENTRIES, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.lists(ENTRIES, max_size=4).map(lambda v: b"\n".join(json.dumps(x).encode() for x in v)),
    st.lists(JSON_VALUES, max_size=5).map(lambda v: json.dumps(v).encode()),
    st.lists(JSON_VALUES, max_size=5).map(
        lambda v: b"\n".join(json.dumps(x).encode() for x in v)),
    st.lists(st.binary(max_size=30) | JSON_VALUES.map(lambda x: json.dumps(x).encode()),
             max_size=6).map(b"\n".join),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=BATCH_BYTES, ndjson=st.booleans())
def test_any_bytes_parse_as_a_batch_or_are_a_400_or_413(data, ndjson):
    try:
        batch = parse(data, ndjson, 3, Limits(max_id=8, max_headers=2))
    except APIError as e:
        assert e.status in (400, 413), e.message
        assert e.message
        return
    assert len(batch.ids) <= 3
    assert [i.decode() for _, _, entries in batch.runs for i, _ in entries] == batch.ids
    for headers, ttl, entries in batch.runs:
        assert all(isinstance(i, bytes) and isinstance(b, bytes) for i, b in entries)
        assert headers is None or all(isinstance(v, str) for v in headers.values())
        assert ttl is None or ttl > 0


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=BATCH_BYTES, kind=st.sampled_from(["application/json", "application/x-ndjson"]))
def test_any_batch_body_gets_a_201_400_or_413_from_the_resource(data, kind):
    web = Web()
    web.api.max_batch = 3
    web.broker.declare_queue(b"q")
    status, answer = web.request("POST", "/api/queues/q/messages/batch", data=data,
                                 headers={"Content-Type": kind})
    assert status in (201, 400, 413), answer
    published = len(web.broker.queues[b"q"].ready)
    assert published == (answer["count"] if status == 201 else 0)
