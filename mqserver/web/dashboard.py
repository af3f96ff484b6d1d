# -*- test-case-name: tests.unit.test_web_api -*-
"""The dashboard: one static page (package data) that polls the JSON API.

Plain files read once with importlib.resources, so there is no front-end
build step and nothing to install but the wheel.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from mqserver.web.router import OPEN, APIError, Call, Reply, Route

STATIC = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# the page loads only its own script and style, and talks only to this server
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@cache
def _read(name: str) -> bytes:
    return resources.files("mqserver.web").joinpath("static", name).read_bytes()


def index(call: Call) -> Any:
    return Reply(200, _read("index.html"), "text/html; charset=utf-8",
                 {"content-security-policy": POLICY})


def static(call: Call) -> Any:
    name = call.params["file"].decode("utf-8", "replace")
    kind = STATIC.get(name)
    if kind is None:
        raise APIError(404, f"no static file {name!r}")
    return Reply(200, _read(name), kind)


ROUTES = [
    Route("GET", "/", index, "The dashboard (HTML)", "dashboard",
          content_type="text/html", access=OPEN),
    Route("GET", "/static/{file}", static, "The dashboard's script and style sheet",
          "dashboard", content_type="text/javascript", errors=(404,), access=OPEN),
]
