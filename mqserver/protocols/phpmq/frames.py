# -*- test-case-name: tests.unit.test_phpmq_codec -*-
"""PHPMQ frames: the format's constants and the decoded forms (no I/O).

A frame is an 8-byte message header ``H`` + 2-digit version + 3-digit type +
2-digit package count, followed by that many packages, each a 32-byte
package header ``P`` + 2-digit package type + 29-digit zero-padded content
length, then the raw content.  Nothing separates them: the line breaks in the
upstream README are display only, and its 36-byte package header example is
wrong (see docs/protocols/phpmq.md).

Two revisions share version ``01``; the only way to tell them apart is the
package count, so unlike the original parser this one honours it: every
(type, count) pair has one fixed set of package types (``LAYOUTS``).
"""

from __future__ import annotations

from dataclasses import dataclass

VERSION = 1
MESSAGE_HEADER_SIZE = 8
PACKAGE_HEADER_SIZE = 32
DEFAULT_MAX_CONTENT = 16 * 1024 * 1024
MAX_NUMBER_DIGITS = 18
"""Counts and TTLs longer than this are refused before ``int()`` sees them."""
PACKAGE_HEADER_CACHE = 1024
"""Parsed package headers a decoder remembers (then it starts afresh)."""

# message types
PUBLISH = 1
CONSUME = 2
DISPATCH = 3
ACK = 4
REQUEUE = 5
DEAD_LETTER = 6

# package types
QUEUE = 1
CONTENT = 2
MESSAGE_ID = 3
COUNT = 4
TTL = 5

TYPE_NAMES = {
    PUBLISH: "publish",
    CONSUME: "consume",
    DISPATCH: "dispatch",
    ACK: "ack",
    REQUEUE: "requeue",
    DEAD_LETTER: "dead letter",
}

LAYOUTS: dict[tuple[int, int], tuple[int, ...]] = {
    (PUBLISH, 2): (QUEUE, CONTENT),
    (PUBLISH, 3): (QUEUE, CONTENT, TTL),
    (CONSUME, 2): (QUEUE, COUNT),
    (DISPATCH, 3): (QUEUE, CONTENT, MESSAGE_ID),
    (DISPATCH, 4): (QUEUE, CONTENT, MESSAGE_ID, TTL),
    (ACK, 2): (QUEUE, MESSAGE_ID),
    (REQUEUE, 3): (QUEUE, MESSAGE_ID, TTL),
    (DEAD_LETTER, 2): (QUEUE, MESSAGE_ID),
}
"""Package types in the order they are sent, for every valid (type, count)."""

R2018_ONLY = frozenset({(PUBLISH, 3), (DISPATCH, 4), (REQUEUE, 3), (DEAD_LETTER, 2)})
"""Frames that exist only in revision 2018: seeing one tells us what a client speaks."""

LAYOUT_SETS = {key: frozenset(layout) for key, layout in LAYOUTS.items()}


class PHPMQError(ValueError):
    """A malformed frame.  PHPMQ has no error frame, so this ends the connection."""


@dataclass(slots=True)
class Frame:
    """One decoded message: its type and its packages by package type."""

    type: int
    packages: dict[int, bytes]

    @property
    def revision(self) -> int:
        """2018 for a frame only revision 2018 has, else 2017 (which 2018 also accepts)."""
        return 2018 if (self.type, len(self.packages)) in R2018_ONLY else 2017


@dataclass(slots=True)
class Run:
    """Consecutive frames of one type and queue with two packages, queue first,
    that differ only in the second (``value_type``): a 2017 001 (contents),
    002 (counts), 004 or 006 (ids).  The decoder hands them over together so
    that a connection's stream of publishes or acks is handled in one loop."""

    type: int
    queue: bytes
    value_type: int
    values: list[bytes]

    def frames(self) -> list[Frame]:
        return [Frame(self.type, {QUEUE: self.queue, self.value_type: v}) for v in self.values]
