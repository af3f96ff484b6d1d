# -*- test-case-name: tests.unit.web.test_web_batches -*-
"""Batch publishing: many messages in one request, one broker run, one durability wait.

A request per message costs a twisted.web request each (about 150 us, most
of what an HTTP publish costs), and a ``"durable": true`` publish a wait of
its own.  A batch, a JSON array or NDJSON (one message object a line),
costs one request: the broker gets its messages as one publish run
(``publish_to_queue_run``/``publish_event_run``: routing, clock and kick
once), the answer waits once for the store's group commit, and it lists
every message's id in order.

Every entry is checked before anything is published, so a bad one (its
index is in the 400) refuses the whole batch; ``--http-max-batch`` bounds
the entries (413), ``--http-max-body`` the bytes (413).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from mqserver.broker.overflow import QueueFullError
from mqserver.limits import Limits
from mqserver.web import fields
from mqserver.web.messages import MESSAGE_IN, after_durable, refuse_during_alarm
from mqserver.web.router import JSON_TYPE, APIError, Call, Route, text

NDJSON_TYPE = "application/x-ndjson"

Run = tuple[dict[str, str] | None, float | None, list[tuple[bytes, bytes]]]
"""Consecutive messages sharing headers and ttl, as the broker takes a run:
``(headers, ttl, [(id, body), ...])``."""


@dataclass
class Batch:
    """A checked batch: its runs in order, every id in order (as text, for the
    answer), and whether to wait."""

    runs: list[Run] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    durable: bool = False

    def add(self, message_id: bytes, body: bytes, headers: dict[str, str] | None,
            ttl: float | None) -> None:
        if self.runs:
            last_headers, last_ttl, entries = self.runs[-1]
            if last_headers == headers and last_ttl == ttl:
                entries.append((message_id, body))
                return
        self.runs.append((headers, ttl, [(message_id, body)]))


def _values(data: bytes, ndjson: bool, max_batch: int) -> tuple[list[Any], list[int] | None]:
    """The batch's JSON values, and for NDJSON the line each came from (for errors).

    413 as soon as an entry past ``max_batch`` shows up; 400 for what is not JSON.
    """
    if not ndjson:
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(value, list):
            raise APIError(400, "a batch is a JSON array of message objects "
                                f"(or {NDJSON_TYPE}: one object a line)")
        if len(value) > max_batch:
            _too_many(max_batch)
        return value, None
    values: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        if len(values) == max_batch:
            _too_many(max_batch)
        lines.append(number)
        try:
            values.append(json.loads(line))
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"{_name(len(values), lines)} is not valid JSON: {e}") from None
    return values, lines


def _name(index: int, lines: list[int] | None) -> str:
    """How an error names the message at ``index``: ``message 3``, ``message 3 (line 5)``."""
    return f"message {index}" + (f" (line {lines[index]})" if lines is not None else "")


def _too_many(max_batch: int) -> None:
    raise APIError(413, f"more than {max_batch} messages in one batch (--http-max-batch): "
                        f"message {max_batch} is the first one too many")


def parse(data: bytes, ndjson: bool, max_batch: int, limits: Limits,
          durable: bool = False) -> Batch:
    """Check every entry of a batch body; the first bad one is a 400 naming its index.

    Each entry has the fields of a single publish (``body`` or
    ``body_base64``, ``id``, ``headers``, ``ttl``, ``durable``); one entry
    with ``"durable": true`` (or ``durable`` given here) makes the whole
    batch wait for the store.
    """
    values, lines = _values(data, ndjson, max_batch)
    batch = Batch(durable=durable)
    ids = batch.ids
    # fresh ids as model.new_message_id makes them, from one urandom call
    fresh = os.urandom(16 * len(values)).hex()
    for index, value in enumerate(values):
        if type(value) is dict and len(value) == 1 and type(text_body := value.get("body")) is str:
            # the usual entry, a text body alone: what message_body and
            # publish_options would find, without their calls
            message_id = fresh[32 * index:32 * index + 32]
            ids.append(message_id)
            try:
                body = text_body.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise APIError(400, f"{_name(index, lines)}: {text_body!r} is not encodable "
                                    "as UTF-8") from None
            batch.add(message_id.encode("ascii"), body, None, None)
            continue
        if not isinstance(value, dict):
            raise APIError(400, f"{_name(index, lines)} must be a JSON object")
        try:
            body = fields.message_body(value)
            given, headers, ttl, wait = fields.publish_options(value, limits)
        except APIError as e:
            raise APIError(e.status, f"{_name(index, lines)}: {e.message}") from None
        batch.durable = batch.durable or wait
        if given is None:
            ids.append(fresh[32 * index:32 * index + 32])
            given = ids[-1].encode("ascii")
        else:
            ids.append(text(given))
        batch.add(given, body, headers, ttl)
    return batch


def _batch(call: Call) -> Batch:
    """The request's batch, by its Content-Type: NDJSON, or JSON (the default)."""
    kind = (call.request.getHeader(b"content-type") or b"").decode("latin-1")
    ndjson = kind.split(";")[0].strip().lower() == NDJSON_TYPE
    if not ndjson and not call.is_json():
        raise APIError(400, f"a batch is {JSON_TYPE} (an array) or {NDJSON_TYPE}, "
                            f"not {kind!r}")
    durable = fields.boolean({"durable": call.query("durable")}, "durable")
    return parse(call.body(), ndjson, call.api.max_batch, call.api.limits, durable)


