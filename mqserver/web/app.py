# -*- test-case-name: tests.unit.test_web_api -*-
"""The HTTP API as a twisted.web site: one leaf resource, a route table, JSON errors.

twisted.web rather than klein: the API is a dozen routes over one broker,
and a leaf ``Resource`` with a route table gives full control over what
every error looks like (JSON, never an HTML 404 or 500 page), over the
request body (counted and capped as it arrives, see ``LimitedRequest``) and
over long polls, with no dependency beyond Twisted itself.
"""

from __future__ import annotations

import hmac
import io
import json
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import CancelledError, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.resource import Resource

from mqserver.limits import Limits
from mqserver.web.consumers import HTTPConsumers
from mqserver.web.fields import check_params
from mqserver.web.router import JSON_TYPE, OPEN, WRITE, APIError, Call, Reply, Route, Router
from mqserver.web.views import RateSampler

log = Logger()

DEFAULT_MAX_BODY = 16 * 1024 * 1024
DEFAULT_MAX_BATCH = 10_000
"""Messages one batch publish may carry, and ids one ack or reject may list."""


@dataclass
class WebAPI:
    """What every handler may use: the broker and the state the web face keeps."""

    broker: Any
    token: str | None = None
    read_token: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    max_batch: int = DEFAULT_MAX_BATCH
    storage_name: str = "memory"
    started_at: float = 0.0
    sampler: RateSampler = field(default_factory=RateSampler)
    consumers: Any = None
    registry: Any = None
    limits: Limits = field(default_factory=Limits)


def all_routes() -> list[Route]:
    from mqserver.web import (
        batches,
        connections,
        dashboard,
        messages,
        metrics,
        moves,
        openapi,
        queues,
    )

    return [
        *dashboard.ROUTES, *metrics.ROUTES, *openapi.ROUTES, *connections.ROUTES,
        *queues.ROUTES, *messages.ROUTES, *batches.ROUTES, *moves.ROUTES,
    ]


class APIResource(Resource):
    """Answers every path: routes the request, checks the token, writes JSON.

    Who may call what is the route's ``needs``: ``OPEN`` routes answer
    anyone, ``READ`` ones (message bodies, client addresses) want the token
    or the read token, ``WRITE`` ones the token.
    """

    isLeaf = True

    def __init__(self, api: WebAPI, routes: list[Route] | None = None) -> None:
        super().__init__()
        self.api = api
        self.router = Router(routes if routes is not None else all_routes())

    def render(self, request: server.Request) -> Any:
        method = request.method.decode("ascii", "replace").upper()
        gone: list[bool] = []
        try:
            route, params = self.router.match(method, list(request.postpath))
            check_params(self.api.limits, params)
            if route.needs != OPEN:
                self._authorize(request, route.needs)
        except APIError as e:
            self._error(request, e)
            return server.NOT_DONE_YET
        d = maybeDeferred(route.handler, Call(self.api, request, params))
        request.notifyFinish().addErrback(lambda _: (gone.append(True), d.cancel()))
        d.addCallback(self._reply, request, route, gone)
        d.addErrback(self._failed, request, route, gone)
        return server.NOT_DONE_YET

    def _authorize(self, request: server.Request, needs: str) -> None:
        tokens = [self.api.token]
        if needs != WRITE:
            tokens.append(self.api.read_token)
        tokens = [t for t in tokens if t is not None]
        if not tokens:
            what = "changes are" if needs == WRITE else "reading messages and connections is"
            options = "--http-token or --http-token-file" if needs == WRITE else \
                "--http-token or --http-read-token (or their -file forms)"
            raise APIError(401, f"{what} disabled: start the server with {options} to allow it",
                           {"WWW-Authenticate": 'Bearer realm="mqserver"'})
        # bytes, not str: twisted.web decodes a str-keyed header as strict UTF-8,
        # so a client's non-UTF-8 header would be a 500 instead of a 401
        given = request.getHeader(b"authorization") or b""
        scheme, _, value = given.partition(b" ")
        value = value.strip()
        # every token compared, in constant time each: which one matched leaks nothing
        matches = [hmac.compare_digest(value, t.encode("utf-8")) for t in tokens]
        if scheme.lower() != b"bearer" or not any(matches):
            raise APIError(401, "missing or wrong bearer token",
                           {"WWW-Authenticate": 'Bearer realm="mqserver", error="invalid_token"'})

    def _reply(self, result: Any, request: server.Request, route: Route, gone: list[bool]) -> None:
        if gone:
            return
        reply = result if isinstance(result, Reply) else Reply(200, result)
        for name, value in reply.headers.items():
            request.setHeader(name, value)
        if reply.content_type == JSON_TYPE and not isinstance(reply.body, bytes):
            body = json.dumps(reply.body, separators=(",", ":")).encode("ascii")
        else:
            body = reply.body
        self._send(request, reply.status, body, reply.content_type)

    def _failed(self, failure: Failure, request: server.Request, route: Route,
                gone: list[bool]) -> None:
        if gone or failure.check(CancelledError):
            return
        if failure.check(APIError):
            self._error(request, failure.value)
            return
        log.failure("HTTP {method} {path} failed", failure, method=route.method,
                    path=request.path)
        self._error(request, APIError(500, "internal error; the server log has the details"))

    def _error(self, request: server.Request, error: APIError) -> None:
        for name, value in error.headers.items():
            request.setHeader(name, value)
        body = json.dumps({"error": error.message, "status": error.status}).encode("ascii")
        self._send(request, error.status, body, JSON_TYPE)

    def _send(self, request: server.Request, status: int, body: bytes, kind: str) -> None:
        request.setResponseCode(status)
        request.setHeader("content-type", kind)
        request.setHeader("cache-control", "no-store")
        request.setHeader("x-content-type-options", "nosniff")
        request.setHeader("content-length", str(len(body)).encode("ascii"))
        request.write(body)
        request.finish()


