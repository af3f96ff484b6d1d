"""eMQP and the HTTP API on one server: publish over HTTP, a stock pyzmq worker consumes."""

from __future__ import annotations

import pytest_twisted
from treq.client import HTTPClient as TreqClient
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool

from mqserver.client import HTTPClient

TOKEN = "emqp-http-token"


@pytest_twisted.inlineCallbacks
def test_publish_over_http_an_emqp_worker_consumes(start_emqp, dealers, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    server = start_emqp("--storage=memory", "--http=tcp:0:interface=127.0.0.1",
                        f"--http-token-file={token}")
    http = TreqClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))
    client = HTTPClient(f"http://127.0.0.1:{server.ports['http']}", token=TOKEN, http=http)
    worker = dealers(server.ports["emqp-backend"], b"http-worker")
    worker.inform(b'[[10, "jobs"]]')
    yield client.create_queue("jobs")
    sent = yield client.publish("jobs", b"from http", message_id="h-1")
    assert sent["queue"] == "jobs"
    worker.send(b"READY")
    request = worker.recv()
    assert request[2:] == [b"REQUEST", b"h-1", b"jobs", b"", b"from http"]
    consumers = yield client.consumers(queue="jobs")
    # no guarantee or reply asked for: eMQP settles it as it hands it over
    assert [(c["protocol"], c["delivered"], c["unacked"]) for c in consumers["consumers"]] == [
        ("emqp", 1, 0)]
    queue = yield client.queue("jobs")
    assert (queue["depth"], queue["counters"]["delivered"]) == (0, 1)
