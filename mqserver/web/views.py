# -*- test-case-name: tests.unit.test_web_views -*-
"""JSON views of broker state, and rates computed from the broker's counters.

The broker keeps only ever-growing counters (no timers of its own for
stats), so rates are differences between samples taken here.  Samples are
taken when the API is read rather than by a periodic task: a broker nobody
watches pays nothing, and the dashboard, which polls every second, sees
rates over the last ``window`` seconds.
"""

from __future__ import annotations

from binascii import b2a_base64
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from mqserver.interfaces import IClientConnection
from mqserver.model import Message
from mqserver.web.router import text

QUEUE_COUNTERS = ("enqueued", "delivered", "acked", "rejected", "requeued", "expired",
                  "dead_lettered", "refused", "moved")
RATE_NAMES = ("publish", "deliver", "ack")


class RateSampler:
    """Per-key rates over roughly the last ``window`` seconds.

    At most one sample per ``interval`` is kept per key, and only one older
    than the window (the baseline), so memory is bounded per key.
    """

    def __init__(self, window: float = 10.0, interval: float = 1.0) -> None:
        self.window = window
        self.interval = interval
        self._samples: dict[Hashable, deque[tuple[float, Sequence[int]]]] = {}

    def rates(self, key: Hashable, counters: Sequence[int], now: float) -> list[float]:
        """Per-second increase of each counter since the baseline sample (0 at first)."""
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque()
        if not samples or now - samples[-1][0] >= self.interval:
            samples.append((now, tuple(counters)))
        while len(samples) > 1 and now - samples[1][0] >= self.window:
            samples.popleft()
        then, old = samples[0]
        elapsed = now - then
        if elapsed <= 0:
            return [0.0] * len(counters)
        # a queue deleted and declared again restarts its counters: never negative
        return [round(max(0.0, (new - was) / elapsed), 3) for new, was in zip(counters, old,
                                                                              strict=True)]

    def keep_only(self, keys: set[Hashable]) -> None:
        """Forget keys that are gone (deleted queues), so the table does not grow."""
        for key in [k for k in self._samples if k not in keys]:
            del self._samples[key]


def queue_rates(sampler: RateSampler, queue: Any, now: float) -> dict[str, float]:
    counters = (queue.enqueued, queue.delivered, queue.acked)
    return dict(zip(RATE_NAMES, sampler.rates(queue.name, counters, now), strict=True))


def queue_view(broker: Any, queue: Any, sampler: RateSampler, now: float,
               detail: bool = False) -> dict[str, Any]:
    options = queue.options
    view: dict[str, Any] = {
        "name": text(queue.name),
        "depth": len(queue.ready),
        "in_flight": queue.in_flight(),
        "consumers": len(queue.consumers),
        "oldest_message_age": round(queue.oldest_ready_age(now), 3),
        "created_at": queue.created_at,
        "options": {
            "dead_letter": text(options.dead_letter) if options.dead_letter else None,
            "max_length": options.max_length,
            "default_ttl": options.default_ttl,
            "delete_when_unused": options.delete_when_unused,
            "overflow": options.overflow,
        },
        "counters": {name: getattr(queue, name) for name in QUEUE_COUNTERS},
        "rates": queue_rates(sampler, queue, now),
    }
    if detail:
        view["bindings"] = sorted(text(e) for e in broker.bindings.events_of(queue.name))
        view["consumer_list"] = [consumer_view(c) for c in queue.consumers]
    return view


def consumer_view(consumer: Any) -> dict[str, Any]:
    window = consumer.window
    unacked = len(consumer.unacked)
    return {
        "id": text(consumer.id),
        "queue": text(consumer.queue.name),
        "connection": consumer.connection.id,
        "protocol": consumer.connection.protocol,
        "window": window,
        # None: unlimited (MQKS); a shared eMQP slot pool limits it further
        "credit": None if window is None else max(0, window - unacked),
        "has_credit": consumer.has_credit(),
        "unacked": unacked,
        "delivered": consumer.delivered,
        "acked": consumer.acked,
        "manual_ack": consumer.manual_ack,
        "priority": consumer.priority,
    }


