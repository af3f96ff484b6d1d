"""Replaying a dead-letter queue over HTTP against the real server, then kill -9.

Messages are dead-lettered the way they are in production (rejected by a
consumer past their ``x-max-retries``), moved back with ``HTTPClient.move``,
and the server is killed the moment the move is answered: what restarts
must hold the move.  The same server checks who may read what with the
token, the read token and no token, and what its ``--metrics`` listener serves.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_twisted
from treq.client import HTTPClient as TreqClient
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool

from mqserver.client import APIError, HTTPClient

LISTEN = "tcp:0:interface=127.0.0.1"
TOKEN = "move-token"
READ_TOKEN = "move-read-token"
STORES = {"sqlite": ("--storage=sqlite",), "log": ("--storage=log", "--fsync=always")}


@pytest.fixture
def http() -> Iterator[TreqClient]:
    yield TreqClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


@pytest.mark.parametrize("storage", sorted(STORES))
@pytest_twisted.inlineCallbacks
def test_a_replayed_dead_letter_queue_survives_kill_9(start_server, tmp_path, http, storage):
    args = (f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}", f"--http-token={TOKEN}",
            f"--http-read-token={READ_TOKEN}", f"--data-dir={tmp_path / 'data'}",
            f"--metrics={LISTEN}",
            *STORES[storage])
    server = start_server(*args)
    base = f"http://127.0.0.1:{server.ports['http']}"
    admin = HTTPClient(base, token=TOKEN, http=http)
    yield admin.create_queue("jobs.dead")
    yield admin.create_queue("jobs", dead_letter="jobs.dead")
    for i in range(50):
        yield admin.publish("jobs", f"job {i}", message_id=f"m{i}",
                            headers={"x-max-retries": "0", "kind": "resize"})
    batch = yield admin.consume("jobs", consumer="worker", max=50, timeout=5)
    assert len(batch["messages"]) == 50
    yield admin.reject("jobs", "worker", [m["id"] for m in batch["messages"]])
    dead = yield admin.peek("jobs.dead", limit=1)
    assert dead["depth"] == 50
    assert dead["messages"][0]["headers"]["x-dead-letter-queue"] == "jobs"

    moved = yield admin.move("jobs.dead", "jobs", limit=20)
    server.process.kill()  # the answer came: the move must be on disk
    server.process.wait()
    assert (moved["moved"], moved["left"], moved["durable"]) == (20, 30, True)

    server = start_server(*args)
    base = f"http://127.0.0.1:{server.ports['http']}"
    admin = HTTPClient(base, token=TOKEN, http=http)
    jobs = yield admin.peek("jobs", limit=100)
    assert [m["id"] for m in jobs["messages"]] == [f"m{i}" for i in range(20)]
    assert [m["body"] for m in jobs["messages"]][:2] == ["job 0", "job 1"]
    assert all(m["retry"] == 0 and m["headers"] == {"x-max-retries": "0", "kind": "resize"}
               for m in jobs["messages"])
    rest = yield admin.peek("jobs.dead", limit=100)
    assert [m["id"] for m in rest["messages"]] == [f"m{i}" for i in range(20, 50)]

    reader = HTTPClient(base, token=READ_TOKEN, http=http)
    anyone = HTTPClient(base, http=http)
    assert (yield reader.peek("jobs", limit=1))["depth"] == 20
    assert "connections" in (yield reader.connections())
    for denied in (anyone.peek("jobs"), anyone.connections(),
                   reader.move("jobs.dead", "jobs"), reader.purge("jobs")):
        with pytest.raises(APIError) as caught:
            yield denied
        assert caught.value.status == 401
    assert (yield anyone.health())["status"] == "ok"
    assert "mqserver_queue_moved" in (yield anyone.metrics())
    assert (yield anyone.queue("jobs"))["depth"] == 20
    # the --metrics listener: health and metrics, nothing else, whatever the token
    scrape = HTTPClient(f"http://127.0.0.1:{server.ports['metrics']}", token=TOKEN, http=http)
    assert (yield scrape.health())["status"] == "ok"
    assert 'mqserver_queue_depth{queue="jobs"} 20.0' in (yield scrape.metrics())
    with pytest.raises(APIError) as caught:
        yield scrape.peek("jobs")
    assert caught.value.status == 404
    assert "Traceback" not in server.text()
