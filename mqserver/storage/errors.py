"""Why a store refused to open or to write: one class per thing an operator must fix."""

from __future__ import annotations

from mqserver.storage.memory import StoreClosedError

__all__ = ["SessionLostError", "StoreClosedError", "StoreFailedError", "StoreFormatError",
           "StoreLockedError"]


class StoreLockedError(Exception):
    """Another process has the store open; two brokers on one store would corrupt it."""


class StoreFormatError(Exception):
    """The files are not ours, or were written by a newer mqserver than this one."""


class StoreFailedError(Exception):
    """An earlier write failed; the store refuses more until a restart recovers it."""


class SessionLostError(Exception):
    """A fenced store (active/standby) lost the database session that held its claim.

    Never healed by reconnecting: another node may be active by now.
    """
