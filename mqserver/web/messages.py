# -*- test-case-name: tests.unit.test_web_api -*-
"""Message endpoints: publish (to a queue or an event), peek, consume, ack, reject."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import Any

from twisted.internet.defer import Deferred

from mqserver.broker.overflow import QueueFullError
from mqserver.model import new_message_id
from mqserver.web import fields
from mqserver.web.router import APIError, Call, Reply, Route, text
from mqserver.web.views import message_view

MAX_POLL = 60.0
MAX_LEASE = 3600.0


def _publish_args(call: Call) -> tuple[bytes, bytes, dict[str, str] | None, float | None, bool]:
    """(id, body, headers, ttl, durable) from a JSON body, or from a raw body and the query."""
    if call.is_json():
        obj = call.json()
        body = fields.message_body(obj)
    else:
        body = call.body()
        obj = {k: call.query(k) for k in ("id", "ttl", "durable")}
    message_id, headers, ttl, durable = fields.publish_options(obj, call.api.limits)
    return message_id or new_message_id(), body, headers, ttl, durable


def after_durable(call: Call, durable: bool, answer: dict[str, Any],
                  what: str = "the message") -> Any:
    """201 now, or, with ``durable``, once the storage says everything so far is durable.

    One wait per request, however many messages it published: the store's
    group commit takes what concurrent requests added in the same turns.
    """
    # true only when a durable store confirmed it: a memory store keeps nothing
    answer["durable"] = durable and call.broker.writer is not None
    if not durable:
        return Reply(201, answer)
    d: Deferred[Any] = call.broker.durable()

    def failed(failure: Any) -> None:
        raise APIError(503, f"storage failed, {what} may not be durable: "
                            f"{failure.getErrorMessage()}")

    d.addCallbacks(lambda _: Reply(201, answer), failed)
    return d


def refuse_during_alarm(call: Call) -> None:
    """503 while the memory alarm is on.

    HTTP cannot be slowed by not reading a socket the way the other protocols
    are, so during the memory alarm publishes are refused and told when to retry.
    """
    if call.broker.flow.active:
        raise APIError(503, "memory alarm: publishing is paused, retry later",
                       {"Retry-After": "1"})


def _publish(call: Call, publish: Any, *args: Any) -> Any:
    """Publish, or say why not: 503 while the memory alarm is on, 507 for a full queue."""
    refuse_during_alarm(call)
    try:
        return publish(*args)
    except QueueFullError as e:
        raise APIError(507, str(e)) from None


def publish_to_queue(call: Call) -> Any:
    queue = call.queue()
    message_id, body, headers, ttl, durable = _publish_args(call)
    message = _publish(call, call.broker.publish_to_queue, queue.name, message_id, body, headers,
                       ttl, "http")
    answer = {"id": text(message.id), "queue": text(queue.name), "seq": message.seq}
    return after_durable(call, durable, answer)


def publish_event(call: Call) -> Any:
    event = call.params["event"]
    message_id, body, headers, ttl, durable = _publish_args(call)
    count = _publish(call, call.broker.publish_event, event, message_id, body, headers, ttl,
                     "http")
    answer = {"id": text(message_id), "event": text(event), "queues": count}
    return after_durable(call, durable, answer)


def peek(call: Call) -> Any:
    queue = call.queue()
    limit = fields.number({"limit": call.query("limit")}, "limit", 10, 1, 1000, integer=True)
    now = call.broker.clock.seconds()
    messages = [message_view(m, now) for m in islice(queue.ready, limit)]
    return {"queue": text(queue.name), "depth": len(queue.ready), "messages": messages}


def consume(call: Call) -> Any:
    queue = call.queue()
    obj = call.json()
    name = fields.checked(obj, "consumer", call.api.limits, ids=True)
    count = fields.number(obj, "max", 1, 1, 1000, integer=True)
    timeout = fields.number(obj, "timeout", 0.0, 0, MAX_POLL)
    lease = fields.number(obj, "lease", 30.0, 1, MAX_LEASE)
    session = call.api.consumers.open(name, queue.name, call.peer())
    session.renew(lease)
    d = session.poll(count, timeout)

    def answer(messages: list[Any]) -> dict[str, Any]:
        now = call.broker.clock.seconds()
        return {
            "consumer": text(session.name),
            "queue": text(session.queue),
            "lease": session.lease,
            "messages": [message_view(m, now) for m in messages],
        }

    return d.addCallback(answer)


Settled = tuple[list[bytes], list[bytes]]
"""The ids a settle call settled, and those the consumer did not hold, in request order."""


def _settle(call: Call, settle: Callable[[Any, list[bytes]], Settled]) -> dict[str, Any]:
    """Settle the ids the body lists with ``settle(consumer, ids)``: every id
    is answered, as settled or unknown."""
    queue = call.queue()
    obj = call.json()
    name = fields.checked(obj, "consumer", call.api.limits, ids=True)
    if name is None:
        raise APIError(400, "'consumer' is required")
    ids = fields.names(obj, "ids", call.api.limits, ids=True)
    check_batch_size(call, len(ids), "ids")
    session = call.api.consumers.get(name, queue.name)
    session.renew()
    done, unknown = settle(session.consumer, ids)
    session.sync_window()
    return {"consumer": text(name), "settled": [text(i) for i in done],
            "unknown": [text(i) for i in unknown]}


def check_batch_size(call: Call, count: int, what: str) -> None:
    """413 for more than ``--http-max-batch`` messages or ids in one request."""
    limit = call.api.max_batch
    if count > limit:
        raise APIError(413, f"{count} {what} in one request; at most {limit} are allowed "
                            f"(--http-max-batch): item {limit} is the first one too many")


def ack(call: Call) -> Any:
    """All the ids in one broker call (``ack_run``): its lookups and kick happen once."""
    def settle(consumer: Any, ids: list[bytes]) -> Settled:
        unacked = consumer.unacked
        done, unknown = [], []
        seen: set[bytes] = set()
        for message_id in ids:
            # a repeated id is settled once: its repeats are unknown by then
            if message_id in unacked and message_id not in seen:
                seen.add(message_id)
                done.append(message_id)
            else:
                unknown.append(message_id)
        call.broker.ack_run(consumer, done)
        return done, unknown

    return _settle(call, settle)


def reject(call: Call) -> Any:
    def settle(consumer: Any, ids: list[bytes]) -> Settled:
        done, unknown = [], []
        for message_id in ids:
            (done if call.broker.reject(consumer, message_id) else unknown).append(message_id)
        return done, unknown

    return _settle(call, settle)


MESSAGE_IN = {
    "type": "object",
    "properties": {
        "body": {"type": "string", "description": "UTF-8 text body"},
        "body_base64": {"type": "string", "description": "binary body, base64"},
        "id": {"type": "string", "description": "message id (default: 32 random hex)"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "ttl": {"type": "number", "description": "seconds; 0 or absent: the queue default"},
        "durable": {"type": "boolean",
                    "description": "answer 201 only once the storage made it durable"},
    },
    "description": "Any other Content-Type sends the raw body as the message, "
                   "with id, ttl and durable as query parameters.",
}
_SETTLE_IN = {
    "type": "object", "required": ["consumer", "ids"],
    "properties": {"consumer": {"type": "string"},
                   "ids": {"type": "array", "items": {"type": "string"}}},
}
_SETTLED = {"type": "object", "properties": {
    "consumer": {"type": "string"},
    "settled": {"type": "array", "items": {"type": "string"}},
    "unknown": {"type": "array", "items": {"type": "string"}}}}
_MESSAGES = {"type": "array", "items": {"$ref": "#/components/schemas/Message"}}

ROUTES = [
    Route("POST", "/api/queues/{queue}/messages", publish_to_queue,
          "Publish one message to a queue", "messages", body=MESSAGE_IN, status=201,
          returns={"type": "object", "properties": {
              "id": {"type": "string"}, "queue": {"type": "string"},
              "seq": {"type": "integer"}, "durable": {"type": "boolean"}}},
          errors=(400, 401, 404, 413, 503, 507)),
    Route("POST", "/api/events/{event}", publish_event,
          "Publish one message to an event: a copy goes to every bound queue", "messages",
          body=MESSAGE_IN, status=201,
          returns={"type": "object", "properties": {
              "id": {"type": "string"}, "event": {"type": "string"},
              "queues": {"type": "integer"}, "durable": {"type": "boolean"}}},
          errors=(400, 401, 413, 503, 507)),
    Route("GET", "/api/queues/{queue}/messages", peek,
          "Peek at the oldest ready messages without consuming them (read token)", "messages",
          query={"limit": ({"type": "integer", "default": 10, "maximum": 1000},
                           "how many messages")},
          returns={"type": "object", "properties": {
              "queue": {"type": "string"}, "depth": {"type": "integer"},
              "messages": _MESSAGES}},
          errors=(400, 404)),
    Route("POST", "/api/queues/{queue}/consume", consume,
          "Long-poll for messages as a named HTTP consumer (ack them before the lease ends)",
          "messages",
          body={"type": "object", "properties": {
              "consumer": {"type": "string", "description": "session name; new if absent"},
              "max": {"type": "integer", "default": 1, "maximum": 1000},
              "timeout": {"type": "number", "default": 0, "maximum": MAX_POLL,
                          "description": "seconds to wait for a message"},
              "lease": {"type": "number", "default": 30, "maximum": MAX_LEASE,
                        "description": "seconds without a poll or ack before unacked "
                                       "messages go back to the queue"}}},
          returns={"type": "object", "properties": {
              "consumer": {"type": "string"}, "queue": {"type": "string"},
              "lease": {"type": "number"}, "messages": _MESSAGES}},
          errors=(400, 401, 404, 409, 503)),
    Route("POST", "/api/queues/{queue}/ack", ack,
          "Acknowledge deliveries of an HTTP consumer", "messages",
          body=_SETTLE_IN, returns=_SETTLED, errors=(400, 401, 404, 409)),
    Route("POST", "/api/queues/{queue}/reject", reject,
          "Reject deliveries of an HTTP consumer: back to the queue's tail, retry + 1",
          "messages", body=_SETTLE_IN, returns=_SETTLED, errors=(400, 401, 404, 409)),
]
