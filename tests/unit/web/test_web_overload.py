"""Overflow policy and memory alarm over the HTTP API: 507, 503, /health and /metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mqserver.connlimits import ConnectionLimits


def metric(web, name: str, **labels: str) -> float:
    status, text = web.request("GET", "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"no {name} {labels} in /metrics")


def test_overflow_option_round_trips_and_is_checked(web):
    status, view = web.request("PUT", "/api/queues/jobs",
                               json={"max_length": 1, "overflow": "reject-publish"})
    assert status == 201
    assert view["options"]["overflow"] == "reject-publish"
    status, view = web.request("PUT", "/api/queues/jobs", json={"overflow": None})
    assert view["options"]["overflow"] is None and view["options"]["max_length"] == 1
    status, view = web.request("PUT", "/api/queues/jobs", json={"overflow": "drop-tail"})
    assert status == 400 and "drop-head, reject-publish" in view["error"]


def test_publish_to_a_full_queue_is_507_and_counted(web):
    web.request("PUT", "/api/queues/jobs", json={"max_length": 1, "overflow": "reject-publish",
                                                 "bindings": ["ev"]})
    assert web.request("POST", "/api/queues/jobs/messages", json={"body": "a"})[0] == 201
    status, answer = web.request("POST", "/api/queues/jobs/messages", json={"body": "b"})
    assert status == 507 and "is full" in answer["error"]
    status, answer = web.request("POST", "/api/events/ev", json={"body": "c"})
    assert status == 507
    status, view = web.request("GET", "/api/queues/jobs")
    assert view["depth"] == 1 and view["counters"]["refused"] == 2
    assert metric(web, "mqserver_queue_refused_total") == 2


def test_memory_alarm_refuses_http_publishes_and_shows_in_health_and_metrics(web):
    flow = web.broker.flow
    usage = [10]
    flow.measure = lambda: usage[0]
    flow.configure(1000, interval=1.0)
    flow.start()
    web.request("PUT", "/api/queues/jobs", json={})
    status, health = web.request("GET", "/health")
    assert health["status"] == "ok" and health["memory"]["alarm"] is False
    usage[0] = 2000
    web.clock.advance(1)
    d = web.start("POST", "/api/queues/jobs/messages", json={"body": "a"})
    web.stub.flush()
    response = web.result(d)
    assert response.code == 503
    assert response.headers.getRawHeaders(b"retry-after") == [b"1"]
    status, health = web.request("GET", "/health")
    assert status == 200 and health["status"] == "memory_alarm"
    assert health["memory"] == {"alarm": True, "rss_bytes": 2000, "high_watermark_bytes": 1000,
                                "low_watermark_bytes": 900, "paused_publishers": 0, "alarms": 1,
                                "store_behind": False}
    assert metric(web, "mqserver_memory_alarm") == 1
    assert metric(web, "mqserver_memory_bytes") == 2000
    usage[0] = 100
    web.clock.advance(1)
    assert web.request("POST", "/api/queues/jobs/messages", json={"body": "a"})[0] == 201
    assert metric(web, "mqserver_memory_alarm") == 0
    assert metric(web, "mqserver_memory_alarms_total") == 1
    web.broker.flow.store_behind(True)  # the store's writer far behind
    assert metric(web, "mqserver_store_behind") == 1
    assert web.request("GET", "/health")[1]["memory"]["store_behind"] is True


def test_refused_connections_are_counted_in_metrics_by_reason(web):
    limits = ConnectionLimits(total=2, per_ip=1)
    web.broker.connection_limits = limits
    assert metric(web, "mqserver_connections_refused_total", reason="max_connections") == 0
    limits.admit("10.0.0.1")
    limits.admit("10.0.0.1")  # a second from one IP
    limits.admit("10.0.0.2")
    limits.admit("10.0.0.3")  # a third in all
    limits.admit(None)
    assert metric(web, "mqserver_connections_refused_total", reason="max_connections") == 2
    assert metric(web, "mqserver_connections_refused_total",
                  reason="max_connections_per_ip") == 1
