# -*- test-case-name: tests.unit.test_storage_faults -*-
"""Public test helper: a store wrapper that fails writes on demand.

Storage faults (a full disk, an I/O error, a busy database) are rare and hard
to cause on purpose, yet what the broker does then decides whether a client
is ever told "stored" for something that is not.  ``FaultyStore`` wraps any
``IMessageStore`` (ours or a third party's) and makes ``apply`` fail, without
touching the wrapped store, while ``failing`` is set::

    store = FaultyStore(SQLiteStore(path))
    store.fail_with(OSError(errno.ENOSPC, "No space left on device"))
    ...                          # publishes with confirm now get errors
    store.heal()                 # the writer's next retry goes through
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, fail
from zope.interface import implementer

from mqserver.interfaces import IMessageStore
from mqserver.model import Recovered


@implementer(IMessageStore)
class FaultyStore:
    """Delegates to ``store``; ``apply`` fails with ``error`` while one is set."""

    def __init__(self, store: IMessageStore) -> None:
        self.store = store
        self.error: Exception | None = None
        self.refused = 0  # batches failed on purpose, for assertions

    @property
    def durable(self) -> bool:
        return bool(self.store.durable)

    def fail_with(self, error: Exception) -> None:
        """Every ``apply`` from now on fails with ``error`` (nothing reaches the store)."""
        self.error = error

    def heal(self) -> None:
        self.error = None

    def open(self) -> Deferred[Recovered]:
        return self.store.open()

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        if self.error is not None:
            self.refused += 1
            return fail(self.error)
        return self.store.apply(ops)

    def close(self) -> Deferred[None]:
        return self.store.close()