def _publish_runs(call: Call, batch: Batch, publish: Any, target: bytes) -> Any:
    """Each run of ``batch`` through ``publish``; the last result.

    A full ``reject-publish`` queue is a 507 that says how many went in:
    checking every message first cannot foresee it (room is only known as
    each message goes in), and what went in stays, as with single publishes.
    """
    refuse_during_alarm(call)
    result = None
    done = 0
    try:
        for headers, ttl, entries in batch.runs:
            result = publish(target, entries, headers, ttl, "http")
            done += len(entries)
    except QueueFullError as e:
        stored = done + e.stored
        raise APIError(507, f"{e}: messages 0 to {stored - 1} were published, message "
                            f"{stored} and the rest were not" if stored else
                            f"{e}: no message was published") from None
    return result


def publish_to_queue_batch(call: Call) -> Any:
    queue = call.queue()
    batch = _batch(call)
    _publish_runs(call, batch, call.broker.publish_to_queue_run, queue.name)
    answer = {"queue": text(queue.name), "count": len(batch.ids),
              "ids": batch.ids}
    return after_durable(call, batch.durable, answer, "the messages")


def publish_event_batch(call: Call) -> Any:
    event = call.params["event"]
    batch = _batch(call)
    queues = _publish_runs(call, batch, call.broker.publish_event_run, event)
    answer = {"event": text(event), "count": len(batch.ids),
              "ids": batch.ids, "queues": queues or 0}
    return after_durable(call, batch.durable, answer, "the messages")


_BATCH_IN = {
    "type": "array",
    "items": {"type": "object", "properties": {
        **MESSAGE_IN["properties"],
        "durable": {"type": "boolean",
                    "description": "true on any message makes the whole batch wait"}}},
    "description": f"A JSON array, or {NDJSON_TYPE} (one message object a line).  At most "
                   "--http-max-batch messages (default 10,000).  Validated whole before "
                   "anything is published: a bad message refuses the batch.",
}
_DURABLE_QUERY = {"durable": ({"type": "boolean", "default": False},
                              "answer once the storage made every message durable")}
_IDS = {"type": "array", "items": {"type": "string"}, "description": "in request order"}

ROUTES = [
    Route("POST", "/api/queues/{queue}/messages/batch", publish_to_queue_batch,
          "Publish many messages to a queue in one request (JSON array or NDJSON)",
          "messages", body=_BATCH_IN, status=201, query=_DURABLE_QUERY,
          returns={"type": "object", "properties": {
              "queue": {"type": "string"}, "count": {"type": "integer"}, "ids": _IDS,
              "durable": {"type": "boolean"}}},
          errors=(400, 401, 404, 413, 503, 507)),
    Route("POST", "/api/events/{event}/batch", publish_event_batch,
          "Publish many messages to an event in one request (JSON array or NDJSON)",
          "messages", body=_BATCH_IN, status=201, query=_DURABLE_QUERY,
          returns={"type": "object", "properties": {
              "event": {"type": "string"}, "count": {"type": "integer"}, "ids": _IDS,
              "queues": {"type": "integer", "description": "how many queues each went to"},
              "durable": {"type": "boolean"}}},
          errors=(400, 401, 413, 503, 507)),
]
