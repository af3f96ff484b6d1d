# -*- test-case-name: tests.unit.test_storage_memory -*-
"""The memory backend: state lives in this object only.

Nothing survives a process restart, so the broker treats it as not durable
and sends it no ops.  Driven directly (as the contract suite and tests do) it
is a faithful store: ``apply`` then ``open`` on the same object gives the
state back, which makes it the reference the durable backends are tested
against.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from mqserver.interfaces import IMessageStore
from mqserver.model import (
    BIND,
    DECLARE,
    DELETE,
    DELETE_QUEUE,
    ENQUEUE,
    PUT,
    REMOVE,
    REQUEUE,
    UNBIND,
    Message,
    QueueOptions,
    Recovered,
    RecoveredQueue,
)


class StoreClosedError(Exception):
    """An operation was attempted on a store that is not open."""


@implementer(IMessageStore)
class MemoryStore:
    durable = False

    def __init__(self) -> None:
        self._options: dict[bytes, QueueOptions] = {}
        self._bindings: dict[bytes, set[bytes]] = {}
        # queue -> seq -> message (copies, so later broker changes do not leak in)
        self._messages: dict[bytes, dict[int, Message]] = {}
        self._records: dict[bytes, dict[bytes, bytes]] = {}
        self._next_seq = 1
        self.is_open = False

    def open(self) -> Deferred[Recovered]:
        self.is_open = True
        recovered = Recovered(
            next_seq=self._next_seq,
            records={ns: dict(kv) for ns, kv in self._records.items() if kv},
        )
        for name in self._options.keys() | self._messages.keys() | self._bindings.keys():
            messages = sorted(self._messages.get(name, {}).values(), key=lambda m: m.seq)
            recovered.queues[name] = RecoveredQueue(
                name,
                self._options.get(name, QueueOptions()),
                set(self._bindings.get(name, ())),
                [_copy(m) for m in messages],
            )
        return succeed(recovered)

    def apply(self, ops: list[tuple[Any, ...]]) -> Deferred[None]:
        if not self.is_open:
            return fail(StoreClosedError("apply() on a closed store"))
        for op in ops:
            self._apply_one(op)
        return succeed(None)

    def _apply_one(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == ENQUEUE:
            message = op[1]
            self._queue(message.queue)[message.seq] = _copy(message)
            self._seen(message.seq)
        elif kind == REMOVE:
            self._messages.get(op[1], {}).pop(op[2], None)
        elif kind == REQUEUE:
            message, old_seq = op[1], op[2]
            self._messages.get(message.queue, {}).pop(old_seq, None)
            self._queue(message.queue)[message.seq] = _copy(message)
            self._seen(message.seq)
        elif kind == DECLARE:
            self._options[op[1]] = replace(op[2])
            self._queue(op[1])
        elif kind == BIND:
            self._bindings.setdefault(op[1], set()).add(op[2])
        elif kind == UNBIND:
            self._bindings.get(op[1], set()).discard(op[2])
        elif kind == PUT:
            self._records.setdefault(op[1], {})[op[2]] = op[3]
        elif kind == DELETE:
            self._records.get(op[1], {}).pop(op[2], None)
        elif kind == DELETE_QUEUE:
            self._options.pop(op[1], None)
            self._bindings.pop(op[1], None)
            self._messages.pop(op[1], None)
        else:
            raise ValueError(f"unknown storage op {kind!r}")

    def _queue(self, name: bytes) -> dict[int, Message]:
        return self._messages.setdefault(name, {})

    def _seen(self, seq: int) -> None:
        if seq >= self._next_seq:
            self._next_seq = seq + 1

    def close(self) -> Deferred[None]:
        self.is_open = False
        return succeed(None)


def _copy(message: Message) -> Message:
    copy = message.copy_to(message.queue, message.seq)
    if message.headers is not None:
        copy.headers = dict(message.headers)
    return copy
