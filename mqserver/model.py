# -*- test-case-name: tests.unit.test_model -*-
"""Plain records shared by the broker core, the storage backends and the protocols.

Names and ids are bytes everywhere inside the broker: the wire protocols deal in
bytes, so decoding happens only at the edges that need text (HTTP, logs).  The
records use ``__slots__`` because a broker holds millions of messages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqserver.packed import Backlog

# Storage operations.  A batch is a list of plain tuples, tagged by the first
# element; tuples keep the hot path free of per-message object construction.
#   (ENQUEUE, message)              a new ready message
#   (REMOVE, queue, seq)            acked, dead-lettered, expired or dropped
#   (REQUEUE, message, old_seq)     back to ready: new seq, retry, expires_at
#   (DECLARE, queue, QueueOptions)  create a queue or change its options
#   (BIND, queue, event)            (UNBIND, queue, event)
#   (DELETE_QUEUE, queue)           the queue, its bindings and its messages
#   (PUT, namespace, key, value)    a record other than a message (eMQP
#                                   schedules, ...); all three are bytes
#   (DELETE, namespace, key)
ENQUEUE = "enqueue"
REMOVE = "remove"
REQUEUE = "requeue"
DECLARE = "declare"
BIND = "bind"
UNBIND = "unbind"
DELETE_QUEUE = "delete_queue"
PUT = "put"
DELETE = "delete"
OP_KINDS = (ENQUEUE, REMOVE, REQUEUE, DECLARE, BIND, UNBIND, DELETE_QUEUE, PUT, DELETE)


def new_message_id() -> bytes:
    """A server-generated id: 32 lowercase hex characters, as PHPMQ makes them."""
    return os.urandom(16).hex().encode("ascii")


class Message:
    """One copy of a message in one queue.

    ``seq`` orders a queue (smaller is older) and identifies the copy in
    storage; a requeue to the tail gives it a new one.  ``id`` is the id the
    client sees, which a protocol may bring (MQKS, eMQP) and which need not be
    unique.
    """

    __slots__ = (
        "body",
        "created_at",
        "event",
        "expires_at",
        "headers",
        "id",
        "queue",
        "retry",
        "seq",
        "source",
    )

    def __init__(
        self,
        id: bytes,
        queue: bytes,
        body: bytes,
        seq: int = 0,
        event: bytes | None = None,
        headers: dict[str, str] | None = None,
        created_at: float = 0.0,
        expires_at: float | None = None,
        retry: int = 0,
        source: str | None = None,
    ) -> None:
        self.id = id
        self.queue = queue
        self.body = body
        self.seq = seq
        self.event = event
        self.headers = headers
        self.created_at = created_at
        self.expires_at = expires_at
        self.retry = retry
        self.source = source

    def copy_to(self, queue: bytes, seq: int) -> Message:
        """The same message as a new copy in another queue (fan-out, dead-lettering)."""
        return Message(
            self.id, queue, self.body, seq, self.event, self.headers,
            self.created_at, self.expires_at, self.retry, self.source,
        )

    def as_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _MESSAGE_FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self.as_tuple() == other.as_tuple()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Message {self.id!r} queue={self.queue!r} seq={self.seq} retry={self.retry}>"


_MESSAGE_FIELDS = (
    "id", "queue", "body", "seq", "event", "headers",
    "created_at", "expires_at", "retry", "source",
)


@dataclass(frozen=True)
class QueueOptions:
    """Settings a queue carries across restarts.

    ``delete_when_unused``: None keeps the queue; 0 deletes it as soon as its
    last consumer leaves; N deletes it N seconds later unless re-consumed.
    ``delete_when_unused_bare`` records that MQKS was given the flag without a
    value, which it echoes back without one.  ``max_length`` and ``overflow``
    (``drop-head`` or ``reject-publish``): None means the server-wide default
    (see ``mqserver.broker.limits``).
    """

    delete_when_unused: float | None = None
    delete_when_unused_bare: bool = False
    dead_letter: bytes | None = None
    max_length: int | None = None
    default_ttl: float | None = None
    overflow: str | None = None


@dataclass
class RecoveredQueue:
    """One queue as a store rebuilt it: ready messages in order, bindings, options.

    ``messages`` is a list (any order: the broker sorts it by seq), or a
    ``mqserver.packed.Backlog`` filled in seq order, which a store with a
    big backlog uses so the recovered queue is packed as it is read.
    """

    name: bytes
    options: QueueOptions = field(default_factory=QueueOptions)
    bindings: set[bytes] = field(default_factory=set)
    messages: list[Message] | Backlog = field(default_factory=list)


@dataclass
class Recovered:
    """What ``IMessageStore.open`` fires with.

    ``records`` holds what PUT ops stored and DELETE ops did not remove:
    namespace -> key -> value.
    """

    queues: dict[bytes, RecoveredQueue] = field(default_factory=dict)
    next_seq: int = 1
    records: dict[bytes, dict[bytes, bytes]] = field(default_factory=dict)
