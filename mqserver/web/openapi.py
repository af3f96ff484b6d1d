# -*- test-case-name: tests.unit.test_web_api -*-
"""``/openapi.json``, generated from the route table so it lists exactly what exists."""

from __future__ import annotations

from typing import Any

from mqserver.web.router import JSON_TYPE, OPEN, READ, WRITE, Call, Route

_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_NULLABLE_STR = {"type": ["string", "null"]}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error", "status"],
              "properties": {"error": _STR, "status": _INT}},
    "Queue": {"type": "object", "properties": {
        "name": _STR, "depth": _INT, "in_flight": _INT, "consumers": _INT,
        "oldest_message_age": _NUM, "created_at": _NUM,
        "options": {"type": "object", "properties": {
            "dead_letter": _NULLABLE_STR, "max_length": {"type": ["integer", "null"]},
            "default_ttl": {"type": ["number", "null"]},
            "delete_when_unused": {"type": ["number", "null"]},
            "overflow": {"enum": ["drop-head", "reject-publish", None]}}},
        "counters": {"type": "object", "additionalProperties": _INT},
        "rates": {"type": "object", "description": "per second over the last ~10 s",
                  "properties": {"publish": _NUM, "deliver": _NUM, "ack": _NUM}},
        "bindings": {"type": "array", "items": _STR, "description": "detail only"},
        "consumer_list": {"type": "array", "items": {"$ref": "#/components/schemas/Consumer"},
                          "description": "detail only"}}},
    "Message": {"type": "object", "properties": {
        "id": _STR, "queue": _STR, "seq": _INT, "event": _NULLABLE_STR,
        "headers": {"type": "object", "additionalProperties": _STR}, "retry": _INT,
        "created_at": _NUM, "age": _NUM, "expires_at": {"type": ["number", "null"]},
        "source": _NULLABLE_STR, "size": _INT,
        "body": {"type": ["string", "null"], "description": "null if not UTF-8"},
        "body_base64": _STR}},
    "Consumer": {"type": "object", "properties": {
        "id": _STR, "queue": _STR, "connection": _INT, "protocol": _STR,
        "window": {"type": ["integer", "null"], "description": "null: unlimited"},
        "credit": {"type": ["integer", "null"]}, "has_credit": {"type": "boolean"},
        "unacked": _INT, "delivered": _INT, "acked": _INT, "manual_ack": {"type": "boolean"},
        "priority": _INT}},
    "Connection": {"type": "object", "properties": {
        "id": _INT, "protocol": _STR, "peer": _STR, "opened_at": _NUM, "age": _NUM,
        "paused": {"type": "boolean"}, "closable": {"type": "boolean"}, "unacked": _INT,
        "consumers": {"type": "array", "items": {"$ref": "#/components/schemas/Consumer"}}}},
    "Health": {"type": "object", "properties": {
        "status": {"enum": ["ok", "degraded", "memory_alarm"]}, "uptime": _NUM,
        "memory": {"type": "object", "properties": {
            "alarm": {"type": "boolean"}, "rss_bytes": _INT,
            "high_watermark_bytes": {"type": ["integer", "null"]},
            "low_watermark_bytes": {"type": ["integer", "null"]},
            "paused_publishers": _INT, "alarms": _INT}},
        "storage": {"type": "object", "properties": {
            "backend": _STR, "durable": {"type": "boolean"}, "ok": {"type": "boolean"},
            "last_error": _NULLABLE_STR, "failures": _INT, "batches": _INT,
            "last_batch_ops": _INT, "last_batch_seconds": _NUM, "pending_ops": _INT,
            "store": {"type": "object", "additionalProperties": _NUM}}}}},
}

SECURITY: dict[str, list[dict[str, list[str]]]] = {
    OPEN: [],
    READ: [{"token": []}, {"readToken": []}],
    WRITE: [{"token": []}],
}
"""What each kind of route (``Route.needs``) asks for, as OpenAPI security requirements."""

_ERRORS = {
    400: "bad request: invalid JSON or field",
    401: "bearer token missing or wrong (or no token configured for this)",
    404: "no such queue, connection, consumer or endpoint",
    405: "method not allowed",
    409: "conflict",
    413: "request body over --http-max-body",
    503: "storage failed, too many consumers, or the memory alarm is on (publishing; "
         "retry after Retry-After seconds)",
    507: "a queue the message goes to is full (max_length with overflow reject-publish)",
}


def _operation(route: Route) -> dict[str, Any]:
    content: dict[str, Any] = {route.content_type: {"schema": route.returns or {}}}
    op: dict[str, Any] = {
        "summary": route.summary,
        "tags": [route.tag],
        "operationId": f"{route.method.lower()}_{route.handler.__name__}",
        "responses": {str(route.status): {"description": "success", "content": content}},
    }
    params = [
        {"name": seg[1:-1], "in": "path", "required": True, "schema": _STR}
        for seg in route.segments if seg.startswith("{")
    ]
    params += [{"name": name, "in": "query", "schema": schema, "description": doc}
               for name, (schema, doc) in route.query.items()]
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"content": {JSON_TYPE: {"schema": route.body}}}
    errors = set(route.errors) | {405}
    # each entry is one way in: the token, or (for reads) the read token; [] is open
    op["security"] = SECURITY[route.needs]
    if route.needs != OPEN:
        errors |= {401}
    if route.body is not None:
        errors |= {400, 413}
    for status in sorted(errors):
        op["responses"][str(status)] = {
            "description": _ERRORS.get(status, "error"),
            "content": {JSON_TYPE: {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return op


def spec(routes: list[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mqserver HTTP API",
            "version": "1",
            "description": "Queues, messages, connections and health of one mqserver "
                           "broker.  Names are UTF-8 text.  Changes need the bearer token "
                           "(--http-token); reads that show message bodies or client "
                           "addresses need it or the read token (--http-read-token); health, "
                           "metrics and queue statistics are open.",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "--http-token: every route"},
                "readToken": {"type": "http", "scheme": "bearer",
                              "description": "--http-read-token: reads only"},
            },
        },
    }


def openapi(call: Call) -> Any:
    from mqserver.web.app import all_routes

    return spec(all_routes())


ROUTES = [
    Route("GET", "/openapi.json", openapi, "This document (OpenAPI 3.1)", "status",
          returns={"type": "object"}, access=OPEN),
]
