#!/usr/bin/env python3
"""The HTTP API with treq, raw: what ``mqserver.client.HTTPClient`` wraps.

Creates a queue, publishes a message and then a batch of two (one request,
one broker run), long-polls them as a named consumer, acks all three in one
request and deletes the queue.  It needs only ``treq`` (not mqserver), so it
is also the template for a Twisted service that talks to a broker it does
not ship with.  Changes need the server's ``--http-token``.

    python3 http_client.py [BASE_URL] [--token TOKEN]   # default http://127.0.0.1:8080

Prints ``ok ...`` per step and ``done``; exits 1 on the first unexpected answer.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

import treq
from twisted.internet import task
from twisted.internet.defer import inlineCallbacks


class StepFailedError(Exception):
    """An answer other than the one the step expects."""


@inlineCallbacks
def call(method: str, url: str, token: str | None, json: Any = None) -> Any:
    """One request; the decoded JSON answer, or StepFailedError with the server's own error text
    (every error is JSON ``{"error", "status"}``, so the reason is always printable)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = yield treq.request(method, url, json=json, headers=headers)
    answer = yield response.json()
    if not 200 <= response.code < 300:
        raise StepFailedError(f"{method} {url}: {response.code} {answer}")
    return answer


@inlineCallbacks
def main(reactor: Any, base: str, token: str | None) -> Any:
    queue = f"{base}/api/queues/example-http-{uuid.uuid4().hex[:8]}"
    health = yield call("GET", f"{base}/health", None)
    print(f"ok server is {health['status']}")
    yield call("PUT", queue, token, json={"default_ttl": 3600})
    print("ok queue created")
    published = yield call("POST", f"{queue}/messages", token,
                           json={"body": "hello from treq", "headers": {"kind": "greeting"}})
    print(f"ok published {published['id']}")
    # many at once: a JSON array (or NDJSON), ids answered in order; ?durable=true
    # would answer once the store has them all
    sent = yield call("POST", f"{queue}/messages/batch", token,
                      json=[{"body": "second"}, {"body": "third", "ttl": 60}])
    print(f"ok published a batch of {sent['count']}")
    batch = yield call("POST", f"{queue}/consume", token,
                       json={"consumer": "example-worker", "max": 10, "timeout": 5})
    messages = batch["messages"]
    if [m["body"] for m in messages] != ["hello from treq", "second", "third"] \
            or messages[0]["headers"] != {"kind": "greeting"}:
        raise StepFailedError(f"consumed the wrong messages: {messages}")
    print(f"ok consumed {len(messages)}")
    acked = yield call("POST", f"{queue}/ack", token,
                       json={"consumer": "example-worker", "ids": [m["id"] for m in messages]})
    if len(acked["settled"]) != 3:
        raise StepFailedError(f"not every message was acked: {acked}")
    print("ok acked them")
    yield call("DELETE", queue, token)
    print("ok queue deleted")
    print("done")


def run(reactor: Any, base: str, token: str | None) -> Any:
    """Turn StepFailedError into exit status 1 with its reason, rather than a traceback."""
    d = main(reactor, base.rstrip("/"), token)

    def failed(failure: Any) -> None:
        failure.trap(StepFailedError)
        print(f"FAIL: {failure.value}", file=sys.stderr)
        raise SystemExit(1)

    return d.addErrback(failed)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument("--token", help="the server's --http-token")
    args = parser.parse_args()
    task.react(run, (args.base, args.token))
