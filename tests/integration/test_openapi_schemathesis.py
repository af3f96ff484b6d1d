"""schemathesis against the served ``/openapi.json``: no generated request gets a 500.

One server (memory storage) takes every operation in turn, so queues and
consumers made by earlier examples are there for later ones; the token is
sent, so mutations run rather than stopping at 401.  Both of schemathesis'
modes run: valid requests (positive) and requests that break the schema
(negative, which must get a 4xx, not a 5xx).  Examples are bounded:
``MQSERVER_SCHEMATHESIS_EXAMPLES`` per operation (default 25) for a longer run.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error

TOKEN = "schemathesis-token"
EXAMPLES = int(os.environ.get("MQSERVER_SCHEMATHESIS_EXAMPLES", "25"))


@pytest.mark.timeout(120 + 2 * EXAMPLES)  # about 0.4 s per example over all operations
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=str)
def test_no_generated_request_is_a_server_error(start_server, mode):
    server = start_server("--storage=memory", f"--http-token={TOKEN}",
                          "--protocol=mqks:tcp:0:interface=127.0.0.1",
                          "--http=tcp:0:interface=127.0.0.1")
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{server.ports['http']}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 10
    unsatisfiable: list[str] = []

    for operation in operations:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case) -> None:
            if isinstance(case.body, dict) and isinstance(case.body.get("timeout"), int | float):
                case.body["timeout"] = min(case.body["timeout"], 0.05)  # a poll, not a hang
            case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                                   checks=[not_a_server_error])

        try:
            check()
        except Unsatisfiable:
            if mode is schemathesis.GenerationMode.POSITIVE:
                raise
            unsatisfiable.append(operation.label)  # nothing in it can be made invalid
    assert len(unsatisfiable) < len(operations) / 2, unsatisfiable
    assert "Traceback" not in server.text()
