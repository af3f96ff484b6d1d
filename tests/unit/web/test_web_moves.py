"""``POST /api/queues/{queue}/move`` and ``HTTPClient.move``: answered once durable."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred

from mqserver.broker.moving import CHUNK
from mqserver.client import APIError
from mqserver.model import QueueOptions
from mqserver.testing import DurableMemoryStore


class HeldStore(DurableMemoryStore):
    """A durable store whose batches wait until the test fires them."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Deferred[None]] = []

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        self.ops.extend(ops)
        d: Deferred[None] = Deferred()
        self.pending.append(d)
        return d


def fill(web: Any, count: int = 3) -> None:
    web.broker.declare_queue(b"jobs", QueueOptions(dead_letter=b"jobs.dead"))
    web.broker.declare_queue(b"jobs.dead")
    for i in range(count):
        web.broker.publish_to_queue(b"jobs.dead", b"m%d" % i, b"body %d" % i,
                                    headers={"x-dead-letter-reason": "bad", "k": "v"})


def test_move_all_then_the_rest_with_a_limit(web):
    fill(web, 5)
    status, body = web.request("POST", "/api/queues/jobs.dead/move",
                               json={"to": "jobs", "limit": 2})
    assert status == 200
    assert body == {"from": "jobs.dead", "to": "jobs", "moved": 2, "left": 3, "stopped": None,
                    "durable": False}
    status, body = web.request("POST", "/api/queues/jobs.dead/move", json={"to": "jobs"})
    assert (status, body["moved"], body["left"]) == (200, 3, 0)
    _, peeked = web.request("GET", "/api/queues/jobs/messages")
    assert [m["id"] for m in peeked["messages"]] == ["m0", "m1", "m2", "m3", "m4"]
    assert all(m["headers"] == {"k": "v"} and m["retry"] == 0 for m in peeked["messages"])
    _, queue = web.request("GET", "/api/queues/jobs.dead")
    assert queue["counters"]["moved"] == 5


def test_dead_letter_headers_are_kept_on_request(web):
    fill(web, 1)
    web.request("POST", "/api/queues/jobs.dead/move",
                json={"to": "jobs", "keep_dead_letter_headers": True})
    assert web.broker.queues[b"jobs"].ready[0].headers == {"x-dead-letter-reason": "bad",
                                                           "k": "v"}


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/api/queues/jobs.dead/move", {}, 400, "'to'"),
    ("/api/queues/jobs.dead/move", {"to": "nowhere"}, 404, "no queue 'nowhere'"),
    ("/api/queues/nowhere/move", {"to": "jobs"}, 404, "no queue 'nowhere'"),
    ("/api/queues/jobs/move", {"to": "jobs"}, 400, "onto itself"),
    ("/api/queues/jobs.dead/move", {"to": "jobs", "limit": 0}, 400, "'limit'"),
    ("/api/queues/jobs.dead/move", {"to": "jobs", "limit": "x"}, 400, "'limit'"),
    ("/api/queues/jobs.dead/move", {"to": 5}, 400, "'to'"),
    ("/api/queues/jobs.dead/move", {"to": "jobs", "keep_dead_letter_headers": 3}, 400,
     "keep_dead_letter_headers"),
])
def test_bad_moves_are_refused_and_move_nothing(web, path, body, status, message):
    fill(web)
    got, answer = web.request("POST", path, json=body)
    assert got == status and message in answer["error"]
    assert len(web.broker.queues[b"jobs.dead"].ready) == 3
    assert b"nowhere" not in web.broker.queues


def test_a_full_target_stops_the_move_and_says_so(web):
    fill(web)
    web.request("PUT", "/api/queues/jobs", json={"max_length": 2})
    status, body = web.request("POST", "/api/queues/jobs.dead/move", json={"to": "jobs"})
    assert (status, body["moved"], body["left"], body["stopped"]) == (200, 2, 1, "target full")


def test_the_answer_waits_until_the_move_is_durable(make_web):
    store = HeldStore()
    web = make_web(store=store)
    fill(web)
    web.turn()
    store.pending.pop().callback(None)
    pending = web.start("POST", "/api/queues/jobs.dead/move", json={"to": "jobs"})
    web.turn()
    assert not web.answered(pending)
    store.pending.pop().callback(None)
    status, body = web.finish(pending)
    assert status == 200 and body["durable"] is True and body["moved"] == 3
    kinds = [op[0] for op in store.ops[-6:]]
    assert kinds == ["enqueue", "remove"] * 3


def test_a_failing_store_makes_the_move_a_503_that_says_it_is_not_durable_yet(make_web):
    store = HeldStore()
    web = make_web(store=store)
    fill(web)
    web.turn()
    store.pending.pop().callback(None)
    pending = web.start("POST", "/api/queues/jobs.dead/move", json={"to": "jobs"})
    web.turn()
    store.pending.pop().errback(OSError("disk full"))
    status, body = web.finish(pending)
    assert status == 503 and "not durable yet" in body["error"] and "disk full" in body["error"]
    assert len(web.broker.queues[b"jobs"].ready) == 3  # done in memory, retried by the writer
    for call in web.clock.getDelayedCalls():
        call.cancel()


def test_the_client_moves_and_raises_the_servers_errors(web):
    fill(web, 4)
    result = web.result(web.client.move("jobs.dead", "jobs", limit=1))
    assert (result["moved"], result["left"]) == (1, 3)
    result = web.result(web.client.move("jobs.dead", "jobs", keep_dead_letter_headers=True))
    assert result["moved"] == 3
    assert "x-dead-letter-reason" in web.broker.queues[b"jobs"].ready[-1].headers
    assert "x-dead-letter-reason" not in web.broker.queues[b"jobs"].ready[0].headers
    with pytest.raises(APIError) as caught:
        web.result(web.client.move("jobs.dead", "absent"))
    assert caught.value.status == 404


def test_a_move_of_more_than_a_chunk_is_answered_after_its_last_chunk(web):
    fill(web, CHUNK + 1)
    pending = web.start("POST", "/api/queues/jobs.dead/move", json={"to": "jobs"})
    assert not web.answered(pending)
    assert len(web.broker.queues[b"jobs"].ready) == CHUNK
    web.turn()
    status, body = web.finish(pending)
    assert (status, body["moved"], body["left"]) == (200, CHUNK + 1, 0)
