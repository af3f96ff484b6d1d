# -*- test-case-name: tests.unit.test_web_api -*-
"""Queue endpoints: list, detail, create or change options, purge, delete, bindings."""

from __future__ import annotations

import dataclasses
from itertools import islice
from typing import Any

from mqserver.broker.overflow import OVERFLOW_POLICIES
from mqserver.limits import Limits
from mqserver.model import QueueOptions
from mqserver.web import fields
from mqserver.web.router import OPEN, APIError, Call, Reply, Route, raw, text
from mqserver.web.views import queue_view

_QUEUE = {"$ref": "#/components/schemas/Queue"}


def list_queues(call: Call) -> Any:
    broker = call.broker
    api = call.api
    now = broker.clock.seconds()
    prefix = raw(call.query("prefix") or "")
    limit = fields.number({"limit": call.query("limit")}, "limit", 10_000, 1, 1_000_000,
                          integer=True)
    names = sorted(n for n in broker.queues if n.startswith(prefix))
    views = [queue_view(broker, broker.queues[n], api.sampler, now)
             for n in islice(names, limit)]
    if not prefix:
        api.sampler.keep_only({*broker.queues, ""})
    return {"queues": views, "total": len(names)}


def get_queue(call: Call) -> Any:
    return queue_view(call.broker, call.queue(), call.api.sampler,
                      call.broker.clock.seconds(), detail=True)


def _options(obj: dict[str, Any], current: QueueOptions, limits: Limits) -> QueueOptions:
    """``current`` with the fields ``obj`` mentions (null clears one)."""
    changes: dict[str, Any] = {}
    if "dead_letter" in obj:
        changes["dead_letter"] = fields.checked(obj, "dead_letter", limits)
    if "max_length" in obj:
        changes["max_length"] = fields.number(obj, "max_length", None, 1, 2**62, integer=True)
    if "overflow" in obj:
        policy = fields.string(obj, "overflow")
        if policy is not None and policy not in OVERFLOW_POLICIES:
            raise APIError(400, f"'overflow' must be one of {', '.join(OVERFLOW_POLICIES)}")
        changes["overflow"] = policy
    if "default_ttl" in obj:
        changes["default_ttl"] = fields.number(obj, "default_ttl", None, 0, 10 * 365 * 86400.0) \
            or None
    if "delete_when_unused" in obj:
        changes["delete_when_unused"] = fields.number(obj, "delete_when_unused", None, 0, 86400.0)
        changes["delete_when_unused_bare"] = False
    return dataclasses.replace(current, **changes)


def put_queue(call: Call) -> Any:
    name = call.params["queue"]
    obj = call.json()
    broker = call.broker
    existing = broker.queues.get(name)
    limits = call.api.limits
    options = _options(obj, existing.options if existing is not None else QueueOptions(), limits)
    bindings = fields.names(obj, "bindings", limits) if "bindings" in obj else None
    if existing is None:
        broker.declare_queue(name, options)
    elif options != existing.options:
        broker.reconfigure(name, options=options)
    if bindings is not None:
        _set_bindings(call, name, bindings)
    view = queue_view(broker, broker.queues[name], call.api.sampler, broker.clock.seconds(),
                      detail=True)
    return Reply(201 if existing is None else 200, view)


def _set_bindings(call: Call, name: bytes, events: list[bytes]) -> bool:
    broker = call.broker
    if events:
        return broker.reconfigure(name, replace=events)
    # reconfigure reads an empty ``replace`` as "keep": removing all is explicit
    return broker.reconfigure(name, remove=broker.bindings.events_of(name))


def delete_queue(call: Call) -> Any:
    queue = call.queue()
    call.broker.delete_queue(queue.name)
    return {"deleted": text(queue.name)}


def purge(call: Call) -> Any:
    queue = call.queue()
    return {"queue": text(queue.name), "purged": call.broker.purge(queue.name)}


def _bindings(call: Call, name: bytes, changed: bool | None = None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "queue": text(name),
        "bindings": sorted(text(e) for e in call.broker.bindings.events_of(name)),
    }
    if changed is not None:
        view["changed"] = changed
    return view


def get_bindings(call: Call) -> Any:
    return _bindings(call, call.queue().name)


def change_bindings(call: Call) -> Any:
    name = call.queue().name
    obj = call.json()
    limits = call.api.limits
    replace = fields.names(obj, "replace", limits) if "replace" in obj else None
    remove = fields.names(obj, "remove", limits)
    remove_masks = fields.names(obj, "remove_masks", limits)
    add = fields.names(obj, "add", limits)
    changed = False
    if replace is not None:
        changed = _set_bindings(call, name, replace)
    changed = call.broker.reconfigure(
        name, remove=remove, remove_masks=remove_masks, add=add
    ) or changed
    return _bindings(call, name, changed)


