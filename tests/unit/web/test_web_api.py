"""The HTTP API's resources, in memory: queues, bindings, messages, errors, auth."""

from __future__ import annotations

import base64

import pytest
from twisted.internet.testing import StringTransport

from mqserver.model import QueueOptions
from mqserver.web.app import all_routes
from mqserver.web.openapi import spec


def test_create_queue_with_options_then_change_them(web):
    status, view = web.request("PUT", "/api/queues/jobs", json={
        "dead_letter": "jobs.dead", "max_length": 2, "default_ttl": 60, "bindings": ["a", "b.*"],
    })
    assert status == 201
    assert view["options"] == {"dead_letter": "jobs.dead", "max_length": 2, "default_ttl": 60.0,
                               "delete_when_unused": None, "overflow": None}
    assert view["bindings"] == ["a", "b.*"]
    assert web.broker.queues[b"jobs"].options == QueueOptions(
        dead_letter=b"jobs.dead", max_length=2, default_ttl=60.0)
    status, view = web.request("PUT", "/api/queues/jobs", json={"max_length": None})
    assert status == 200
    assert view["options"]["max_length"] is None and view["options"]["dead_letter"] == "jobs.dead"
    status, view = web.request("PUT", "/api/queues/jobs", json={"bindings": []})
    assert view["bindings"] == []


def test_queue_list_detail_rates_and_oldest_age(web):
    web.request("PUT", "/api/queues/q")  # its answer's view is the rates' baseline
    web.broker.publish_to_queue(b"q", b"m0", b"x")
    web.clock.advance(2)
    for n in range(10):
        web.broker.publish_to_queue(b"q", b"m%d" % n, b"x")
    status, body = web.request("GET", "/api/queues")
    assert status == 200 and body["total"] == 1
    [queue] = body["queues"]
    assert (queue["name"], queue["depth"], queue["in_flight"], queue["consumers"]) == ("q", 11, 0, 0)
    assert queue["rates"] == {"publish": 5.5, "deliver": 0.0, "ack": 0.0}
    assert queue["oldest_message_age"] == 2.0
    assert queue["counters"]["enqueued"] == 11
    status, detail = web.request("GET", "/api/queues/q")
    assert status == 200 and detail["bindings"] == [] and detail["consumer_list"] == []
    assert web.request("GET", "/api/queues?prefix=x")[1] == {"queues": [], "total": 0}


def test_purge_and_delete(web):
    web.request("PUT", "/api/queues/q", json={"bindings": ["e"]})
    web.broker.publish_event(b"e", b"m", b"x")
    assert web.request("POST", "/api/queues/q/purge") == (200, {"queue": "q", "purged": 1})
    assert web.request("DELETE", "/api/queues/q") == (200, {"deleted": "q"})
    assert b"q" not in web.broker.queues
    status, error = web.request("DELETE", "/api/queues/q")
    assert (status, error) == (404, {"error": "no queue 'q'", "status": 404})


def test_bindings_add_remove_and_masks(web):
    web.request("PUT", "/api/queues/q")
    status, body = web.request("POST", "/api/queues/q/bindings",
                               json={"add": ["user.1.created", "user.2.created", "plain", "x.*"]})
    assert status == 200 and body["changed"] is True
    status, body = web.request("POST", "/api/queues/q/bindings",
                               json={"remove_masks": ["user.*.created"]})
    assert body["bindings"] == ["plain", "x.*"]
    assert web.broker.publish_event(b"x.anything", b"m", b"d") == 1
    assert web.request("PUT", "/api/queues/q/bindings/new%20one")[0] == 201
    assert web.request("PUT", "/api/queues/q/bindings/new%20one")[0] == 200
    status, body = web.request("DELETE", "/api/queues/q/bindings/plain")
    assert body == {"queue": "q", "bindings": ["new one", "x.*"], "changed": True}
    assert web.request("DELETE", "/api/queues/q/bindings/plain")[0] == 404
    assert web.request("GET", "/api/queues/q/bindings")[1]["bindings"] == ["new one", "x.*"]
    status, body = web.request("POST", "/api/queues/q/bindings", json={"replace": ["only"]})
    assert body["bindings"] == ["only"]


def test_publish_text_base64_raw_and_event(web):
    web.request("PUT", "/api/queues/q", json={"bindings": ["e"]})
    status, body = web.request("POST", "/api/queues/q/messages", json={
        "body": "héllo", "id": "m1", "headers": {"k": "v"}, "ttl": 5})
    assert (status, body) == (201, {"id": "m1", "queue": "q", "seq": 1, "durable": False})
    web.request("POST", "/api/queues/q/messages",
                json={"body_base64": base64.b64encode(b"\xff\x00").decode()})
    web.request("POST", "/api/queues/q/messages?ttl=0&id=raw", data=b"raw bytes",
                headers={"Content-Type": "application/octet-stream"})
    status, body = web.request("POST", "/api/events/e", json={"body": "ev"})
    assert status == 201 and body["queues"] == 1 and body["event"] == "e"
    assert web.request("POST", "/api/events/nobody", json={"body": "ev"})[1]["queues"] == 0
    ready = list(web.broker.queues[b"q"].ready)
    assert [m.body for m in ready] == ["héllo".encode(), b"\xff\x00", b"raw bytes", b"ev"]
    assert (ready[0].headers, ready[0].expires_at, ready[0].source) == ({"k": "v"}, 5.0, "http")
    assert ready[2].id == b"raw" and ready[3].event == b"e"


