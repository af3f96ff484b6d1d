# -*- test-case-name: tests.unit.web.test_web_moves -*-
"""``POST /api/queues/{queue}/move``: ready messages to another queue (an operator's replay).

The broker does the move (``mqserver.broker.moving``), a chunk per
reactor turn; this answers once the last chunk has moved and the storage
has made it durable, so a 200 means a crash can no longer undo it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from mqserver.broker.moving import MoveError, MoveResult
from mqserver.web import fields
from mqserver.web.router import APIError, Call, Route, text

MAX_MOVE = 2**62


def move(call: Call) -> Any:
    source = call.queue()
    obj = call.json()
    target = fields.checked(obj, "to", call.api.limits)
    if target is None:
        raise APIError(400, "'to' (the queue to move the messages to) is required")
    if target not in call.broker.queues:
        raise APIError(404, f"no queue {text(target)!r} to move to (create it first)")
    limit = fields.number(obj, "limit", None, 1, MAX_MOVE, integer=True)
    keep = fields.boolean(obj, "keep_dead_letter_headers")
    try:
        moving = call.broker.move(source.name, target, limit, keep)
    except MoveError as e:
        raise APIError(400, str(e)) from None
    broker = call.broker

    def durable(result: MoveResult) -> Deferred[Any]:
        answer = {"from": text(source.name), "to": text(target), "moved": result.moved,
                  "left": result.left, "stopped": result.stopped,
                  "durable": broker.writer is not None}

        def failed(failure: Any) -> None:
            raise APIError(503, "storage failed: the move is done in memory and the storage "
                                f"retries it, but it is not durable yet: "
                                f"{failure.getErrorMessage()}")

        return broker.durable().addCallbacks(lambda _: answer, failed)

    return moving.addCallback(durable)


ROUTES = [
    Route("POST", "/api/queues/{queue}/move", move,
          "Move the oldest ready messages (all, or the first limit) to another queue; "
          "answers once durable", "messages",
          body={"type": "object", "required": ["to"], "properties": {
              "to": {"type": "string", "description": "an existing queue, not this one"},
              "limit": {"type": "integer", "minimum": 1,
                        "description": "at most this many (absent: all ready messages)"},
              "keep_dead_letter_headers": {
                  "type": "boolean", "default": False,
                  "description": "keep x-dead-letter-reason and x-dead-letter-queue"}}},
          returns={"type": "object", "properties": {
              "from": {"type": "string"}, "to": {"type": "string"},
              "moved": {"type": "integer"},
              "left": {"type": "integer", "description": "ready messages left in this queue"},
              "stopped": {"enum": ["target full", "queue deleted", None],
                          "description": "why fewer than asked moved: the target is at its "
                                         "max_length (a move never drops messages), or a "
                                         "queue was deleted meanwhile"},
              "durable": {"type": "boolean",
                          "description": "a durable storage has the move on disk"}}},
          errors=(400, 401, 404, 413, 503)),
]