class LimitedRequest(server.Request):
    """Keeps at most the site's ``max_body`` bytes of a request body in memory.

    twisted.web would buffer any body (in a temporary file past 100 kB)
    before the resource sees it; here the excess is counted and dropped as it
    arrives and the resource answers 413.
    """

    body_too_large = False
    _received = 0

    def _limit(self) -> int:
        return getattr(getattr(self.channel, "site", None), "max_body", DEFAULT_MAX_BODY)

    def gotLength(self, length: int | None) -> None:
        self.content = io.BytesIO()
        if length is not None and length > self._limit():
            self.body_too_large = True

    def handleContentChunk(self, data: bytes) -> None:
        self._received += len(data)
        if self._received > self._limit():
            self.body_too_large = True
        if not self.body_too_large:
            self.content.write(data)


class APISite(server.Site):
    """The site: LimitedRequest bodies, no access log (the dashboard polls every second)."""

    requestFactory = LimitedRequest
    noisy = False

    def __init__(self, api: WebAPI, resource: Resource) -> None:
        # twisted.web must not parse form bodies: every body here is JSON or raw, and
        # its Content-Type parser raises out of dataReceived on a header holding a
        # form feed (found by tests/fuzz/fuzz_http.py).  A class attribute on the
        # request would not do: Request.__init__ sets it from the site.
        super().__init__(resource, parsePOSTFormSubmission=False)
        self.api = api
        self.max_body = api.max_body

    def log(self, request: server.Request) -> None:
        """No access log: a polling dashboard would drown the broker's own log."""

    def stopFactory(self) -> None:
        self.api.consumers.close_all("server stopping")
        super().stopFactory()


def build_site(
    broker: Any,
    token: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    storage_name: str = "memory",
    limits: Limits | None = None,
    read_token: str | None = None,
    routes: list[Route] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> APISite:
    """The HTTP face of ``broker``, ready for ``endpoint.listen``.

    ``token`` allows everything; ``read_token`` only the reads that show
    message bodies and client addresses (see ``mqserver.web.router.READ``).
    ``routes`` (default: all) narrows what it serves, e.g. the ``--metrics``
    listener's ``/health`` and ``/metrics``.
    """
    from mqserver.web.metrics import make_registry

    api = WebAPI(
        broker=broker,
        token=token or None,
        read_token=read_token or None,
        max_body=max_body,
        max_batch=max_batch,
        storage_name=storage_name,
        started_at=broker.clock.seconds(),
        limits=limits or Limits(),
    )
    api.consumers = HTTPConsumers(broker)
    api.registry = make_registry(broker, storage_name)
    return APISite(api, APIResource(api, routes))
