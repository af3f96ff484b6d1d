# -*- test-case-name: tests.unit.test_limits -*-
"""Rules for names, ids and header counts that every protocol applies at its edge.

The original servers took any bytes of any length as a queue name or an id
(PHPMQ's VARCHAR(50) was never enforced, MQKS only splits on spaces).  A
broker shared by several protocols and an HTTP API needs one rule, checked
before anything reaches the core: a name that one protocol let in must be
one the others can show, log and look up.  So names and ids are non-empty,
at most ``max_name``/``max_id`` bytes (255 by default, AMQP's limit for queue
names) and free of ASCII control characters (NUL, tab, CR, LF, ..., DEL),
which no protocol can carry everywhere and which would forge log lines.
Any other byte, UTF-8 or not, is allowed, as in the originals.

Each protocol reports a broken rule its own way (an MQKS error reply, an
HTTP 400, a closed PHPMQ connection, a dropped eMQP message), so the checks
take the exception type to raise.  This module imports nothing from the
broker core or the protocols, and the core does not import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_NAME = 255
DEFAULT_MAX_ID = 255
DEFAULT_MAX_HEADERS = 64
DEFAULT_MAX_NAMES = 10_000

_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")

find_control = _CONTROL.search
"""The first ASCII control character in a bytes value, or None: hot paths that
test many values per message inline ``0 < len(value) <= limit and
(value.isalnum() or find_control(value) is None)`` and call the ``check_*``
methods only when that fails, for the error message.  ``bytes.isalnum`` (ASCII
letters and digits, the usual id) is ten times cheaper than the search."""

CONTROL_MARKS = bytes(0 if n < 0x20 or n == 0x7F else ord("a") for n in range(256))
"""Every control character to NUL and every other byte to ``a``: a value is
free of control characters when its translation ``isalnum``.  For an id with
punctuation, such as eventmq's ``str(uuid4())`` msgids, hot paths test
``value.isalnum() or value.translate(CONTROL_MARKS).isalnum()``: less than
half the instructions of ``find_control``'s search (1.4k against 3.2k,
callgrind)."""

ErrorFactory = Callable[[str], Exception]


class LimitError(ValueError):
    """A name, id or header count broke the rules (when the caller named no other error)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one server runs with (``--max-name-bytes``, ``--max-id-bytes``,
    ``--max-headers``, ``--max-names-per-request``)."""

    max_name: int = DEFAULT_MAX_NAME
    max_id: int = DEFAULT_MAX_ID
    max_headers: int = DEFAULT_MAX_HEADERS
    # queue or event names one request may list (an MQKS consume or rebind, an
    # eMQP INFORM): a line or frame that fits the size limits could name millions
    max_names: int = DEFAULT_MAX_NAMES

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Limits:
        """From twistd options; a config without them (a third-party caller) gets the defaults."""
        return cls(
            max_name=int(config.get("max-name-bytes", DEFAULT_MAX_NAME)),
            max_id=int(config.get("max-id-bytes", DEFAULT_MAX_ID)),
            max_headers=int(config.get("max-headers", DEFAULT_MAX_HEADERS)),
            max_names=int(config.get("max-names-per-request", DEFAULT_MAX_NAMES)),
        )

    def check_name(
        self, value: bytes, what: str = "queue name", error: ErrorFactory = LimitError
    ) -> bytes:
        """``value`` if it is a valid queue or event name (or mask), else raise ``error``."""
        return _check(value, what, self.max_name, error)

    def check_id(self, value: bytes, what: str = "id", error: ErrorFactory = LimitError) -> bytes:
        """``value`` if it is a valid message, request or consumer id, else raise ``error``."""
        return _check(value, what, self.max_id, error)

    def check_headers(
        self, count: int, what: str = "headers", error: ErrorFactory = LimitError
    ) -> None:
        """Raise ``error`` if a message carries more than ``max_headers`` header fields."""
        if count > self.max_headers:
            raise error(f"{count} {what}; at most {self.max_headers} are allowed")

    def check_names(self, count: int, what: str = "names", error: ErrorFactory = LimitError
                    ) -> None:
        """Raise ``error`` if one request lists more than ``max_names`` queue or event names."""
        if count > self.max_names:
            raise error(f"{count} {what} in one request; at most {self.max_names} are allowed "
                        "(--max-names-per-request)")


def positive(value: str) -> int:
    """Checks a limit option while options are parsed: 0 or less would refuse everything."""
    number = int(value)
    if number < 1:
        raise ValueError(f"{value!r} is not a positive whole number")
    return number


positive.coerceDoc = "A positive whole number."  # type: ignore[attr-defined]


def _check(value: bytes, what: str, limit: int, error: ErrorFactory) -> bytes:
    if 0 < len(value) <= limit and (value.isalnum() or value.translate(CONTROL_MARKS).isalnum()):
        return value  # the common case: one length test, a scan or two
    if not value:
        raise error(f"empty {what}")
    if len(value) > limit:
        raise error(f"{what} of {len(value)} bytes; at most {limit} are allowed")
    bad = find_control(value)
    assert bad is not None  # the fast path above returned every valid value
    raise error(f"{what} contains the control character {bad.group()!r}")
