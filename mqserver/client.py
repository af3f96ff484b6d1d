# -*- test-case-name: tests.unit.test_client -*-
"""``HTTPClient``: the HTTP API from Twisted code, with treq; every method returns a Deferred.

    from mqserver.client import HTTPClient

    client = HTTPClient("http://127.0.0.1:8080", token="s3cret")
    yield client.create_queue("jobs", dead_letter="jobs.dead", default_ttl=3600)
    yield client.publish("jobs", b"payload", headers={"kind": "resize"}, durable=True)
    yield client.publish_many("jobs", [b"one", b"two", {"body": "three", "ttl": 60}])
    batch = yield client.consume("jobs", consumer="worker-1", max=10, timeout=5)
    yield client.ack("jobs", "worker-1", [m["id"] for m in batch["messages"]])
    yield client.move("jobs.dead", "jobs")  # replay the dead letters after a fix

Names are text; message bodies are bytes (sent base64) or text.  Errors
raise ``APIError`` with the server's status and message.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

import treq
from twisted.internet.defer import Deferred, inlineCallbacks


class APIError(Exception):
    """The server answered with an error status (its JSON ``error`` is the message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _segment(name: str) -> str:
    return quote(name, safe="")


def _message(body: bytes | str, message_id: str | None, headers: dict[str, str] | None,
             ttl: float | None, durable: bool) -> dict[str, Any]:
    obj: dict[str, Any] = (
        {"body_base64": base64.b64encode(body).decode("ascii")} if isinstance(body, bytes)
        else {"body": body}
    )
    if message_id is not None:
        obj["id"] = message_id
    if headers:
        obj["headers"] = headers
    if ttl is not None:
        obj["ttl"] = ttl
    if durable:
        obj["durable"] = True
    return obj


Many = Iterable[bytes | str | dict[str, Any]]
"""Messages for ``publish_many``: bodies, or dicts of ``body`` (bytes or text) and
optionally ``id``, ``headers`` and ``ttl``."""

BATCH_SIZE = 1000
"""Messages per request of ``publish_many`` (the server takes up to ``--http-max-batch``)."""


def _batch_entry(item: bytes | str | dict[str, Any], headers: dict[str, str] | None,
                 ttl: float | None) -> dict[str, Any]:
    if not isinstance(item, dict):
        return _message(item, None, headers, ttl, False)
    return _message(item["body"], item.get("id"), item.get("headers", headers),
                    item.get("ttl", ttl), False)


def body_of(message: dict[str, Any]) -> bytes:
    """The bytes of a message as the API returns it (peek, consume)."""
    return base64.b64decode(message["body_base64"])


class HTTPClient:
    """The mqserver HTTP API.

    :param base_url: e.g. ``http://127.0.0.1:8080``.
    :param token: the server's ``--http-token`` (everything), or its
        ``--http-read-token`` (peeking and listing connections too); without
        one only health, metrics and queue statistics answer.
    :param http: what makes the requests: ``treq`` itself by default (its
        shared connection pool), a ``treq.client.HTTPClient`` with a pool of
        its own, or a ``treq.testing.StubTreq`` in tests.
    """

    def __init__(self, base_url: str, token: str | None = None, http: Any = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.http = http if http is not None else treq

    @inlineCallbacks
    def request(self, method: str, path: str, json: Any = None,
                params: dict[str, Any] | None = None) -> Any:
        """One call: the decoded JSON body (text for non-JSON answers) or APIError."""
        headers = {"Accept": ["application/json"]}
        if self.token is not None:
            headers["Authorization"] = [f"Bearer {self.token}"]
        kwargs: dict[str, Any] = {"headers": headers}
        if json is not None:
            kwargs["json"] = json
        if params:
            kwargs["params"] = {k: str(v) for k, v in params.items() if v is not None}
        response = yield self.http.request(method, self.base_url + path, **kwargs)
        kind = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        if kind.startswith(b"application/json"):
            result = yield treq.json_content(response)
        else:
            result = yield treq.text_content(response)
        if response.code >= 400:
            message = result.get("error", "") if isinstance(result, dict) else str(result)
            raise APIError(response.code, message)
        return result

    # -- status ---------------------------------------------------------------

    def health(self) -> Deferred[Any]:
        return self.request("GET", "/health")

    def stats(self) -> Deferred[Any]:
        """Totals: queues, ready and in-flight messages, rates, connections by protocol."""
        return self.request("GET", "/api/overview")

    def metrics(self) -> Deferred[Any]:
        """The Prometheus text."""
        return self.request("GET", "/metrics")

    def connections(self, protocol: str | None = None) -> Deferred[Any]:
        return self.request("GET", "/api/connections", params={"protocol": protocol})

    def close_connection(self, connection_id: int, reason: str | None = None) -> Deferred[Any]:
        return self.request("DELETE", f"/api/connections/{connection_id}",
                            json={"reason": reason} if reason else None)

    def consumers(self, queue: str | None = None) -> Deferred[Any]:
        return self.request("GET", "/api/consumers", params={"queue": queue})

    # -- queues ---------------------------------------------------------------

    def queues(self, prefix: str | None = None) -> Deferred[Any]:
        return self.request("GET", "/api/queues", params={"prefix": prefix})

    def queue(self, name: str) -> Deferred[Any]:
        return self.request("GET", f"/api/queues/{_segment(name)}")

    def create_queue(self, name: str, dead_letter: str | None = None,
                     max_length: int | None = None, default_ttl: float | None = None,
                     bindings: list[str] | None = None) -> Deferred[Any]:
        """Create ``name`` (or set the options given on an existing queue)."""
        obj: dict[str, Any] = {}
        for key, value in (("dead_letter", dead_letter), ("max_length", max_length),
                           ("default_ttl", default_ttl), ("bindings", bindings)):
            if value is not None:
                obj[key] = value
        return self.request("PUT", f"/api/queues/{_segment(name)}", json=obj)

    def delete_queue(self, name: str) -> Deferred[Any]:
        return self.request("DELETE", f"/api/queues/{_segment(name)}")

    def purge(self, name: str) -> Deferred[Any]:
        return self.request("POST", f"/api/queues/{_segment(name)}/purge")

    def bindings(self, name: str) -> Deferred[Any]:
        return self.request("GET", f"/api/queues/{_segment(name)}/bindings")

    def change_bindings(self, name: str, add: Sequence[str] = (), remove: Sequence[str] = (),
                        remove_masks: Sequence[str] = (),
                        replace: Sequence[str] | None = None) -> Deferred[Any]:
        """Replace, then remove, then remove by mask, then add (masks: ``*``)."""
        obj: dict[str, Any] = {"add": list(add), "remove": list(remove),
                               "remove_masks": list(remove_masks)}
        if replace is not None:
            obj["replace"] = list(replace)
        return self.request("POST", f"/api/queues/{_segment(name)}/bindings", json=obj)

    def bind(self, name: str, event: str) -> Deferred[Any]:
        return self.request("PUT", f"/api/queues/{_segment(name)}/bindings/{_segment(event)}")

    def unbind(self, name: str, event: str) -> Deferred[Any]:
        return self.request("DELETE", f"/api/queues/{_segment(name)}/bindings/{_segment(event)}")

    # -- messages -------------------------------------------------------------

    def publish(self, queue: str, body: bytes | str, message_id: str | None = None,
                headers: dict[str, str] | None = None, ttl: float | None = None,
                durable: bool = False) -> Deferred[Any]:
        """Append to one queue; with ``durable`` it fires once the storage has it."""
        return self.request("POST", f"/api/queues/{_segment(queue)}/messages",
                            json=_message(body, message_id, headers, ttl, durable))

    def publish_event(self, event: str, body: bytes | str, message_id: str | None = None,
                      headers: dict[str, str] | None = None, ttl: float | None = None,
                      durable: bool = False) -> Deferred[Any]:
        """Copy into every queue bound to ``event``; the answer says how many."""
        return self.request("POST", f"/api/events/{_segment(event)}",
                            json=_message(body, message_id, headers, ttl, durable))

    def publish_many(self, queue: str, messages: Many, headers: dict[str, str] | None = None,
                     ttl: float | None = None, durable: bool = False,
                     batch_size: int = BATCH_SIZE) -> Deferred[Any]:
        """Append ``messages`` to one queue, ``batch_size`` per request (one broker run
        each); ``headers`` and ``ttl`` apply to those that do not give their own.

        Fires with ``{"queue", "count", "ids", "durable"}``, the ids in order;
        with ``durable``, once the storage has every message.  A request the
        server refuses (400, 413, 507) raises ``APIError``; the requests
        before it were published.
        """
        return self._publish_many(f"/api/queues/{_segment(queue)}/messages/batch", messages,
                                  headers, ttl, durable, batch_size)

    def publish_event_many(self, event: str, messages: Many,
                           headers: dict[str, str] | None = None, ttl: float | None = None,
                           durable: bool = False,
                           batch_size: int = BATCH_SIZE) -> Deferred[Any]:
        """``publish_many`` to an event: ``{"event", "count", "ids", "queues", "durable"}``."""
        return self._publish_many(f"/api/events/{_segment(event)}/batch", messages,
                                  headers, ttl, durable, batch_size)

    @inlineCallbacks
    def _publish_many(self, path: str, messages: Many, headers: dict[str, str] | None,
                      ttl: float | None, durable: bool, batch_size: int) -> Any:
        entries = [_batch_entry(item, headers, ttl) for item in messages]
        params = {"durable": "true"} if durable else None
        answer: dict[str, Any] = {}
        ids: list[str] = []
        for start in range(0, max(len(entries), 1), batch_size):
            answer = yield self.request("POST", path, json=entries[start:start + batch_size],
                                        params=params)
            ids.extend(answer["ids"])
        answer.update(count=len(ids), ids=ids)
        return answer

    def peek(self, queue: str, limit: int = 10) -> Deferred[Any]:
        return self.request("GET", f"/api/queues/{_segment(queue)}/messages",
                            params={"limit": limit})

    def consume(self, queue: str, consumer: str | None = None, max: int = 1,
                timeout: float = 0, lease: float = 30) -> Deferred[Any]:
        """Long-poll: ``{"consumer", "messages": [...]}``; reuse ``consumer`` to ack."""
        obj: dict[str, Any] = {"max": max, "timeout": timeout, "lease": lease}
        if consumer is not None:
            obj["consumer"] = consumer
        return self.request("POST", f"/api/queues/{_segment(queue)}/consume", json=obj)

    def ack(self, queue: str, consumer: str, ids: Sequence[str]) -> Deferred[Any]:
        """Ack many deliveries in one request (one broker run):
        ``{"settled": [...], "unknown": [...]}``, at most ``--http-max-batch`` ids."""
        return self.request("POST", f"/api/queues/{_segment(queue)}/ack",
                            json={"consumer": consumer, "ids": list(ids)})

    def reject(self, queue: str, consumer: str, ids: Sequence[str]) -> Deferred[Any]:
        return self.request("POST", f"/api/queues/{_segment(queue)}/reject",
                            json={"consumer": consumer, "ids": list(ids)})

    def move(self, queue: str, to: str, limit: int | None = None,
             keep_dead_letter_headers: bool = False) -> Deferred[Any]:
        """Move ``queue``'s oldest ready messages (all, or ``limit``) to the existing ``to``.

        Fires once the move is durable: ``{"moved", "left", "stopped", ...}``,
        where ``stopped`` is ``"target full"`` if ``to`` reached its max_length.
        The common case, after a fix: ``client.move("jobs.dead", "jobs")``.
        """
        obj: dict[str, Any] = {"to": to}
        if limit is not None:
            obj["limit"] = limit
        if keep_dead_letter_headers:
            obj["keep_dead_letter_headers"] = True
        return self.request("POST", f"/api/queues/{_segment(queue)}/move", json=obj)
