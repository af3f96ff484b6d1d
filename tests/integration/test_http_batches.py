"""Batch publishing and batch acks against the real server (twistd, SQLite), with treq.

A durable batch of 1000 is answered once SQLite has all of it: the server is
killed with SIGKILL the moment the answer comes, and what restarts must hold
every message, in order.  Acks of a whole delivery batch go in one request,
and acked messages stay gone after a second kill.  Durable single publishes
that arrive together share the store's commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient as TreqClient
from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from twisted.web.client import Agent, HTTPConnectionPool

from mqserver.client import APIError, HTTPClient, body_of

LISTEN = "tcp:0:interface=127.0.0.1"
TOKEN = "batch-token"
# one protocol, on a free port: without --protocol every protocol takes its
# default port, and eMQP's (47290-47293) lie in the kernel's ephemeral range,
# where another socket of the suite may hold one
PROTOCOL = "--protocol=mqks:tcp:0:interface=127.0.0.1"


@pytest.fixture
def http() -> Iterator[TreqClient]:
    yield TreqClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


@pytest_twisted.inlineCallbacks
def test_a_durable_batch_of_1000_survives_kill_9_and_acked_ones_stay_gone(
        start_server, tmp_path, http):
    args = (f"--http={LISTEN}", f"--http-token={TOKEN}", PROTOCOL, "--storage=sqlite",
            f"--data-dir={tmp_path / 'data'}")
    server = start_server(*args)
    client = HTTPClient(f"http://127.0.0.1:{server.ports['http']}", token=TOKEN, http=http)
    yield client.create_queue("jobs", bindings=["job.created"])
    bodies = [b"job %d \x00" % n for n in range(1000)]
    sent = yield client.publish_many("jobs", bodies, headers={"kind": "resize"}, durable=True)
    server.process.kill()  # answered: SQLite has all 1000
    server.process.wait()
    assert (sent["count"], sent["durable"], len(set(sent["ids"]))) == (1000, True, 1000)

    server = start_server(*args)
    client = HTTPClient(f"http://127.0.0.1:{server.ports['http']}", token=TOKEN, http=http)
    peeked = yield client.peek("jobs", limit=1000)
    assert peeked["depth"] == 1000
    assert [m["id"] for m in peeked["messages"]] == sent["ids"]
    assert [body_of(m) for m in peeked["messages"]] == bodies
    assert {m["headers"]["kind"] for m in peeked["messages"]} == {"resize"}

    batch = yield client.consume("jobs", consumer="worker", max=1000, timeout=5)
    ids = [m["id"] for m in batch["messages"]]
    assert ids == sent["ids"]
    acked = yield client.ack("jobs", "worker", [*ids[:600], "never-sent"])
    assert (len(acked["settled"]), acked["unknown"]) == (600, ["never-sent"])
    # an event batch as NDJSON, durable through the query, lands behind them
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    base = f"http://127.0.0.1:{server.ports['http']}"
    ndjson = b"\n".join(json.dumps({"body": f"ev {n}", "id": f"e{n}"}).encode()
                        for n in range(10))
    response = yield http.post(base + "/api/events/job.created/batch?durable=true",
                               data=ndjson, headers=auth)
    answer = yield treq.json_content(response)
    assert (response.code, answer["queues"], answer["durable"]) == (201, 1, True)
    assert answer["ids"] == [f"e{n}" for n in range(10)]
    server.process.kill()
    server.process.wait()

    server = start_server(*args)
    client = HTTPClient(f"http://127.0.0.1:{server.ports['http']}", token=TOKEN, http=http)
    left = yield client.peek("jobs", limit=1000)
    # the acks' removal is not awaited by its answer, but the NDJSON batch's
    # durable answer came after it: the store applies in order
    assert [m["id"] for m in left["messages"]] == [*ids[600:], *answer["ids"]]


@pytest_twisted.inlineCallbacks
def test_batch_errors_over_the_wire(start_server, http):
    server = start_server(f"--http={LISTEN}", f"--http-token={TOKEN}", PROTOCOL, "--storage=memory",
                          "--http-max-batch=100", "--http-max-body=20000")
    base = f"http://127.0.0.1:{server.ports['http']}"
    client = HTTPClient(base, token=TOKEN, http=http)
    yield client.create_queue("q")
    with pytest.raises(APIError) as caught:
        yield client.publish_many("q", [*["ok"] * 5, {"body": "bad", "ttl": "soon"}])
    assert caught.value.status == 400
    assert caught.value.message == "message 5: 'ttl' must be a number"
    with pytest.raises(APIError) as caught:
        yield client.publish_many("q", ["x"] * 101, batch_size=101)
    assert caught.value.status == 413 and "message 100 is the first one too many" in \
        caught.value.message
    with pytest.raises(APIError) as caught:
        yield client.publish_many("q", ["x" * 1000] * 30)
    assert caught.value.status == 413 and "larger than 20000 bytes" in caught.value.message
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    response = yield http.post(base + "/api/queues/q/messages/batch",
                               data=b'{"body": "a"}\n\xff\xfe\n', headers=auth)
    assert response.code == 400
    assert "message 1 (line 2) is not valid JSON" in (yield treq.json_content(response))["error"]
    assert (yield client.queue("q"))["depth"] == 0
    sent = yield client.publish_many("q", ["x"] * 250, batch_size=100)  # three requests
    assert sent["count"] == 250 and (yield client.queue("q"))["depth"] == 250
    assert "Traceback" not in server.text()


@pytest_twisted.inlineCallbacks
def test_concurrent_durable_single_publishes_share_commits(start_server, tmp_path):
    """200 at once over 50 connections: a handful of commits (3 to 10 seen), not 200."""
    server = start_server(f"--http={LISTEN}", f"--http-token={TOKEN}", PROTOCOL, "--storage=sqlite",
                          f"--data-dir={tmp_path / 'data'}")
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 50
    client = HTTPClient(f"http://127.0.0.1:{server.ports['http']}", token=TOKEN,
                        http=TreqClient(Agent(reactor, pool=pool)))
    try:
        yield client.create_queue("q")
        before = (yield client.health())["storage"]["batches"]
        answers = yield gatherResults([client.publish("q", f"m{n}", durable=True)
                                       for n in range(200)])
        commits = (yield client.health())["storage"]["batches"] - before
        assert (yield client.queue("q"))["depth"] == 200
    finally:
        yield pool.closeCachedConnections()
    assert all(a["durable"] for a in answers)
    assert 1 <= commits < 100, commits
