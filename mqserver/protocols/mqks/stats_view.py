# -*- test-case-name: tests.unit.test_mqks_evaluator -*-
"""What MQKS ``_eval`` code can see: the original server's ``state``, read-only.

The original's stats tools (stats.py, operators' one-liners) read fields of
its ``state`` module with Python 2 spellings (``itervalues``, ``qsize()``,
``is_set()``).  These views answer the same expressions from the broker's
public records, as snapshots that lead back to nothing mutable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any


def _s(raw: bytes | str) -> str:
    """Broker names are bytes; the original server showed them as str."""
    return raw if isinstance(raw, str) else raw.decode("utf-8", "surrogateescape")


# -- read-only views ---------------------------------------------------------


class View:
    """Base of the objects code may see: only names in ``ALLOWED`` are reachable."""

    __slots__ = ()
    ALLOWED: frozenset[str] = frozenset()


class ReadOnlyMap(View, Mapping[Any, Any]):
    """A dict snapshot nothing can change, with the Python 2 spellings of its methods."""

    __slots__ = ("_data",)
    ALLOWED = frozenset(
        ["get", "has_key", "items", "iteritems", "iterkeys", "itervalues", "keys", "values"]
    )

    def __init__(self, data: dict[Any, Any]) -> None:
        self._data = data

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)

    def keys(self) -> list[Any]:  # type: ignore[override]  # lists, as in Python 2
        return list(self._data)

    def values(self) -> list[Any]:  # type: ignore[override]
        return list(self._data.values())

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        return list(self._data.items())

    def itervalues(self) -> Iterator[Any]:
        return iter(self._data.values())

    def iteritems(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._data.items())

    has_key = Mapping.__contains__
    iterkeys = __iter__


class _Stub(View):
    """Stands for an object of the original server that code only ever asked one thing."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value}>"


class QueueStat(_Stub):
    """A gevent queue of the original (``queues``, ``responses_by_clients``): its size."""

    __slots__ = ()
    ALLOWED = frozenset({"qsize", "empty"})

    def qsize(self) -> int:
        return self._value

    def empty(self) -> bool:
        return not self._value


class Flag(_Stub):
    """A gevent Event of the original (``queues_used``): set while the queue has consumers."""

    __slots__ = ()
    ALLOWED = frozenset({"is_set", "isSet"})

    def is_set(self) -> bool:
        return self._value

    isSet = is_set


class Sock(_Stub):
    """A client socket (``socks_by_clients``): shows the peer, has no method at all."""

    __slots__ = ()


def _group(pairs: Iterator[tuple[str, Any]]) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for key, value in pairs:
        out.setdefault(key, set()).add(value)
    return out


# The fields of the original ``state`` module, each built from the broker (b),
# the live MQKS consumers (cs: (str id, Consumer) pairs) and the view itself.
_FIELDS: dict[str, Callable[[Any, list[tuple[str, Any]], StateView], Any]] = {
    "published": lambda b, cs, v: b.published,
    "queued": lambda b, cs, v: b.queued,  # copies put into queues
    "consumed": lambda b, cs, v: b.delivered,
    "worker": lambda b, cs, v: 0,
    "commands_put": lambda b, cs, v: 0,  # one worker: no command goes between workers
    "commands_got": lambda b, cs, v: 0,
    "commands_to_workers": lambda b, cs, v: {},
    "queues": lambda b, cs, v: {_s(n): QueueStat(len(q.ready)) for n, q in b.queues.items()},
    "queues_used": lambda b, cs, v: {
        _s(n): Flag(bool(q.consumers)) for n, q in b.queues.items()},
    "queues_to_delete_when_unused": lambda b, cs, v: {
        _s(n): q.options.delete_when_unused for n, q in b.queues.items()
        if q.options.delete_when_unused is not None},
    "events_by_queues": lambda b, cs, v: {
        _s(q): {_s(e) for e in es} for q, es in b.bindings.by_queue.items()},
    "queues_by_events": lambda b, cs, v: _group(
        (e, q) for q, es in v.events_by_queues.iteritems() for e in es),
    "queues_by_consumer_ids": lambda b, cs, v: {cid: _s(c.queue.name) for cid, c in cs},
    "consumers_by_queues": lambda b, cs, v: {
        q: ReadOnlyMap(dict(acks)) for q, acks in _group(
            (_s(c.queue.name), (cid, c.manual_ack)) for cid, c in cs).items()},
    "messages_by_consumer_ids": lambda b, cs, v: {
        cid: ReadOnlyMap({_s(mid): _s(m.body) for mid, m in c.unacked.items()})
        for cid, c in cs},
    "clients_by_consumer_ids": lambda b, cs, v: {cid: str(c.connection.id) for cid, c in cs},
    "consumer_ids_by_clients": lambda b, cs, v: _group(
        (client, cid) for cid, client in v.clients_by_consumer_ids.iteritems()),
    "socks_by_clients": lambda b, cs, v: {
        str(c.id): Sock(c.peer) for c in b.connections.values()},
    "responses_by_clients": lambda b, cs, v: {str(c): QueueStat(0) for c in b.connections},
}


class StateView(View):
    """``state`` of the original server, built from the broker field by field.

    Counters are read live; maps are snapshots made on first use, so a query
    pays only for what it touches, and nothing it gets can change the broker.
    """

    __slots__ = ("_broker", "_cache", "_consumers")
    ALLOWED = frozenset(_FIELDS)

    def __init__(self, broker: Any, consumers: Mapping[bytes, Any]) -> None:
        self._broker, self._cache = broker, {}
        self._consumers = [(_s(cid), c) for cid, c in consumers.items() if c.active]

    def __getattr__(self, name: str) -> Any:
        if name not in _FIELDS:
            raise AttributeError(name)
        if name not in self._cache:
            value = _FIELDS[name](self._broker, self._consumers, self)
            self._cache[name] = ReadOnlyMap(value) if isinstance(value, dict) else value
        return self._cache[name]

    def __repr__(self) -> str:
        return "<state>"


def server_config(workers: list[str]) -> dict[str, object]:
    """The original's ``config`` keys that tools read, for this server.

    ``workers`` lists this server's MQKS listeners as ``host:port:port``
    (``MQKSFactory.listening``); the host and ports of the first one stand
    for the original's ``host``, ``port_for_workers`` and ``port_for_clients``.
    """
    host, _, port = workers[0].rpartition(":") if workers else ("", "", "0")
    host = host.rpartition(":")[0]
    return {
        "workers": list(workers),
        "host": host,
        "port_for_workers": int(port),
        "port_for_clients": int(port),
        "logger_name": "mqks.server",
        "grep": "",
        "id_length": 24,
    }


def stats_names(
    broker: Any,
    consumers: Mapping[bytes, Any],
    connection_id: int,
    request_id: bytes,
    workers: list[str],
) -> dict[str, object]:
    """The names ``_eval`` code sees: ``state``, ``config``, ``WORKERS``, ``request``.

    ``consumers`` is every MQKS consumer by its (server-wide) id.  There is one
    worker, so ``WORKERS`` is 1 and stats.py asks it exactly once.
    """
    return {
        "state": StateView(broker, consumers),
        "config": ReadOnlyMap(server_config(workers)),
        "WORKERS": 1,
        "request": ReadOnlyMap({"client": str(connection_id), "id": _s(request_id)}),
    }
