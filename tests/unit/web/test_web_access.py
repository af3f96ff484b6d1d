"""Who may call what: every route of the router against the rule, so none escapes it.

The rule: health, metrics, the dashboard's files, the API document and queue
statistics are open; a read that shows message bodies or client addresses
needs the token or the read token; every change needs the token.  ``OPEN``
below is the list of open routes, kept here by hand: a new route is closed
unless someone adds it there on purpose, and ``READ`` must list every other
read.
"""

from __future__ import annotations

import pytest

from mqserver.web.app import all_routes
from mqserver.web.router import OPEN as OPEN_ACCESS
from mqserver.web.router import READ as READ_ACCESS
from mqserver.web.router import WRITE as WRITE_ACCESS
from mqserver.web.router import Route

from .conftest import TOKEN

READ_TOKEN = "r3ad-only"

OPEN = {
    ("GET", "/"),
    ("GET", "/static/{file}"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/api/overview"),
    ("GET", "/api/queues"),
    ("GET", "/api/queues/{queue}"),
    ("GET", "/api/queues/{queue}/bindings"),
    ("GET", "/api/consumers"),
}
READ = {
    ("GET", "/api/queues/{queue}/messages"),  # message bodies
    ("GET", "/api/connections"),  # client addresses
    ("GET", "/api/connections/{id}"),
}
PARAMS = {"{queue}": "q", "{event}": "e", "{id}": "1", "{file}": "dashboard.js"}
ROUTES = all_routes()


def expected(route: Route) -> str:
    key = (route.method, route.path)
    if key in OPEN:
        return OPEN_ACCESS
    if key in READ:
        return READ_ACCESS
    assert route.mutating, f"{key} is a read neither OPEN nor READ lists: add it to one"
    return WRITE_ACCESS


def concrete(route: Route) -> str:
    path = route.path
    for name, value in PARAMS.items():
        path = path.replace(name, value)
    return path


def status_with(make_web, route: Route, sent: str | None, **setup) -> int:
    """The status of ``route`` with ``sent`` as the bearer token, on a server made by ``setup``."""
    web = make_web(**setup)
    web.broker.publish_to_queue(b"q", b"m", b"secret body")
    kwargs = {"json": {}} if route.mutating else {}
    pending = web.start(route.method, concrete(route), token=sent, **kwargs)
    web.turn()  # a consume answers after the broker's dispatch turn
    return web.finish(pending)[0]


def test_the_lists_name_only_routes_that_exist():
    routes = {(r.method, r.path) for r in ROUTES}
    assert (OPEN | READ).issubset(routes) and not OPEN & READ


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_every_route_asks_for_what_the_rule_says(make_web, route):
    want = expected(route)
    assert route.needs == want
    setup = {"token": TOKEN, "read_token": READ_TOKEN}
    anyone = status_with(make_web, route, None, **setup)
    wrong = status_with(make_web, route, "wrong", **setup)
    reader = status_with(make_web, route, READ_TOKEN, **setup)
    admin = status_with(make_web, route, TOKEN, **setup)
    assert admin != 401
    if want == OPEN_ACCESS:
        assert 401 not in (anyone, wrong, reader)
    elif want == READ_ACCESS:
        assert (anyone, wrong) == (401, 401) and reader != 401
    else:
        assert (anyone, wrong, reader) == (401, 401, 401)
    # with no token configured, only the open routes answer
    unconfigured = status_with(make_web, route, TOKEN, token=None)
    assert (unconfigured == 401) == (want != OPEN_ACCESS)
    # the token alone (no read token) opens the reads too
    assert (status_with(make_web, route, None, token=TOKEN) == 401) == (want != OPEN_ACCESS)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_the_api_document_says_what_each_route_needs(web, route):
    _, document = web.request("GET", "/openapi.json")
    security = document["paths"][route.path][route.method.lower()]["security"]
    assert security == {
        OPEN_ACCESS: [],
        READ_ACCESS: [{"token": []}, {"readToken": []}],
        WRITE_ACCESS: [{"token": []}],
    }[expected(route)]
    assert set(document["components"]["securitySchemes"]) == {"token", "readToken"}


def test_a_peek_without_the_token_shows_no_body_and_says_why(make_web):
    web = make_web(read_token=READ_TOKEN)
    web.broker.publish_to_queue(b"q", b"m", b"secret body")
    status, body = web.request("GET", "/api/queues/q/messages", token=None)
    assert status == 401 and "secret" not in str(body) and "bearer token" in body["error"]
    status, body = web.request("GET", "/api/queues/q/messages", token=READ_TOKEN)
    assert status == 200 and body["messages"][0]["body"] == "secret body"
    status, body = web.request("PUT", "/api/queues/q2", token=READ_TOKEN)
    assert status == 401 and b"q2" not in web.broker.queues


def test_without_any_token_reads_of_bodies_say_which_option_opens_them(make_web):
    web = make_web(token=None)
    status, body = web.request("POST", "/api/events/e", json={"body": "x"}, token="anything")
    assert status == 401 and "--http-token" in body["error"]
    status, body = web.request("GET", "/api/connections", token=None)
    assert status == 401 and "--http-read-token" in body["error"]
    assert web.broker.published == 0
    assert web.request("GET", "/health", token=None)[0] == 200


def test_a_non_utf8_or_non_bearer_authorization_is_a_plain_401(make_web):
    web = make_web(read_token=READ_TOKEN)
    for header in ("Basic eA==", f"bearer{READ_TOKEN}", "Bearer \xff"):
        status, _ = web.request("GET", "/api/connections", token=None,
                                headers={"Authorization": header.encode("latin-1")})
        assert status == 401
    status, _ = web.request("GET", "/api/connections", token=None,
                            headers={"Authorization": f"bearer  {READ_TOKEN} "})
    assert status == 200
