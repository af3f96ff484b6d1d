"""mqserver.client.HTTPClient against the real resources, in memory (StubTreq)."""

from __future__ import annotations

import pytest

from mqserver.client import APIError, HTTPClient, body_of


def test_queue_management_round_trip(web):
    client = web.client
    created = web.result(client.create_queue("a/b c", dead_letter="dead", max_length=5,
                                         default_ttl=9, bindings=["x.*"]))
    assert created["name"] == "a/b c" and created["options"]["max_length"] == 5
    assert b"a/b c" in web.broker.queues
    assert web.result(client.bind("a/b c", "y"))["bindings"] == ["x.*", "y"]
    assert web.result(client.unbind("a/b c", "x.*"))["bindings"] == ["y"]
    changed = web.result(client.change_bindings("a/b c", add=["p.1", "p.2"], remove=["y"]))
    assert changed["bindings"] == ["p.1", "p.2"]
    changed = web.result(client.change_bindings("a/b c", remove_masks=["p.*"], replace=["p.1", "z"]))
    assert changed["bindings"] == ["z"]
    assert web.result(client.bindings("a/b c"))["bindings"] == ["z"]
    assert [q["name"] for q in web.result(client.queues(prefix="a/"))["queues"]] == ["a/b c"]
    assert web.result(client.queue("a/b c"))["bindings"] == ["z"]
    assert web.result(client.purge("a/b c")) == {"queue": "a/b c", "purged": 0}
    assert web.result(client.delete_queue("a/b c")) == {"deleted": "a/b c"}


def test_publish_peek_consume_ack(web):
    client = web.client
    web.result(client.create_queue("q", bindings=["e"]))
    sent = web.result(client.publish("q", b"\x00bin", message_id="m1", headers={"h": "1"}, ttl=60))
    assert sent == {"id": "m1", "queue": "q", "seq": 1, "durable": False}
    assert web.result(client.publish_event("e", "text", durable=True))["queues"] == 1
    peeked = web.result(client.peek("q", limit=1))["messages"]
    assert [body_of(m) for m in peeked] == [b"\x00bin"] and peeked[0]["headers"] == {"h": "1"}
    d = client.consume("q", consumer="w", max=10)
    web.turn()
    batch = web.result(d)
    assert [body_of(m) for m in batch["messages"]] == [b"\x00bin", b"text"]
    ids = [m["id"] for m in batch["messages"]]
    assert web.result(client.reject("q", "w", ids[1:]))["settled"] == ids[1:]
    assert web.result(client.ack("q", "w", ids[:1]))["settled"] == ids[:1]
    consumers = web.result(client.consumers(queue="q"))["consumers"]
    assert [(c["id"], c["unacked"], c["acked"]) for c in consumers] == [("w", 0, 1)]
    [connection] = web.result(client.connections(protocol="http"))["connections"]
    assert web.result(client.close_connection(connection["id"], reason="done"))["protocol"] == "http"


def test_status_calls(web):
    client = web.client
    assert web.result(client.health())["status"] == "ok"
    assert web.result(client.stats())["queues"] == 0
    assert "mqserver_published_total 0.0" in web.result(client.metrics())


def test_errors_raise_api_error_with_the_server_message(web):
    with pytest.raises(APIError) as caught:
        web.result(web.client.queue("missing"))
    assert (caught.value.status, caught.value.message) == (404, "no queue 'missing'")
    reader = HTTPClient("http://mq.test/", http=web.stub)
    with pytest.raises(APIError, match="HTTP 401"):
        web.result(reader.create_queue("q"))


def test_publish_many_sends_batches_and_answers_every_id_in_order(web):
    client = web.client
    web.result(client.create_queue("q", bindings=["e"]))
    messages = [b"\x00bin", "text", {"body": "own", "id": "m3", "headers": {"h": "own"}}]
    sent = web.result(client.publish_many("q", messages, headers={"h": "all"}, ttl=60,
                                          batch_size=2))
    assert sent["count"] == 3 and sent["ids"][2] == "m3" and sent["queue"] == "q"
    ready = list(web.broker.queues[b"q"].ready)
    assert [m.id.decode() for m in ready] == sent["ids"]
    assert [m.body for m in ready] == [b"\x00bin", b"text", b"own"]
    assert [m.headers for m in ready] == [{"h": "all"}, {"h": "all"}, {"h": "own"}]
    assert {m.expires_at for m in ready} == {60.0}
    routed = web.result(client.publish_event_many("e", ["a", "b"], durable=True))
    assert (routed["count"], routed["queues"], routed["durable"]) == (2, 1, False)
    assert web.result(client.publish_many("q", []))["ids"] == []
    d = client.consume("q", consumer="w", max=10)
    web.turn()
    ids = [m["id"] for m in web.result(d)["messages"]]
    assert web.result(client.ack("q", "w", [*ids, "gone"])) == {
        "consumer": "w", "settled": ids, "unknown": ["gone"]}


def test_publish_many_raises_the_refusal_of_a_bad_batch(web):
    web.result(web.client.create_queue("q"))
    with pytest.raises(APIError) as caught:
        web.result(web.client.publish_many("q", ["ok", {"body": "x", "ttl": -1}]))
    assert caught.value.status == 400 and "message 1" in caught.value.message
    assert not web.broker.queues[b"q"].ready
