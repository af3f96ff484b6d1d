"""/health, /metrics and durable publishing, against stores that are slow or fail."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred

from mqserver.testing import RecordingSink


class SlowStore:
    """A durable store whose batches finish when the test says so."""

    durable = True

    def __init__(self) -> None:
        self.pending: list[Deferred] = []

    def apply(self, ops):
        d: Deferred = Deferred()
        self.pending.append(d)
        return d

    def metrics(self):
        return {"fsync_seconds": 0.25, "segments": 3, "ignored": "text"}


def web_on_slow_store(make_web, **kwargs):
    """(web, store): a queue ``q`` declared on a ``SlowStore``, its batch done."""
    store = SlowStore()
    web = make_web(store=store, **kwargs)
    web.broker.declare_queue(b"q")
    web.clock.advance(0)
    store.pending.pop().callback(None)
    return web, store


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_per_queue_per_protocol_and_storage(web):
    web.broker.reconfigure(b"q", replace=[b"e"])
    connection = web.broker.connection_opened("mqks", "peer", RecordingSink())
    web.broker.consume(connection, b"c", b"q")
    for n in range(3):
        web.broker.publish_event(b"e", b"m%d" % n, b"x")
    web.broker.publish_event(b"nobody", b"m", b"x")
    web.broker.publish_to_queue(b"idle", b"m", b"x")
    web.clock.advance(7)
    web.turn()
    status, text = web.request("GET", "/metrics")
    assert status == 200
    got = samples(text.decode())
    q, idle = (("queue", "q"),), (("queue", "idle"),)
    assert got[("mqserver_queue_in_flight", q)] == 3
    assert got[("mqserver_queue_depth", idle)] == 1
    assert got[("mqserver_queue_oldest_message_age_seconds", idle)] == 7
    assert got[("mqserver_queue_delivered_total", q)] == 3
    assert got[("mqserver_queue_consumers", q)] == 1
    assert got[("mqserver_published_total", ())] == 5
    assert got[("mqserver_unroutable_total", ())] == 1
    assert got[("mqserver_connections", (("protocol", "mqks"),))] == 1
    assert got[("mqserver_storage_ok", ())] == 1
    assert got[("mqserver_storage_batch_seconds_count", ())] == 0


def test_health_and_metrics_follow_the_storage(make_web):
    store = SlowStore()
    web = make_web(store=store)
    web.broker.publish_to_queue(b"q", b"m", b"x")
    web.clock.advance(0)
    web.clock.advance(0.5)
    store.pending.pop().callback(None)
    status, health = web.request("GET", "/health")
    assert status == 200 and health["status"] == "ok"
    storage = health["storage"]
    assert (storage["durable"], storage["batches"], storage["last_batch_seconds"]) == (True, 1, 0.5)
    assert storage["store"] == {"fsync_seconds": 0.25, "segments": 3.0}
    web.broker.publish_to_queue(b"q", b"m2", b"x")
    web.clock.advance(0)
    store.pending.pop().errback(OSError("disk full"))
    status, health = web.request("GET", "/health")
    assert status == 503 and health["status"] == "degraded"
    assert health["storage"]["last_error"] == "disk full"
    got = samples(web.request("GET", "/metrics")[1].decode())
    assert got[("mqserver_storage_ok", ())] == 0
    assert got[("mqserver_storage_failures_total", ())] == 1
    assert got[("mqserver_storage_batch_seconds_count", ())] == 2
    assert got[("mqserver_storage_batch_seconds_sum", ())] == 0.5
    assert got[("mqserver_store_fsync_seconds", ())] == 0.25


def test_durable_publish_answers_only_once_the_batch_is_durable(make_web):
    web, store = web_on_slow_store(make_web)
    pending = web.start("POST", "/api/queues/q/messages", json={"body": "x", "durable": True})
    web.clock.advance(0)
    assert not web.answered(pending)
    store.pending.pop().callback(None)
    status, body = web.finish(pending)
    assert (status, body["durable"]) == (201, True)
    pending = web.start("POST", "/api/events/e", json={"body": "x", "durable": True})
    status, body = web.finish(pending)  # nothing to write: no queue is bound
    assert (status, body["queues"], body["durable"]) == (201, 0, True)
    pending = web.start("POST", "/api/queues/q/messages", json={"body": "y", "durable": True})
    web.clock.advance(0)
    store.pending.pop().errback(OSError("disk full"))
    status, error = web.finish(pending)
    assert status == 503 and "disk full" in error["error"]


def test_durable_on_a_memory_store_answers_at_once_and_says_so(web):
    web.broker.declare_queue(b"q")
    status, body = web.request("POST", "/api/queues/q/messages",
                               json={"body": "x", "durable": True})
    assert (status, body["durable"]) == (201, False)
