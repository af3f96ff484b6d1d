"""No code runs from the wire: MQKS ``_eval`` escapes against the real server.

The original server answered ``_eval`` with Python's ``eval``; here it is a
whitelist interpreter (mqserver/protocols/mqks/evaluator.py, unit-tested in
depth in tests/unit/test_mqks_evaluator.py).  This sends the classic
sandbox escapes over a socket to a running ``twistd mqserver``: each would
create a marker file if any code ran; each must get an error reply, the file
must not exist and the server must keep answering.
"""

from __future__ import annotations

import re

EID = re.compile(rb"^e\d+ error \d{20}[0-9a-zA-Z]{4}$")


def escapes(marker: str) -> list[str]:
    touch = f"__import__('os').system('touch {marker}')"
    return [
        touch,
        f"open('{marker}', 'w')",
        f"eval(\"{touch}\")",
        f"exec(\"import os; os.system('touch {marker}')\")",
        f"compile(\"{touch}\", '', 'eval')",
        "().__class__.__bases__[0].__subclasses__()",
        "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "
        f"'catch_warnings'][0]()._module.__builtins__['__import__']('os').system('touch {marker}')",
        f"(lambda: 0).__globals__['__builtins__']['exec'](\"{touch}\")",
        f"getattr(__builtins__, 'exec')(\"{touch}\")",
        f"state.__class__.__init__.__globals__['os'].system('touch {marker}')",
        "'{0.__class__.__init__.__globals__}'.format(state)",
        f"f\"{{{touch}}}\"",
        "globals()['__builtins__']",
        "request.__dict__",
        "state.__reduce_ex__(2)",
        f"[x for x in [1] if {touch}]",
        f"sorted([1], key=lambda x: {touch})",
        f"__builtins__.__dict__['__import__']('os').system('touch {marker}')",
    ]


def test_sandbox_escapes_get_errors_and_run_nothing(connect, mqks_server, tmp_path):
    marker = tmp_path / "pwned"
    attempts = escapes(str(marker))
    c = connect()
    c.send(*(f"e{i} _eval {code}" for i, code in enumerate(attempts)))
    replies = c.read(len(attempts))
    assert [r for r in replies if not EID.match(r)] == []
    assert not marker.exists()
    c.send("p ping still here", "q _eval len(state.queues)")
    assert c.read(2) == [b"p ok still here", b"q ok 0"]
