"""HTTP names, ids and header counts over ``--max-name-bytes``/``--max-id-bytes``/``--max-headers``:
400 with the reason, and nothing reaches the broker."""

from __future__ import annotations

import pytest

from mqserver.limits import Limits

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
