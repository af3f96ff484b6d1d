# -*- test-case-name: tests.unit.test_mqks_evaluator -*-
"""MQKS ``_eval`` without ``eval``: a whitelist interpreter over a stats view.

The original server answered ``{id} _eval {code}`` with ``str(eval(code))``:
remote code execution for anyone who could connect.  Its users (stats.py and
operators' one-liners) only ever *read* counters and sizes, so here the code
is parsed with ``ast`` and the tree is walked by this module, never compiled:
only listed node kinds, names, attributes and callables.  Every value code can
reach is a number, a string, a builtin container or a read-only view (stats_view),
none of which leads back to the broker's objects or to Python internals.
Work and sizes are capped so that a query can neither stall the reactor nor
exhaust memory.  Any refusal or failure is an ``EvalError``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from time import monotonic
from typing import Any

from mqserver.protocols.mqks.eval_builtins import (
    ATTRS,
    BUILTINS,
    MAX_SIZE,
    METHODS,
    NUMBERS,
    EvalError,
    Method,
)
from mqserver.protocols.mqks.stats_view import ReadOnlyMap, View

MAX_CODE = 10_000  # characters of source
MAX_NODES = 500  # AST nodes (operators and load contexts not counted)
MAX_DEPTH = 60  # AST nesting, which bounds the interpreter's recursion
MAX_CALL_DEPTH = 16  # nested lambda calls: (lambda f: f(f))(lambda f: f(f)) stops here
MAX_WEIGHT = 2_000_000  # items of a new container or of the result, nesting expanded
MAX_INT_BITS = 10_000  # huge ints make str(), hashing and ** slow
MAX_WORK = 4_000_000  # nodes evaluated + loop turns + items weighed: ~2 s at most
MAX_SECONDS = 5.0  # also a clock: a loop of C-level calls (max(r) for _ in ...) is few steps


Scope = dict[str, Any]




# -- the interpreter ---------------------------------------------------------

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.BitOr: operator.or_, ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor,
}  # no shifts: 1 << 10**9 is a memory bomb of no use to stats
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos,
          ast.Invert: operator.invert}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_DISPLAYS = {ast.List: list, ast.Tuple: tuple, ast.Set: set}
_COMPREHENSIONS = {ast.ListComp: list, ast.SetComp: set, ast.DictComp: dict,
                   ast.GeneratorExp: iter}
_EXPRS = frozenset({ast.Constant, ast.Name, ast.Attribute, ast.Call, ast.keyword, ast.Subscript,
                    ast.Slice, ast.Dict, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp,
                    ast.IfExp, *_DISPLAYS})  # Lambda and comprehensions bind names: apart
_UNCOUNTED = frozenset({ast.Load, ast.And, ast.Or, *_BINOPS, *_UNARY, *_COMPARE})
_CONSTANTS = (int, float, str, bytes, bool, type(None))
_SUBSCRIPTABLE = (list, tuple, str, bytes, dict, range, ReadOnlyMap)
_CONTAINERS = (list, tuple, set, frozenset, dict)


class _Lambda:
    """A lambda of the evaluated code (sort keys): calling it interprets its body."""

    __slots__ = ("interp", "node", "scope")

    def __init__(self, interp: _Interpreter, node: ast.Lambda, scope: Scope) -> None:
        self.interp, self.node, self.scope = interp, node, scope

    def __call__(self, *args: Any) -> Any:
        params = [a.arg for a in self.node.args.args]
        if len(args) != len(params):
            raise EvalError(f"lambda takes {len(params)} arguments, got {len(args)}")
        interp = self.interp
        if interp.calls >= MAX_CALL_DEPTH:
            raise EvalError("lambda calls nested too deep")
        interp.calls += 1
        try:
            scope = {**self.scope, **dict(zip(params, args, strict=True))}
            return interp.eval(self.node.body, scope)
        finally:
            interp.calls -= 1

    def __repr__(self) -> str:
        return "<lambda>"


class _Interpreter:
    """One evaluation: a static check of the whole tree, then a walk with budgets."""

    def __init__(self, names: Mapping[str, object]) -> None:
        self.work = self.calls = self.nodes = 0
        self.deadline = monotonic() + MAX_SECONDS
        builtins = {**BUILTINS, "str": self.weighed(str), "repr": self.weighed(repr)}
        self.callables = frozenset(id(f) for f in builtins.values())
        self.scope: Scope = {**builtins, **names}
        self.handlers = {kind: getattr(self, "_" + kind.__name__) for kind in _EXPRS | {
            ast.Lambda, *_COMPREHENSIONS} if kind is not ast.keyword}

    def tick(self, amount: int = 1) -> None:
        """Every step costs work; any one step is bounded by the size caps."""
        self.work += amount
        if self.work > MAX_WORK:
            raise EvalError("too much work")
        if monotonic() > self.deadline:
            raise EvalError("too slow")

    def check(self, node: Any, bound: frozenset[str], depth: int) -> None:
        """Refuse before running anything: node kinds, free names, attributes, sizes."""
        kind = type(node)
        if kind in _UNCOUNTED:
            return
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise EvalError("expression too big")
        if kind is ast.Name and node.id not in bound and node.id not in self.scope:
            raise EvalError(f"name {node.id!r} is not defined")
        if kind is ast.Attribute and (node.attr.startswith("_") or node.attr not in ATTRS):
            raise EvalError(f"attribute {node.attr!r} is not allowed")
        if kind is ast.Constant and (type(node.value) not in _CONSTANTS or (
                type(node.value) is int and node.value.bit_length() > MAX_INT_BITS)):
            raise EvalError(f"constant {type(node.value).__name__} is not allowed")
        if (kind is ast.Dict and None in node.keys) or (kind is ast.keyword and not node.arg):
            raise EvalError("** unpacking is not allowed")
        if kind is ast.Lambda:
            a = node.args
            if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults:
                raise EvalError("lambda takes plain positional arguments only")
            return self.check(node.body, bound | {p.arg for p in a.args}, depth + 1)
        if kind in _COMPREHENSIONS:
            for gen in node.generators:
                if gen.is_async:
                    raise EvalError("async comprehension is not allowed")
                self.check(gen.iter, bound, depth + 1)
                bound = bound | self.targets(gen.target)
                for cond in gen.ifs:
                    self.check(cond, bound, depth + 1)
            for part in (node.key, node.value) if kind is ast.DictComp else (node.elt,):
                self.check(part, bound, depth + 1)
            return None
        if kind not in _EXPRS:
            raise EvalError(f"{kind.__name__} is not allowed")
        for child in ast.iter_child_nodes(node):
            self.check(child, bound, depth + 1)
        return None

    def targets(self, target: ast.AST) -> frozenset[str]:
        self.nodes += 1
        if type(target) is ast.Name:
            return frozenset({target.id})
        if type(target) in (ast.Tuple, ast.List):
            return frozenset().union(*(self.targets(t) for t in target.elts))
        raise EvalError("comprehension targets must be names")

    def weigh(self, value: Any, views: bool = False) -> int:
        """Items in ``value`` counted as str() would expand them; too many is an error."""
        total, stack = 0, [value]
        while stack:
            item = stack.pop()
            kind = type(item)
            total += 1
            if kind is str or kind is bytes:
                total += len(item) >> 4
            elif kind is int:
                total += item.bit_length() >> 6
            elif kind is dict or (views and kind is ReadOnlyMap):
                data = item if kind is dict else item._data
                stack.extend(data)
                stack.extend(data.values())
            elif kind in _CONTAINERS:
                stack.extend(item)
            if total > MAX_WEIGHT:
                raise EvalError("value too big")
        self.tick(total)
        return total

    def produced(self, value: Any) -> Any:
        """Charge every new value for its size, so nothing big is made twice."""
        kind = type(value)
        if kind is str or kind is bytes:
            if len(value) > MAX_SIZE:
                raise EvalError("string too long")
            self.tick(len(value) >> 4)
        elif kind is int and value.bit_length() > MAX_INT_BITS:
            raise EvalError("integer too big")
        elif kind in _CONTAINERS:
            self.weigh(value)
        return value

    def weighed(self, convert: Callable[[Any], str]) -> Callable[..., str]:
        """str() and repr() of what would expand too much are refused before they run."""

        def safe(value: Any = "") -> str:
            self.weigh(value, views=True)
            return convert(value)

        return safe

    # evaluation: one method per node kind the check lets through

    def eval(self, node: Any, scope: Scope) -> Any:
        self.tick()
        return self.handlers[type(node)](node, scope)

    def _Constant(self, node: ast.Constant, scope: Scope) -> Any:
        return node.value

    def _Name(self, node: ast.Name, scope: Scope) -> Any:
        try:
            return scope[node.id]
        except KeyError:
            raise EvalError(f"name {node.id!r} is not defined") from None

    def _Attribute(self, node: ast.Attribute, scope: Scope) -> Any:
        obj, name = self.eval(node.value, scope), node.attr
        if isinstance(obj, View) and name in type(obj).ALLOWED and name[0] != "_":
            attr = getattr(type(obj), name, None)
            return Method(attr, obj) if callable(attr) else getattr(obj, name)
        method = METHODS.get(type(obj), {}).get(name)
        if method is None:
            raise EvalError(f"{type(obj).__name__} has no allowed attribute {name!r}")
        return Method(method, obj)

    def _Call(self, node: ast.Call, scope: Scope) -> Any:
        func = self.eval(node.func, scope)
        if not (isinstance(func, (Method, _Lambda)) or id(func) in self.callables):
            raise EvalError(f"{type(func).__name__} object is not callable")
        args = [self.eval(a, scope) for a in node.args]
        kwargs = {k.arg: self.eval(k.value, scope) for k in node.keywords}
        return self.produced(func(*args, **kwargs))

    def _BinOp(self, node: ast.BinOp, scope: Scope) -> Any:
        left, right = self.eval(node.left, scope), self.eval(node.right, scope)
        op = type(node.op)
        if op is ast.Mult:
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                    size = len(seq) if isinstance(seq, (str, bytes)) else self.weigh(seq) - 1
                    if n > 0 and size * n > MAX_SIZE:
                        raise EvalError("repetition too big")
            if isinstance(left, int) and isinstance(right, int) and (
                    left.bit_length() + right.bit_length() > MAX_INT_BITS):
                raise EvalError("integer too big")
        elif op is ast.Pow:
            if type(left) not in NUMBERS or type(right) not in NUMBERS:
                raise EvalError("** takes numbers only")
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and (
                    right > 0 and left.bit_length() * right > MAX_INT_BITS):
                raise EvalError("integer too big")
        elif op is ast.Mod and isinstance(left, (str, bytes)):
            raise EvalError("% formatting is not allowed")  # '%0999999999d' % 1
        return self.produced(_BINOPS[op](left, right))

    def _UnaryOp(self, node: ast.UnaryOp, scope: Scope) -> Any:
        return _UNARY[type(node.op)](self.eval(node.operand, scope))

    def _BoolOp(self, node: ast.BoolOp, scope: Scope) -> Any:
        is_and = type(node.op) is ast.And
        for value_node in node.values:
            value = self.eval(value_node, scope)
            if is_and != bool(value):
                break
        return value

    def _Compare(self, node: ast.Compare, scope: Scope) -> Any:
        left = self.eval(node.left, scope)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.eval(comparator, scope)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp, scope: Scope) -> Any:
        return self.eval(node.body if self.eval(node.test, scope) else node.orelse, scope)

    def _Subscript(self, node: ast.Subscript, scope: Scope) -> Any:
        obj = self.eval(node.value, scope)
        if type(obj) not in _SUBSCRIPTABLE:
            raise EvalError(f"{type(obj).__name__} object is not subscriptable")
        return self.produced(obj[self.eval(node.slice, scope)])  # slices are copies

    def _Slice(self, node: ast.Slice, scope: Scope) -> slice:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else self.eval(p, scope) for p in parts))

    def _display(self, node: Any, scope: Scope) -> Any:
        return self.produced(_DISPLAYS[type(node)]([self.eval(e, scope) for e in node.elts]))

    _List = _Tuple = _Set = _display

    def _Dict(self, node: ast.Dict, scope: Scope) -> dict[Any, Any]:
        items = zip(node.keys, node.values, strict=True)
        return self.produced({self.eval(k, scope): self.eval(v, scope) for k, v in items})

    def _Lambda(self, node: ast.Lambda, scope: Scope) -> _Lambda:
        return _Lambda(self, node, scope)

    def _comprehension(self, node: Any, scope: Scope) -> Any:
        """Own scope, first iterable evaluated at once in the outer one, as in Python."""
        local = dict(scope)
        first = iter(self.eval(node.generators[0].iter, scope))
        scopes = self._loop(node.generators, 0, first, local)
        if type(node) is ast.DictComp:
            return self.produced({self.eval(node.key, s): self.eval(node.value, s)
                                  for s in scopes})
        values = (self.eval(node.elt, s) for s in scopes)
        return values if type(node) is ast.GeneratorExp else self.produced(
            _COMPREHENSIONS[type(node)](values))

    _ListComp = _SetComp = _DictComp = _GeneratorExp = _comprehension

    def _loop(self, gens: list[ast.comprehension], i: int, items: Iterator[Any],
              local: Scope) -> Iterator[Scope]:
        gen = gens[i]
        name = gen.target.id if type(gen.target) is ast.Name else None
        for item in items:
            self.tick()
            if name is None:
                self.bind(gen.target, item, local)
            else:
                local[name] = item
            if all(self.eval(cond, local) for cond in gen.ifs):
                if i + 1 == len(gens):
                    yield local
                else:
                    inner = iter(self.eval(gens[i + 1].iter, local))
                    yield from self._loop(gens, i + 1, inner, local)

    def bind(self, target: Any, value: Any, into: dict[str, Any]) -> None:
        if type(target) is ast.Name:
            into[target.id] = value
            return
        items = list(islice(iter(value), len(target.elts) + 1))
        if len(items) != len(target.elts):
            raise EvalError(f"cannot unpack {len(items)} values into {len(target.elts)}")
        for sub, item in zip(target.elts, items, strict=True):
            self.bind(sub, item, into)


def safe_eval(code: str, names: Mapping[str, object]) -> object:
    """Evaluate one expression over ``names``, never with compile(), eval() or exec().

    The tree from ``ast.parse(mode="eval")`` is checked in full first, then
    interpreted.  Any refusal, and any exception the evaluation raises, comes
    out as ``EvalError``; the result is weighed because the caller will str() it.
    """
    if not isinstance(code, str) or len(code) > MAX_CODE:
        raise EvalError(f"code must be a string of at most {MAX_CODE} characters")
    interp = _Interpreter(names)
    try:
        tree = ast.parse(code, mode="eval")
    except Exception as exc:  # SyntaxError, also ValueError, MemoryError, RecursionError
        raise EvalError(f"syntax error: {str(exc) or type(exc).__name__}"[:200]) from None
    try:
        interp.check(tree.body, frozenset(), 0)
        result = interp.eval(tree.body, interp.scope)
        interp.weigh(result, views=True)
    except EvalError:
        raise
    except Exception as exc:
        raise EvalError(f"{type(exc).__name__}: {exc}"[:200]) from exc
    return result
