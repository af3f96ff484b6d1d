"""The queues of the crash test, with the options the HTTP client declares each cycle."""

from __future__ import annotations

from typing import Any

QUEUES: dict[str, dict[str, Any]] = {
    "q": {"bindings": ["ev"]},
    "p": {"bindings": ["pev"], "dead_letter": "p.dead"},
    "u": {"bindings": ["uev"]},
    "r": {"dead_letter": "r.dead"},
    "r0": {},
    "t": {"bindings": ["tev"], "dead_letter": "t.dead"},
    "t0": {"bindings": ["tev"]},
    "e": {"dead_letter": "e.dead"},
    "e0": {},
    **{name: {} for name in ("p.dead", "r.dead", "t.dead", "e.dead")},
}
"""Every queue of the test with its options; what the drain takes."""


def dead_letter(queue: str) -> str | None:
    return QUEUES[queue].get("dead_letter")
