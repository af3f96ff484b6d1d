# -*- test-case-name: tests.unit.test_saving -*-
"""The broker's durable state as a ``Recovered``: what a clean stop leaves in a snapshot.

The same state ``mqserver.durability.broker_state`` compares (every queue with
its options and bindings; its messages in seq order, in-flight ones at the
place their seq gives them; the records; the next seq), in the form a
store's ``open`` fires with, so a restart from the snapshot loads it as it
loads a replay.  A packed queue's chunks are taken as they are: a million
ready messages cost a thousand references, not a million objects.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from mqserver.broker.ready import PackedReady
from mqserver.model import Message, Recovered, RecoveredQueue
from mqserver.packed import Backlog, Chunk


def durable_state(broker: Any) -> Recovered:
    """``broker``'s state as a store would recover it (see the module docstring)."""
    recovered = Recovered(
        next_seq=broker._seq,
        records={namespace: dict(values) for namespace, values in broker.records.items()
                 if values},
    )
    for name, queue in broker.queues.items():
        in_flight = [message for consumer in queue.consumers
                     for message in consumer.unacked.values()]
        recovered.queues[name] = RecoveredQueue(
            name, queue.options, broker.bindings.events_of(name),
            _backlog(queue.ready, in_flight),
        )
    return recovered


def _backlog(ready: deque[Message] | PackedReady, in_flight: list[Message]) -> Backlog:
    """The queue's messages as chunks alone: packed here, on the reactor thread, so
    the store's thread reads nothing the broker could still change."""
    backlog = Backlog()
    if in_flight:  # rare at a stop: connections are closed first, which requeues them
        backlog.extend(sorted([*ready, *in_flight], key=_seq))
    elif isinstance(ready, PackedReady):
        backlog.extend(ready.head)
        for chunk in ready.chunks:
            backlog.append_chunk(chunk)
        backlog.extend(ready.tail)
    else:
        backlog.extend(ready)
    if backlog.tail:
        tail, backlog.tail = backlog.tail, []
        backlog.append_chunk(Chunk(tail))
    return backlog


def _seq(message: Message) -> int:
    return message.seq
