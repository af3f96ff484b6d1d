# -*- test-case-name: tests.unit.test_web_api -*-
"""Routes of the HTTP API and the per-request ``Call`` handlers receive.

A route table (rather than a tree of ``Resource`` children) lets one leaf
resource answer every path, so unknown paths, wrong methods and bad bodies
all get the same JSON errors, and lets ``openapi.py`` document exactly the
routes that exist.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twisted.web.server import Request

    from mqserver.web.app import WebAPI

JSON_TYPE = "application/json"

OPEN = "open"
"""Anyone who reaches the port: health, metrics, the dashboard's files, queue stats."""
READ = "read"
"""A read that shows message bodies or client addresses: the token or the read token."""
WRITE = "write"
"""A change: the token (``--http-token``) only."""


class APIError(Exception):
    """An error answer: ``status`` with ``{"error": message}`` as its body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Reply:
    """A handler's answer when 200 with a JSON body is not what it means."""

    status: int = 200
    body: Any = None
    content_type: str = JSON_TYPE
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[["Call"], Any]


@dataclass(frozen=True)
class Route:
    """One method on one path pattern; ``{name}`` segments are parameters.

    ``body`` and ``returns`` are JSON Schema fragments for ``/openapi.json``;
    ``query`` maps query parameters to (schema, description).  ``access``
    says who may call it (``needs``): left out, a read needs a token, so a
    new route is closed unless it is marked ``OPEN`` on purpose.
    """

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: dict[str, Any] | None = None
    returns: dict[str, Any] | None = None
    query: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    status: int = 200
    content_type: str = JSON_TYPE
    access: str | None = None

    @property
    def mutating(self) -> bool:
        return self.method not in ("GET", "HEAD")

    @property
    def needs(self) -> str:
        """``OPEN``, ``READ`` or ``WRITE``: every change is ``WRITE``, whatever ``access`` says."""
        if self.mutating:
            return WRITE
        return self.access if self.access is not None else READ

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.strip("/").split("/")) if self.path != "/" else ()


class Router:
    """Matches a method and decoded path segments against the routes."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes

    def match(self, method: str, segments: list[bytes]) -> tuple[Route, dict[str, bytes]]:
        """The route and its path parameters; APIError 404 or 405 when none fits."""
        allowed: list[str] = []
        if segments and segments[-1] == b"":
            segments = segments[:-1]  # "/" and a trailing slash
        for route in self.routes:
            params = _match_segments(route.segments, segments)
            if params is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, params
            allowed.append(route.method)
        if allowed:
            raise APIError(
                405,
                f"{method} is not allowed here; allowed: {', '.join(sorted(set(allowed)))}",
                {"Allow": ", ".join(sorted(set(allowed)))},
            )
        raise APIError(404, "no such endpoint: " + method + " /" + _path_text(segments))


def _match_segments(pattern: tuple[str, ...], segments: list[bytes]) -> dict[str, bytes] | None:
    if len(pattern) != len(segments):
        return None
    params: dict[str, bytes] = {}
    for want, got in zip(pattern, segments, strict=True):
        if want.startswith("{"):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want.encode("ascii") != got:
            return None
    return params


def _path_text(segments: list[bytes]) -> str:
    return "/".join(s.decode("utf-8", "replace") for s in segments)


def text(value: bytes) -> str:
    """Broker bytes as JSON text; ``surrogateescape`` keeps non-UTF-8 names reversible."""
    return value.decode("utf-8", "surrogateescape")


def raw(value: str) -> bytes:
    """The inverse of ``text``; a lone surrogate it cannot have made is a 400."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise APIError(400, f"{value!r} is not encodable as UTF-8") from None


class Call:
    """What a handler gets: the API state, path parameters, and the request's body."""

    def __init__(self, api: WebAPI, request: Request, params: dict[str, bytes]) -> None:
        self.api = api
        self.broker = api.broker
        self.request = request
        self.params = params
        self._json: Any = None

    def body(self) -> bytes:
        """The request body; 413 if it is over ``--http-max-body``."""
        limit = self.api.max_body
        if getattr(self.request, "body_too_large", False):
            raise APIError(413, f"request body is larger than {limit} bytes")
        content = self.request.content
        if content is None:
            return b""
        content.seek(0)
        data = content.read(limit + 1)
        if len(data) > limit:
            raise APIError(413, f"request body is larger than {limit} bytes")
        return data

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (an empty body is ``{}``); 400 otherwise."""
        if self._json is None:
            data = self.body()
            if not data.strip():
                self._json = {}
            else:
                try:
                    value = json.loads(data)
                except (ValueError, RecursionError) as e:  # deep nesting: RecursionError
                    raise APIError(400, f"request body is not valid JSON: {e}") from None
                if not isinstance(value, dict):
                    raise APIError(400, "request body must be a JSON object")
                self._json = value
        return self._json

    def is_json(self) -> bool:
        """Whether the client sent JSON (or did not say): other types are raw bodies."""
        # a bytes key: a str one makes twisted.web decode strict UTF-8 (a 500 on junk)
        raw_kind = self.request.getHeader(b"content-type")
        if not raw_kind:
            return True
        kind = raw_kind.decode("latin-1").split(";")[0].strip().lower()
        return kind == JSON_TYPE or kind.endswith("+json")

    def query(self, name: str) -> str | None:
        values = self.request.args.get(name.encode("ascii"))
        return values[0].decode("utf-8", "replace") if values else None

    def peer(self) -> str:
        address = self.request.getClientAddress()
        return f"{getattr(address, 'host', address)}:{getattr(address, 'port', '')}"

    def queue(self, param: str = "queue") -> Any:
        """The queue the path names; 404 if there is none."""
        name = self.params[param]
        queue = self.broker.queues.get(name)
        if queue is None:
            raise APIError(404, f"no queue {text(name)!r}")
        return queue