def bind_one(call: Call) -> Any:
    name = call.queue().name
    changed = call.broker.reconfigure(name, add=[call.params["event"]])
    return Reply(201 if changed else 200, _bindings(call, name, changed))


def unbind_one(call: Call) -> Any:
    name = call.queue().name
    event = call.params["event"]
    if event not in call.broker.bindings.events_of(name):
        raise APIError(404, f"queue {text(name)!r} is not bound to {text(event)!r}")
    return _bindings(call, name, call.broker.reconfigure(name, remove=[event]))


_STRINGS = {"type": "array", "items": {"type": "string"}}
_BINDINGS = {"type": "object", "properties": {
    "queue": {"type": "string"}, "bindings": _STRINGS, "changed": {"type": "boolean"}}}
_OPTIONS_IN = {
    "type": "object",
    "description": "Options left out keep their current value (the default for a new "
                   "queue); null clears one.",
    "properties": {
        "dead_letter": {"type": ["string", "null"],
                        "description": "queue that expired and rejected-for-good messages go to"},
        "max_length": {"type": ["integer", "null"], "minimum": 1,
                       "description": "ready messages kept (null: --max-queue-length); what "
                                      "happens beyond is the overflow policy"},
        "overflow": {"enum": ["drop-head", "reject-publish", None],
                     "description": "drop-head: the oldest is dropped or dead-lettered; "
                                    "reject-publish: new publishes get 507 (null: --overflow)"},
        "default_ttl": {"type": ["number", "null"], "description": "seconds"},
        "delete_when_unused": {"type": ["number", "null"],
                               "description": "delete this many seconds after the last "
                                              "consumer leaves"},
        "bindings": {**_STRINGS, "description": "events and masks: replaces all bindings"},
    },
}

ROUTES = [
    Route("GET", "/api/queues", list_queues, "Every queue with depth, counters and rates",
          "queues",
          query={"prefix": ({"type": "string"}, "only queues whose name starts with this"),
                 "limit": ({"type": "integer", "default": 10000}, "at most this many")},
          returns={"type": "object", "properties": {
              "queues": {"type": "array", "items": _QUEUE}, "total": {"type": "integer"}}},
          errors=(400,), access=OPEN),
    Route("GET", "/api/queues/{queue}", get_queue,
          "One queue with its bindings and consumers", "queues", returns=_QUEUE, errors=(404,),
          access=OPEN),
    Route("PUT", "/api/queues/{queue}", put_queue,
          "Create a queue (201) or change its options (200)", "queues",
          body=_OPTIONS_IN, returns=_QUEUE, status=201, errors=(400, 401, 413)),
    Route("DELETE", "/api/queues/{queue}", delete_queue,
          "Delete a queue with its messages, bindings and consumers", "queues",
          returns={"type": "object", "properties": {"deleted": {"type": "string"}}},
          errors=(401, 404)),
    Route("POST", "/api/queues/{queue}/purge", purge, "Drop a queue's ready messages",
          "queues", returns={"type": "object", "properties": {
              "queue": {"type": "string"}, "purged": {"type": "integer"}}},
          errors=(401, 404)),
    Route("GET", "/api/queues/{queue}/bindings", get_bindings,
          "The events and masks a queue is bound to", "bindings", returns=_BINDINGS,
          errors=(404,), access=OPEN),
    Route("POST", "/api/queues/{queue}/bindings", change_bindings,
          "Change bindings: replace, then remove, then remove by mask, then add", "bindings",
          body={"type": "object", "properties": {
              "replace": _STRINGS, "remove": _STRINGS, "add": _STRINGS,
              "remove_masks": {**_STRINGS, "description": "remove bound events with a dot "
                                                          "that match these masks (* = any "
                                                          "run of non-dot characters)"}}},
          returns=_BINDINGS, errors=(400, 401, 404, 413)),
    Route("PUT", "/api/queues/{queue}/bindings/{event}", bind_one,
          "Bind a queue to one event or mask (201 if new)", "bindings", returns=_BINDINGS,
          status=201, errors=(401, 404)),
    Route("DELETE", "/api/queues/{queue}/bindings/{event}", unbind_one,
          "Unbind a queue from one event or mask", "bindings", returns=_BINDINGS,
          errors=(401, 404)),
]
