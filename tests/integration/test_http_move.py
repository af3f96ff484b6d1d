"""Replaying a dead-letter queue over HTTP against the real server, then kill -9.

Messages are dead-lettered the way they are in production (rejected by a
consumer past their ``x-max-retries``), moved back with ``HTTPClient.move``,
and the server is killed the moment the move is answered: what restarts
must hold the move.  The same server checks who may read what with the
token, the read token and no token, and what its ``--metrics`` listener serves.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
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


def request(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    """One raw HTTP/1.1 request, sent without waiting for its answer."""
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_json(port: int, path: str, body: bytes | None = None) -> dict:
    ask = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                 headers={"Authorization": f"Bearer {TOKEN}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(ask, timeout=30) as answer:
        return json.load(answer)


@pytest.mark.parametrize("storage", sorted(STORES))
def test_kill_9_during_a_large_move_leaves_each_message_in_one_queue(start_server, tmp_path,
                                                                      line_client, storage):
    """A move of 30,000 messages spans several store batches (10,000 ops each); the
    server is killed while they are written, and restarted.  The kill's delay after
    the request is searched (doubled while nothing had moved, halved back while all
    had) until a kill falls in the middle of a move, for at most eight rounds, each
    moving the messages to the queue that holds none.

    Where the kill falls depends on the machine's speed, so the test does not
    insist on a cut in the middle; tests/unit/test_moving.py checks every cut
    point of a move deterministically.
    """
    count = 30_000
    args = (f"--protocol=mqks:{LISTEN}", f"--http={LISTEN}", f"--http-token={TOKEN}",
            f"--data-dir={tmp_path / 'data'}", *STORES[storage])
    cuts: list[tuple[float, int]] = []
    early, late = 0.0, None  # kill delays known to be before and after the whole move
    delay = 0.1
    for _ in range(8):
        server = start_server(*args)
        port = server.ports["http"]
        if not cuts:  # first round: fill the source
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request(port, "PUT", "/api/queues/to") +
                          request(port, "PUT", "/api/queues/barrier") +
                          request(port, "PUT", "/api/queues/from", b'{"bindings": ["ev"]}'))
                s.recv(65536)
            client = line_client(server.ports["mqks"])
            client.send(*(f"m{i} publish ev body-{i}" for i in range(count)))
            client.send("sync ping done")
            assert client.read(1) == [b"sync ok done"]
            # a durable publish waits for every op before it: the fill is on disk
            read_json(port, "/api/queues/barrier/messages", b'{"body": "x", "durable": true}')
        before = {q: read_json(port, f"/api/queues/{q}")["depth"] for q in ("from", "to")}
        assert sum(before.values()) == count
        target = "to" if before["from"] else "from"  # back and forth between rounds
        source = "from" if target == "to" else "to"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(request(port, "POST", f"/api/queues/{source}/move",
                              f'{{"to": "{target}"}}'.encode()))
            time.sleep(delay)
            server.process.kill()
            server.process.wait()
        server = start_server(*args)
        port = server.ports["http"]
        depths = {q: read_json(port, f"/api/queues/{q}")["depth"] for q in ("from", "to")}
        assert sum(depths.values()) == count, (delay, depths)
        ids = set()
        for name, depth in depths.items():
            if depth:
                peeked = read_json(port, f"/api/queues/{name}/messages?limit=1000")
                ids.update(m["id"] for m in peeked["messages"])
        assert len(ids) == min(depths["from"], 1000) + min(depths["to"], 1000)  # none in both
        moved = depths[target]
        cuts.append((round(delay, 3), moved))
        server.stop()
        if 0 < moved < count:
            break
        if moved == 0:
            early = delay
        else:
            late = delay
        delay = delay * 2 if late is None else (early + late) / 2
    print(f"{storage}: (kill delay, messages moved when killed): {cuts}")
