"""The HTTP API against the real server: twistd subprocess, mqserver.client.HTTPClient (treq).

Raw-socket MQKS and PHPMQ clients in the same tests show that a message
published over HTTP reaches every protocol, and back.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient as TreqClient
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool

from mqserver.client import APIError, HTTPClient, body_of
from mqserver.protocols.phpmq import codec as phpmq

LISTEN = "tcp:0:interface=127.0.0.1"
TOKEN = "integration-token"


@pytest.fixture
def server(start_server, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return start_server(
        f"--protocol=mqks:{LISTEN}", f"--protocol=phpmq:{LISTEN}", f"--http={LISTEN}",
        f"--http-token-file={token}", "--http-max-body=100000", "--storage=memory",
    )


@pytest.fixture
def http() -> Iterator[TreqClient]:
    """A treq client with its own non-persistent pool: nothing lingers between tests."""
    yield TreqClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


@pytest.fixture
def client(server, http) -> HTTPClient:
    return HTTPClient(f"http://127.0.0.1:{server.ports['http']}", token=TOKEN, http=http)


class PHPMQClient:
    """Just enough PHPMQ over a blocking socket: send frames, read dispatches."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = phpmq.FrameDecoder()

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def read(self, timeout: float = 10.0) -> phpmq.Frame:
        deadline = time.monotonic() + timeout
        while (frame := self.decoder.next_frame()) is None:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.decoder.feed(chunk)
        return frame


@pytest_twisted.inlineCallbacks
def test_queue_management_publish_peek_consume_ack(server, client):
    created = yield client.create_queue("jobs", dead_letter="jobs.dead", max_length=100,
                                        default_ttl=3600, bindings=["job.*"])
    assert created["options"]["dead_letter"] == "jobs.dead"
    sent = yield client.publish("jobs", b"\x00binary", headers={"kind": "resize"}, durable=True)
    assert sent["queue"] == "jobs"
    routed = yield client.publish_event("job.created", "text body")
    assert routed["queues"] == 1
    peeked = yield client.peek("jobs")
    assert [body_of(m) for m in peeked["messages"]] == [b"\x00binary", b"text body"]
    batch = yield client.consume("jobs", consumer="worker", max=10, timeout=5)
    assert [m["body"] for m in batch["messages"]] == ["\x00binary", "text body"]
    assert batch["messages"][0]["headers"] == {"kind": "resize"}
    acked = yield client.ack("jobs", "worker", [m["id"] for m in batch["messages"]])
    assert len(acked["settled"]) == 2
    waiting = client.consume("jobs", consumer="worker", timeout=10)  # a real long poll
    yield client.publish("jobs", "late")
    later = yield waiting
    assert [m["body"] for m in later["messages"]] == ["late"]
    detail = yield client.queue("jobs")
    assert (detail["depth"], detail["in_flight"], detail["counters"]["acked"]) == (0, 1, 2)
    assert detail["bindings"] == ["job.*"]
    yield client.publish("jobs", "to purge")
    metrics = yield client.metrics()
    assert 'mqserver_connections{protocol="http"} 1.0' in metrics
    assert 'mqserver_queue_depth{queue="jobs"} 1.0' in metrics
    assert "mqserver_published_total 4.0" in metrics
    assert (yield client.purge("jobs"))["purged"] == 1
    assert (yield client.delete_queue("jobs")) == {"deleted": "jobs"}
    health = yield client.health()
    assert health["status"] == "ok" and health["storage"]["backend"] == "memory"
    assert (yield client.stats())["connections"] == {}  # the consumer ended with its queue


@pytest_twisted.inlineCallbacks
def test_errors_over_the_wire(server, client, http):
    base = f"http://127.0.0.1:{server.ports['http']}"
    reader = HTTPClient(base, http=http)
    with pytest.raises(APIError) as caught:
        yield reader.create_queue("q")
    assert caught.value.status == 401
    with pytest.raises(APIError) as caught:
        yield client.queue("missing")
    assert caught.value.status == 404
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    response = yield http.post(base + "/api/events/e", data=b"{bad json", headers=auth)
    assert response.code == 400
    assert "not valid JSON" in (yield treq.json_content(response))["error"]
    big = json.dumps({"body": "x" * 200_000}).encode()
    response = yield http.post(base + "/api/events/e", data=big, headers=auth)
    assert response.code == 413
    assert (yield treq.json_content(response))["status"] == 413
    spec = yield client.request("GET", "/openapi.json")
    assert "/api/queues/{queue}/consume" in spec["paths"]
    page = yield client.request("GET", "/")
    assert "mqserver dashboard" in page


@pytest_twisted.inlineCallbacks
def test_cross_protocol_publish_over_http_consume_with_mqks_and_phpmq(server, client,
                                                                      line_client):
    mqks = line_client(server.ports["mqks"])
    mqks.send("c1 consume --confirm from-http ev.created --manual-ack")
    assert mqks.read(1) == [b"c1 ok "]
    php = PHPMQClient(server.ports["phpmq"])
    yield client.create_queue("php-jobs")
    php.send(phpmq.consume(b"php-jobs", 5))

    routed = yield client.publish_event("ev.created", "to mqks", message_id="h1")
    assert routed["queues"] == 1
    assert mqks.read(1) == [b"c1 ok h1 event=ev.created to mqks"]
    yield client.publish("php-jobs", b"to phpmq")
    frame = php.read()
    assert frame.packages[phpmq.CONTENT] == b"to phpmq"

    # and back: MQKS publishes, an HTTP consumer takes it
    yield client.create_queue("to-http", bindings=["ev.back"])
    mqks.send("m2 publish --confirm ev.back from mqks")
    assert mqks.read(1) == [b"m2 ok "]
    batch = yield client.consume("to-http", consumer="h", timeout=5)
    assert [m["body"] for m in batch["messages"]] == ["from mqks"]

    listing = yield client.connections()
    protocols = sorted(c["protocol"] for c in listing["connections"])
    assert protocols == ["http", "mqks", "phpmq"]
    [mqks_connection] = [c for c in listing["connections"] if c["protocol"] == "mqks"]
    assert mqks_connection["unacked"] == 1
    closed = yield client.close_connection(mqks_connection["id"], reason="test")
    assert closed["protocol"] == "mqks"
    assert mqks.closed()
    detail = yield client.queue("from-http")
    assert (detail["depth"], detail["in_flight"]) == (1, 0)  # the unacked one came back
