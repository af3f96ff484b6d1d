# -*- test-case-name: tests.unit.test_figures -*-
"""Numbers a durable store's writer updates per batch, kept in an array (``Figure``).

A float or an int past 256 assigned to an attribute is a new object each
time, made wherever pymalloc has a free block at that moment, and the last
one lives on.  A fill of a durable store goes through some twenty arenas
(1 MiB each) of messages waiting for their batch; the figures of the last
batch (its time, the running totals, the count) land in those arenas, and
once the backlog is packed at rest each one keeps the arena it landed in
from going back to the system: read from the pool headers of a SQLite
server holding 1M packed messages, several of these numbers were alone in an
arena.  In an ``array`` a number is eight bytes of one buffer made at
start-up; reading one makes a short-lived object.
"""

from __future__ import annotations

from array import array
from typing import Any, Generic, TypeVar, overload

N = TypeVar("N", int, float)


class Figure(Generic[N]):
    """An attribute stored in its instance's ``figures`` array, read back as ``kind``.

    The owner's ``__init__`` sets ``self.figures = figures(type(self))``.
    Integers stay exact up to 2**53 (a count of batches or messages never
    gets there).
    """

    def __init__(self, kind: type[N]) -> None:
        self.kind = kind
        self.index = -1

    def __set_name__(self, owner: type, name: str) -> None:
        self.index = _figures_of(owner).index(self)

    @overload
    def __get__(self, instance: None, owner: type) -> Figure[N]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> N: ...

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return self
        return self.kind(instance.figures[self.index])

    def __set__(self, instance: Any, value: N) -> None:
        instance.figures[self.index] = value


def _figures_of(owner: type) -> list[Figure[Any]]:
    return [value for value in vars(owner).values() if isinstance(value, Figure)]


def figures(owner: type) -> array[float]:
    """A zeroed array with a place for each ``Figure`` of ``owner``."""
    return array("d", bytes(8 * len(_figures_of(owner))))
