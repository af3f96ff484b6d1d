# -*- test-case-name: tests.unit.test_web_api -*-
"""Connection and consumer endpoints: list them, close one, see the totals."""

from __future__ import annotations

from typing import Any

from mqserver.interfaces import IClientConnection
from mqserver.web import fields
from mqserver.web.router import OPEN, APIError, Call, Route
from mqserver.web.views import connection_view, consumer_view, overview


def list_connections(call: Call) -> Any:
    broker = call.broker
    now = broker.clock.seconds()
    protocol = call.query("protocol")
    return {
        "connections": [
            connection_view(c, now) for c in broker.connections.values()
            if protocol is None or c.protocol == protocol
        ]
    }


def _connection(call: Call) -> Any:
    number = fields.number({"id": call.params["id"].decode("ascii", "replace")}, "id",
                           integer=True)
    connection = call.broker.connections.get(number)
    if connection is None:
        raise APIError(404, f"no connection {number}")
    return connection


def get_connection(call: Call) -> Any:
    return connection_view(_connection(call), call.broker.clock.seconds())


def close_connection(call: Call) -> Any:
    connection = _connection(call)
    client = IClientConnection(connection.sink, None)
    if client is None:
        raise APIError(409, f"a {connection.protocol} connection cannot be closed from here")
    reason = fields.string(call.json() if call.is_json() else {}, "reason") or \
        f"closed through the HTTP API by {call.peer()}"
    client.close(reason)
    return {"closed": connection.id, "protocol": connection.protocol}


def list_consumers(call: Call) -> Any:
    queue = call.query("queue")
    views = [
        consumer_view(consumer)
        for connection in call.broker.connections.values()
        for consumer in connection.consumers.values()
    ]
    if queue is not None:
        views = [v for v in views if v["queue"] == queue]
    return {"consumers": views}


def get_overview(call: Call) -> Any:
    api = call.api
    return overview(call.broker, api.sampler, call.broker.clock.seconds(), api.started_at,
                    api.storage_name)


_CONNECTION = {"$ref": "#/components/schemas/Connection"}

ROUTES = [
    Route("GET", "/api/overview", get_overview,
          "Totals: queues, messages, rates, connections by protocol, storage", "status",
          returns={"type": "object"}, access=OPEN),
    Route("GET", "/api/connections", list_connections,
          "Client connections of every protocol with their peers and consumers (read token)",
          "connections",
          query={"protocol": ({"type": "string"}, "only this protocol (mqks, phpmq, http...)")},
          returns={"type": "object", "properties": {
              "connections": {"type": "array", "items": _CONNECTION}}}),
    Route("GET", "/api/connections/{id}", get_connection, "One connection (read token)",
          "connections",
          returns=_CONNECTION, errors=(400, 404)),
    Route("DELETE", "/api/connections/{id}", close_connection,
          "Close a client connection; its unacked messages go back to their queues",
          "connections",
          body={"type": "object", "properties": {"reason": {"type": "string"}}},
          returns={"type": "object", "properties": {
              "closed": {"type": "integer"}, "protocol": {"type": "string"}}},
          errors=(400, 401, 404, 409)),
    Route("GET", "/api/consumers", list_consumers,
          "Every consumer with credit and unacked counts", "connections",
          query={"queue": ({"type": "string"}, "only consumers of this queue")},
          returns={"type": "object", "properties": {"consumers": {
              "type": "array", "items": {"$ref": "#/components/schemas/Consumer"}}}},
          access=OPEN),
]
