"""Soak: rounds of hundreds of connections over every protocol (``mqserver.soak``).

Bounded for CI; ``MQSERVER_SOAK_SECONDS=600 pytest tests/integration/test_soak.py``
runs it for ten minutes.  Checks at the end: nothing confirmed and unacked is
missing, nothing acked came back, nothing arrived twice; the server's open
descriptors are back to their baseline and its RSS near it.
"""

from __future__ import annotations

import os
import time

import pytest

from mqserver.soak import Soak, resources

TOKEN = "soak-token"
SECONDS = float(os.environ.get("MQSERVER_SOAK_SECONDS", "20"))
# RSS may keep a little of what a round's peak needed (allocator arenas);
# a leak grows with every round and shows up far beyond this
RSS_SLACK_KIB = 24 * 1024


@pytest.mark.timeout(SECONDS + 240)  # a long run must not hit the suite's 300 s default
def test_soak_every_protocol(start_server, tmp_path):
    listen = "tcp:0:interface=127.0.0.1"
    server = start_server(
        "--storage=sqlite", f"--data-dir={tmp_path / 'data'}", f"--http-token={TOKEN}",
        f"--protocol=mqks:{listen}", f"--protocol=phpmq:{listen}", f"--protocol=emqp:{listen}",
        f"--emqp-backend={listen}", f"--emqp-admin={listen}", f"--http={listen}",
    )
    deadline = time.monotonic() + 10
    while not {"emqp-backend", "emqp-admin"} <= set(server.ports):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = server.process.pid
    soak = Soak(server.ports, TOKEN)
    soak.declare()
    soak.run_round()  # warm-up: first-use allocations are not a leak
    problems = soak.settle()
    baseline = settled(pid, None)
    started = time.monotonic()
    while time.monotonic() - started < SECONDS or soak.rounds < 4:
        soak.run_round()
        if soak.rounds % 10 == 0:
            problems += soak.settle()
    problems += soak.settle()
    after = settled(pid, baseline.fds)
    ledger = soak.ledger
    print(f"soak: {soak.rounds} rounds in {time.monotonic() - started:.1f} s, "
          f"{len(ledger.published)} published, {len(ledger.confirmed)} confirmed, "
          f"{len(ledger.acked)} acked ({soak.settled} by settling); fds {baseline.fds} -> "
          f"{after.fds}, RSS {baseline.rss_kib} -> {after.rss_kib} KiB; "
          f"session errors: {soak.errors[:5]}")
    assert problems == []
    assert soak.errors == []
    assert len(ledger.confirmed) > 1000 and ledger.acked
    assert after.fds == baseline.fds
    assert after.rss_kib < baseline.rss_kib + RSS_SLACK_KIB
    assert "Traceback" not in server.text()


def settled(pid: int, fds: int | None):
    """Resources once the last round's connections are gone (fds stop changing)."""
    deadline = time.monotonic() + 15
    last = resources(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = resources(pid)
        if now.fds == last.fds and (fds is None or now.fds <= fds):
            return now
        last = now
    return last
