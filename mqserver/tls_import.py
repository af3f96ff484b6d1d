# -*- test-case-name: tests.unit.test_tls_import -*-
"""Keeping pyOpenSSL out of a server that listens without TLS.

Twisted's reactor imports pyOpenSSL and ``cryptography`` whether or not
anything uses TLS: ``twisted.internet.tcp`` offers ``startTLS`` on every
connection, and ``posixbase`` and ``endpoints`` look for the ``ssl``
module.  That is some 45 ms of every start (a sixth of an empty server's
start-up on the bench machine; docs/performance.md), for a broker whose
TLS comes only from ``ssl:`` listener endpoints and which never calls
``startTLS``.  Each of those imports is guarded by Twisted itself (its
answer to pyOpenSSL not being installed), so a process whose listeners are
all plain TCP, UNIX or systemd sockets can tell Python that ``OpenSSL`` is
not there (``sys.modules["OpenSSL"] = None`` makes its import fail) before
the reactor is imported, and Twisted goes on without TLS.

Only then: with an ``ssl:`` listener, or any endpoint type this module does
not know (a third-party endpoint plugin may well use TLS), or a reactor that
is imported already, nothing changes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

PLAIN_ENDPOINTS = frozenset({"tcp", "tcp6", "unix", "systemd"})
"""Server endpoint types of Twisted's that never use TLS."""


def plain(description: str) -> bool:
    """Whether the server endpoint ``description`` is one of ``PLAIN_ENDPOINTS``
    (or a bare port number, which ``serverFromString`` reads as TCP)."""
    kind = description.split(":", 1)[0].strip()
    return kind.lower() in PLAIN_ENDPOINTS or kind.isdigit()


def leave_out_tls(descriptions: Iterable[str] | None,
                  modules: MutableMapping[str, Any] = sys.modules) -> bool:
    """Make ``import OpenSSL`` fail in this process if every listener in
    ``descriptions`` is ``plain`` and Twisted has not looked for TLS yet; True
    if it did.  ``None``: the listeners are not all known, keep TLS."""
    if descriptions is None or not all(plain(d) for d in descriptions):
        return False
    if "OpenSSL" in modules or "twisted.internet.tcp" in modules:
        return False  # imported already, or looked for: too late to save anything
    modules["OpenSSL"] = None
    return True


__all__ = ["PLAIN_ENDPOINTS", "leave_out_tls", "plain"]