def connection_view(connection: Any, now: float) -> dict[str, Any]:
    consumers = list(connection.consumers.values())
    return {
        "id": connection.id,
        "protocol": connection.protocol,
        "peer": connection.peer,
        "opened_at": connection.opened_at,
        "age": round(now - connection.opened_at, 3),
        "paused": connection.paused,
        "closable": IClientConnection.providedBy(connection.sink),
        "unacked": sum(len(c.unacked) for c in consumers),
        "consumers": [consumer_view(c) for c in consumers],
    }


def message_view(message: Message, now: float) -> dict[str, Any]:
    """A message as the API shows it.  A consume answer has a thousand of these,
    so ``text`` and ``base64.b64encode`` are inlined: half of what it cost."""
    body = message.body
    try:
        body_text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        body_text = None
    event = message.event
    return {
        "id": message.id.decode("utf-8", "surrogateescape"),
        "queue": message.queue.decode("utf-8", "surrogateescape"),
        "seq": message.seq,
        "event": event.decode("utf-8", "surrogateescape") if event is not None else None,
        "headers": message.headers or {},
        "retry": message.retry,
        "created_at": message.created_at,
        "age": round(now - message.created_at, 3),
        "expires_at": message.expires_at,
        "source": message.source,
        "size": len(body),
        "body": body_text,
        "body_base64": b2a_base64(body, newline=False).decode("ascii"),
    }


def storage_view(broker: Any, storage_name: str) -> dict[str, Any]:
    """Writer health; a store with a ``metrics()`` method adds its own numbers."""
    writer = broker.writer
    view: dict[str, Any] = {
        "backend": storage_name,
        "durable": writer is not None,
        "ok": writer is None or writer.last_error is None,
        "last_error": writer.last_error if writer is not None else None,
        "failures": writer.failures if writer is not None else 0,
        "batches": writer.batches if writer is not None else 0,
        "last_batch_ops": writer.last_batch_size if writer is not None else 0,
        "last_batch_seconds": writer.last_batch_seconds if writer is not None else 0.0,
        "pending_ops": len(writer.ops) if writer is not None else 0,
    }
    view["store"] = store_metrics(broker.store)
    return view


def store_metrics(store: Any) -> dict[str, float]:
    """Numbers a backend chooses to publish (e.g. fsync time): ``store.metrics()``.

    Optional and duck-typed, so ``IMessageStore`` stays as it is; anything
    that is not a name-to-number mapping is ignored rather than breaking
    ``/health`` and ``/metrics``.
    """
    metrics = getattr(store, "metrics", None)
    if not callable(metrics):
        return {}
    try:
        values = metrics()
        return {
            str(k): float(v) for k, v in dict(values).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
    except Exception:
        return {}


def connections_by_protocol(broker: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for connection in broker.connections.values():
        counts[connection.protocol] = counts.get(connection.protocol, 0) + 1
    return dict(sorted(counts.items()))


def overview(broker: Any, sampler: RateSampler, now: float, started_at: float,
             storage_name: str) -> dict[str, Any]:
    publish, deliver = sampler.rates("", (broker.published, broker.delivered), now)
    return {
        "uptime": round(now - started_at, 3),
        "queues": len(broker.queues),
        "ready": broker.ready_count(),
        "in_flight": broker.in_flight(),
        "consumers": broker.consumer_count(),
        "connections": connections_by_protocol(broker),
        "counters": {
            "published": broker.published,
            "queued": broker.queued,
            "delivered": broker.delivered,
            "unroutable": broker.unroutable,
        },
        "rates": {"publish": publish, "deliver": deliver},
        "storage": storage_view(broker, storage_name),
    }
