# -*- test-case-name: tests.unit.test_mqks_evaluator -*-
"""What MQKS ``_eval`` code may call: safe builtins and whitelisted methods.

Apart from the interpreter (``mqserver.protocols.mqks.evaluator``) so each
stays readable.  Every callable here bounds what it builds (``MAX_SIZE``):
the interpreter weighs results, but ``range(10**12)`` or a huge ``join``
must be refused before they exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from mqserver.protocols.mqks.stats_view import Flag, QueueStat, ReadOnlyMap, StateView

MAX_SIZE = 1_000_000  # items of a range or repetition, characters of a new string


class EvalError(Exception):
    """The code was refused, or failed while being evaluated."""


NUMBERS = (int, float, bool)


def _range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_SIZE:
        raise EvalError("range too long")
    return r


def _sum(iterable: Any, start: int | float = 0) -> int | float:
    """Numbers only: sum() of lists or tuples concatenates quadratically."""
    if type(start) not in NUMBERS:
        raise EvalError("sum() takes numbers only")
    total = start
    for x in iterable:
        if type(x) not in NUMBERS:
            raise EvalError("sum() takes numbers only")
        total += x
    return total


def _round(number: Any, ndigits: int | None = None) -> Any:
    if ndigits is not None and (type(ndigits) is not int or abs(ndigits) > 100):
        raise EvalError("round() ndigits out of range")  # round(5, -10**9) is 10**10**9
    return round(number, ndigits)


def _zip(*iterables: Any) -> Iterator[tuple[Any, ...]]:
    if len(iterables) > 8:
        raise EvalError("zip() of too many iterables")
    return zip(*iterables, strict=False)


def _join(sep: Any, iterable: Any) -> Any:
    items = list(islice(iterable, MAX_SIZE + 1))
    size = sum(len(x) for x in items if isinstance(x, (str, bytes))) + len(sep) * len(items)
    if len(items) > MAX_SIZE or size > MAX_SIZE:
        raise EvalError("join() result too long")
    return sep.join(items)


def _get_worker(item: Any) -> int:
    """The original's shortcut: which worker serves a queue or event.  One worker here."""
    hash(item)  # the original hashed it: an unhashable item is an error there too
    return 0


BUILTINS: dict[str, Any] = {
    "len": len, "sum": _sum, "sorted": sorted, "min": min, "max": max, "set": set,
    "frozenset": frozenset, "list": list, "tuple": tuple, "dict": dict, "int": int,
    "float": float, "bool": bool, "abs": abs, "any": any, "all": all, "round": _round,
    "enumerate": enumerate, "zip": _zip, "range": _range, "reversed": reversed,
    "get_worker": _get_worker,
}  # str and repr come from the interpreter, which weighs their argument first
_STR = ["split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower", "strip",
        "lstrip", "rstrip", "find", "rfind", "rindex", "partition", "rpartition", "isdigit",
        "isalpha", "isalnum", "isspace", "count", "index"]  # not format, replace, encode...
_SET = ["union", "intersection", "difference", "symmetric_difference", "issubset",
        "issuperset", "isdisjoint", "copy"]
METHODS: dict[type, dict[str, Callable[..., Any]]] = {
    t: {n: getattr(t, n) for n in names} for t, names in [
        (str, _STR), (bytes, _STR), (list, ["count", "index", "copy"]),
        (tuple, ["count", "index"]), (dict, ["keys", "values", "items", "get", "copy"]),
        (set, _SET), (frozenset, _SET)]
}
METHODS[str]["join"] = METHODS[bytes]["join"] = _join
ATTRS = frozenset().union(
    *METHODS.values(), *(v.ALLOWED for v in (ReadOnlyMap, QueueStat, Flag, StateView)))


class Method:
    """A whitelisted method bound to its object: the only attributes code can call."""

    __slots__ = ("fn", "obj")

    def __init__(self, fn: Callable[..., Any], obj: Any) -> None:
        self.fn, self.obj = fn, obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self.obj, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<method {self.fn.__name__}>"
