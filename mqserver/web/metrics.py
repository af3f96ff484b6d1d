# -*- test-case-name: tests.unit.test_web_metrics -*-
"""``/health`` and ``/metrics``: liveness, storage status, Prometheus text.

The collector reads the broker's counters at scrape time instead of
updating prometheus_client metrics on every publish: the hot path stays
free of instrumentation, and the numbers cannot drift from the ones the
broker (and MQKS ``_eval``) report.  Each site has its own registry, so
several brokers in one process (tests) do not collide.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from mqserver.connlimits import REFUSAL_REASONS
from mqserver.web.router import OPEN, Call, Reply, Route, text
from mqserver.web.views import QUEUE_COUNTERS, connections_by_protocol, storage_view


class BrokerCollector:
    """A prometheus_client collector over one broker's public state."""

    def __init__(self, broker: Any, storage_name: str = "memory") -> None:
        self.broker = broker
        self.storage_name = storage_name

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        now = broker.clock.seconds()
        yield from self._queues(broker, now)
        for name, value, doc in (
            ("published", broker.published, "Messages published (to a queue or an event)."),
            ("queued", broker.queued, "Message copies put into queues."),
            ("delivered", broker.delivered, "Deliveries to consumers."),
            ("unroutable", broker.unroutable, "Events published that no queue was bound to."),
        ):
            yield CounterMetricFamily(f"mqserver_{name}", doc, value=value)
        connections = GaugeMetricFamily(
            "mqserver_connections", "Open client connections.", labels=["protocol"]
        )
        for protocol, count in connections_by_protocol(broker).items():
            connections.add_metric([protocol], count)
        yield connections
        flow = broker.flow
        yield GaugeMetricFamily("mqserver_memory_alarm",
                                "1 while reading from publishers is stopped for memory.",
                                value=int(flow.active))
        yield GaugeMetricFamily("mqserver_memory_bytes",
                                "Resident memory at the last check (0 with the alarm off).",
                                value=flow.used)
        yield GaugeMetricFamily("mqserver_memory_high_watermark_bytes",
                                "The memory alarm's high-water mark (0: off).",
                                value=flow.high or 0)
        yield CounterMetricFamily("mqserver_memory_alarms", "Times the memory alarm went on.",
                                  value=flow.alarms)
        yield GaugeMetricFamily("mqserver_store_behind",
                                "1 while publishers are not read because the store's writer "
                                "is far behind.", value=int(flow.store_waiting))
        limits = broker.connection_limits
        if limits is not None:
            refused = CounterMetricFamily(
                "mqserver_connections_refused",
                "Connections closed at once, by the limit they were over: max_connections "
                "(--max-connections) or max_connections_per_ip (--max-connections-per-ip).",
                labels=["reason"])
            for reason in REFUSAL_REASONS:
                refused.add_metric([reason], limits.refused_by[reason])
            yield refused
        yield from self._storage(broker)

    def _queues(self, broker: Any, now: float) -> Iterator[Metric]:
        gauges = {
            "depth": GaugeMetricFamily("mqserver_queue_depth", "Ready messages.",
                                       labels=["queue"]),
            "in_flight": GaugeMetricFamily("mqserver_queue_in_flight",
                                           "Delivered, not yet acked.", labels=["queue"]),
            "consumers": GaugeMetricFamily("mqserver_queue_consumers", "Consumers.",
                                           labels=["queue"]),
            "age": GaugeMetricFamily("mqserver_queue_oldest_message_age_seconds",
                                     "Age of the oldest ready message.", labels=["queue"]),
        }
        counters = {
            name: CounterMetricFamily(f"mqserver_queue_{name}",
                                      f"Messages {name.replace('_', ' ')} in this queue.",
                                      labels=["queue"])
            for name in QUEUE_COUNTERS
        }
        for queue in broker.queues.values():
            label = [text(queue.name)]
            gauges["depth"].add_metric(label, len(queue.ready))
            gauges["in_flight"].add_metric(label, queue.in_flight())
            gauges["consumers"].add_metric(label, len(queue.consumers))
            gauges["age"].add_metric(label, queue.oldest_ready_age(now))
            for name, family in counters.items():
                family.add_metric(label, getattr(queue, name))
        yield from gauges.values()
        yield from counters.values()

    def _storage(self, broker: Any) -> Iterator[Metric]:
        view = storage_view(broker, self.storage_name)
        yield GaugeMetricFamily("mqserver_storage_ok",
                                "1 unless the last storage batch failed.", value=int(view["ok"]))
        yield CounterMetricFamily("mqserver_storage_failures", "Storage batches that failed.",
                                  value=view["failures"])
        yield GaugeMetricFamily("mqserver_storage_last_batch_seconds",
                                "Time the last batch took to become durable (fsync included).",
                                value=view["last_batch_seconds"])
        yield GaugeMetricFamily("mqserver_storage_last_batch_ops", "Ops in the last batch.",
                                value=view["last_batch_ops"])
        yield GaugeMetricFamily("mqserver_storage_pending_ops",
                                "Ops waiting for the next batch.", value=view["pending_ops"])
        writer = broker.writer
        yield SummaryMetricFamily(
            "mqserver_storage_batch_seconds",
            "Storage batches (group commits) and the time they took, fsync included.",
            count_value=writer.batches if writer is not None else 0,
            sum_value=writer.batch_seconds_total if writer is not None else 0.0,
        )
        for name, value in view["store"].items():
            metric = "mqserver_store_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)
            yield GaugeMetricFamily(metric, f"Reported by the storage backend: {name}.",
                                    value=value)


def health(call: Call) -> Any:
    api = call.api
    storage = storage_view(call.broker, api.storage_name)
    ok = storage["ok"]
    memory = memory_view(call.broker.flow)
    # the memory alarm answers 200: the broker is alive and shedding load, and a
    # liveness probe that restarted it would lose what it holds in memory
    status = "degraded" if not ok else "memory_alarm" if memory["alarm"] else "ok"
    return Reply(200 if ok else 503, {
        "status": status,
        "uptime": round(call.broker.clock.seconds() - api.started_at, 3),
        "storage": storage,
        "memory": memory,
    })


def memory_view(flow: Any) -> dict[str, Any]:
    """The memory alarm as ``/health`` shows it (``mqserver.broker.flow``)."""
    return {
        "alarm": flow.active, "rss_bytes": flow.used, "high_watermark_bytes": flow.high,
        "low_watermark_bytes": flow.low, "paused_publishers": len(flow.publishers)
        if flow.paused else 0, "alarms": flow.alarms, "store_behind": flow.store_waiting,
    }


def metrics(call: Call) -> Any:
    return Reply(200, generate_latest(call.api.registry), CONTENT_TYPE_LATEST)


def make_registry(broker: Any, storage_name: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, storage_name))  # type: ignore[arg-type]
    return registry


ROUTES = [
    Route("GET", "/health", health,
          "Liveness and storage status: 200 ok, 503 when the last storage batch failed",
          "status", returns={"$ref": "#/components/schemas/Health"}, errors=(503,),
          access=OPEN),
    Route("GET", "/metrics", metrics, "Prometheus metrics (text exposition format)", "status",
          content_type=CONTENT_TYPE_LATEST, access=OPEN),
]
