"""HTTP names, ids and header counts over ``--max-name-bytes``/``--max-id-bytes``/``--max-headers``:
400 with the reason, and nothing reaches the broker."""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import connectionDone
from twisted.internet.testing import StringTransport

from mqserver.limits import Limits

TOKEN = "s3cret"  # the token of the ``web`` fixture (tests/unit/web/conftest.py)

SMALL = Limits(max_name=8, max_id=6, max_headers=2)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("PUT", "/api/queues/q123456789", None),
    ("PUT", "/api/queues/q%0Ax", None),
    ("PUT", "/api/queues/q", {"bindings": ["e123456789"]}),
    ("PUT", "/api/queues/q", {"dead_letter": "d\u0000"}),
    ("POST", "/api/events/e123456789", {"body": "x"}),
    ("POST", "/api/events/e", {"body": "x", "id": "m1234567"}),
    ("POST", "/api/events/e", {"body": "x", "headers": {"a": "1", "b": "2", "c": "3"}}),
])
def test_http_names_ids_and_headers_over_the_limit_are_400(make_web, method, path, body):
    web = make_web()
    web.api.limits = SMALL
    status, answer = web.request(method, path, json=body)
    assert status == 400, answer
    assert "at most" in answer["error"] or "control" in answer["error"]
    assert not web.broker.queues


def test_a_non_utf8_authorization_header_is_401_not_500(web):
    # found by tests/fuzz/fuzz_http.py: twisted.web decodes str-keyed headers as strict UTF-8
    status, answer = web.request("PUT", "/api/queues/q", token=None,
                                 headers={b"Authorization": [b"Beare\x8e\xe6token"]})
    assert status == 401, answer
    assert not web.broker.queues


def test_a_non_utf8_content_type_is_a_raw_body_not_500(web):
    web.broker.declare_queue(b"q")
    status, answer = web.request("POST", "/api/queues/q/messages", data=b"payload",
                                 headers={b"Content-Type": [b"text/\xff"]})
    assert status == 201, answer
    assert [m.body for m in web.broker.queues[b"q"].ready] == [b"payload"]


def test_form_bodies_are_not_parsed_and_odd_content_types_do_not_break_parsing(web):
    # found by tests/fuzz/fuzz_http.py: twisted.web's form parsing raised out of
    # dataReceived on a Content-Type holding a form feed.  StubTreq wraps the
    # resource in a Site of its own, so this drives the real site over a transport.
    web.broker.declare_queue(b"q")
    for kind in (b"a\x0cpplication/json", b"application/x-www-form-urlencoded"):
        channel = web.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1234))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(
            b"POST /api/queues/q/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode() + b"\r\nContent-Type: " + kind
            + b"\r\nContent-Length: 7\r\n\r\na=1&b=2"
        )
        assert transport.value().startswith(b"HTTP/1.1 201 "), transport.value()
        channel.connectionLost(connectionDone)
    assert [m.body for m in web.broker.queues[b"q"].ready] == [b"a=1&b=2"] * 2