def test_peek_does_not_consume(web):
    web.request("PUT", "/api/queues/q")
    for n in range(3):
        web.broker.publish_to_queue(b"q", b"m%d" % n, b"body %d" % n)
    web.broker.publish_to_queue(b"q", b"bin", b"\xff")
    status, body = web.request("GET", "/api/queues/q/messages?limit=2")
    assert status == 200 and body["depth"] == 4
    assert [m["body"] for m in body["messages"]] == ["body 0", "body 1"]
    messages = web.request("GET", "/api/queues/q/messages?limit=10")[1]["messages"]
    assert messages[3]["body"] is None and messages[3]["body_base64"] == "/w=="
    assert len(web.broker.queues[b"q"].ready) == 4


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "message"), [
    ("GET", "/api/queues/nope", {}, 404, "no queue 'nope'"),
    ("POST", "/api/queues/nope/messages", {"json": {"body": "x"}}, 404, "no queue 'nope'"),
    ("GET", "/api/nothing", {}, 404, "no such endpoint: GET /api/nothing"),
    ("PATCH", "/api/queues/q", {}, 405, "PATCH is not allowed here; allowed: DELETE, GET, PUT"),
    ("POST", "/api/queues/q/messages", {"data": b"{nope", "headers": {
        "Content-Type": "application/json"}}, 400, "request body is not valid JSON"),
    ("POST", "/api/queues/q/messages", {"json": [1]}, 400, "must be a JSON object"),
    ("POST", "/api/queues/q/messages", {"json": {}}, 400, "give exactly one of"),
    ("POST", "/api/queues/q/messages", {"json": {"body_base64": "!!"}}, 400, "not valid base64"),
    ("POST", "/api/queues/q/messages", {"json": {"body": "x", "ttl": "soon"}}, 400,
     "'ttl' must be a number"),
    ("POST", "/api/queues/q/messages", {"json": {"body": "x", "ttl": True}}, 400,
     "'ttl' must be a number"),
    ("POST", "/api/queues/q/messages", {"json": {"body": "x", "headers": {"a": 1}}}, 400,
     "'headers' must be an object of string values"),
    ("POST", "/api/queues/q/messages", {"json": {"body": "\ud800"}}, 400, "not encodable"),
    ("POST", "/api/queues/q/messages", {"json": {"body": "x", "headers": {"k": "\udc80"}}},
     400, "'headers': 'k' is not encodable as UTF-8"),
    ("POST", "/api/queues/q/messages", {"json": {"body": "x" * 2000}}, 413,
     "request body is larger than 1000 bytes"),
    ("PUT", "/api/queues/q", {"json": {"max_length": 0}}, 400, "'max_length' must be at least 1"),
    ("GET", "/api/queues/q/messages?limit=0", {}, 400, "'limit' must be at least 1"),
    ("GET", "/api/connections/abc", {}, 400, "'id' must be a number"),
    ("DELETE", "/api/connections/99", {}, 404, "no connection 99"),
    ("POST", "/api/queues/q/ack", {"json": {"ids": ["a"]}}, 400, "'consumer' is required"),
    ("POST", "/api/queues/q/ack", {"json": {"consumer": "c", "ids": "a"}}, 400,
     "'ids' must be a list of non-empty strings"),
])
def test_errors_are_json_with_the_right_status(web, method, path, kwargs, status, message):
    web.broker.declare_queue(b"q")
    got, body = web.request(method, path, **kwargs)
    assert got == status
    assert body["status"] == status and message in body["error"]


def test_oversized_bodies_are_dropped_as_they_arrive(web):
    """The real site's request factory: a body over the limit is never kept in memory."""
    made = []
    factory = web.site.requestFactory
    web.site.requestFactory = lambda *args: made.append(factory(*args)) or made[-1]
    channel = web.site.buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    body = b'{"body": "' + b"x" * 5000 + b'"}'
    channel.dataReceived(
        b"POST /api/events/e HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    [request] = made
    assert request.body_too_large
    channel.dataReceived(body[:4000])
    assert request.content.tell() == 0  # counted, not kept
    channel.dataReceived(body[4000:])
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    assert web.broker.published == 0
    channel.connectionLost(None)


def test_openapi_documents_every_route(web):
    status, document = web.request("GET", "/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.")
    routes = all_routes()
    assert document == spec(routes)
    for route in routes:
        operation = document["paths"][route.path][route.method.lower()]
        assert operation["summary"] == route.summary
        # who may call it is tested route by route in test_web_access.py
        assert ("401" in operation["responses"]) == (operation["security"] != [])
    assert len({(r.method, r.path) for r in routes}) == len(routes)


def test_dashboard_and_its_static_files(web):
    status, page = web.request("GET", "/")
    assert status == 200 and b"static/dashboard.js" in page
    status, script = web.request("GET", "/static/dashboard.js")
    assert status == 200 and b"api/queues" in script
    assert web.request("GET", "/static/dashboard.css")[0] == 200
    assert web.request("GET", "/static/..%2Fapp.py")[0] == 404
