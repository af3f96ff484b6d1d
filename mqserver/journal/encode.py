"""Turning captured journal events into JSON lines, one batch at a time.

The broker only appends small tuples of plain values (``Event``); everything
costly happens here, once per batch and normally in the journal's own
process: no ``json.dumps`` per record, a per-second cache of ISO timestamp
prefixes, constant fields encoded once, and a cache of encoded names.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii as quote
from typing import Any

from mqserver.journal.schema import (
    ACKED,
    DELIVERED,
    PUBLISHED,
    REASON_AUTO_ACK,
    SLIM_ACKED,
    SLIM_AUTO_ACKED,
    SLIM_DELIVERED,
    SLIM_DELIVERED_FIRST,
    SLIM_KIND,
    SLIM_PUBLISHED,
    SLIM_PUBLISHED_PLAIN,
    VERSION,
)

Event = tuple[Any, ...]
"""Plain values only (bytes, str, int, float, None, a str->str dict), captured
when the event happened: they cross to the journal process with ``marshal``.

Full (14): ``(event, ts, queue, message_id, publish_ts, delivery_count,
consumer, connection, protocol, size, expires_at, reason, headers, extra)``;
``extra`` is the body on ``published`` and the consumer's ``key`` on
consumer and requeue records.

Slim, for the three records W1 writes per message (the broker's hot path
builds less; the rest is implied, or joined here from ``consumer_opened``
and the delivery).  The first value is a small int: the tag of
``mqserver.journal.schema``, plus the consumer's ``key`` (a multiple
of 8, see ``SLIM_KIND``) in the records a consumer causes:

* published, new message (9): ``(SLIM_PUBLISHED, ts, queue, message_id,
  protocol, size, expires_at, headers, body)``; ``protocol`` comes as bytes
  (see ``Journal.sources``)
* published, plain (6): ``(SLIM_PUBLISHED_PLAIN, ts, queue, message_id,
  protocol, size)``: no expiry, no headers, body not journaled
* delivered (7): ``(key + SLIM_DELIVERED, ts, message_id, publish_ts,
  delivery_count, size, expires_at)``
* delivered, first (5): ``(key + SLIM_DELIVERED_FIRST, ts, message_id,
  publish_ts, size)``: delivery count 1, no expiry
* acked (3): ``(key + SLIM_ACKED, ts, message_id)``, or ``SLIM_AUTO_ACKED``
  for a delivery without manual ack (reason ``auto_ack``)

The broker hands them over flattened, one list of values for a whole batch
(see ``mqserver.journal.writer``); ``unflatten`` cuts it back into events by
each event's width.
"""

WIDTHS = {SLIM_PUBLISHED: 9, SLIM_PUBLISHED_PLAIN: 6, SLIM_DELIVERED: 7, SLIM_DELIVERED_FIRST: 5,
          SLIM_ACKED: 3, SLIM_AUTO_ACKED: 3}
"""Width of the slim events; every other event is ``EVENT_WIDTH`` wide."""

_UNKNOWN_CONSUMER = (None, None, None, None)
_KEYED = frozenset(("consumer_opened", "consumer_closed", "requeued"))

EVENT_WIDTH = 14


def unflatten(values: list[Any]) -> Iterator[Event]:
    """Events from the flat list the broker built with ``list.extend``."""
    widths = WIDTHS
    start, end = 0, len(values)
    while start < end:
        tag = values[start]
        stop = start + (widths[tag & SLIM_KIND] if tag.__class__ is int else EVENT_WIDTH)
        yield tuple(values[start:stop])
        start = stop


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Encoder:
    """Assigns ``seq`` and renders events as JSON lines, grouped by UTC date."""

    def __init__(self, node: str, bodies: bool = False, next_seq: int = 1) -> None:
        self.bodies = bodies
        self.next_seq = next_seq
        self._head = f'{{"v":{VERSION},"node":{quote(node)},"seq":'
        self._prefixes: dict[int, str] = {}
        self._names: dict[Any, str] = {}
        # consumer key -> (queue, consumer id, connection id, protocol)
        self._consumers: dict[int, tuple[Any, ...]] = {}
        # consumer key -> message id -> (publish_ts, delivery_count, size, expires_at)
        self._held: dict[int, dict[bytes, tuple[Any, ...]]] = {}

    def expand(self, events: Iterable[Event]) -> Iterator[Event]:
        """Full records from full and slim ones, tracking consumers and deliveries."""
        consumers = self._consumers
        held = self._held
        for record in events:
            tag = record[0]
            if tag.__class__ is int:
                kind = tag & SLIM_KIND
                key = tag - kind
                if kind in (SLIM_DELIVERED_FIRST, SLIM_DELIVERED):
                    if kind == SLIM_DELIVERED_FIRST:
                        _, ts, message_id, publish_ts, size = record
                        count, expires_at = 1, None
                    else:
                        _, ts, message_id, publish_ts, count, size, expires_at = record
                    queue, consumer, connection, protocol = consumers.get(key, _UNKNOWN_CONSUMER)
                    deliveries = held.get(key)
                    if deliveries is None:
                        deliveries = held[key] = {}
                    deliveries[message_id] = (publish_ts, count, size, expires_at)
                    yield (DELIVERED, ts, queue, message_id, publish_ts, count, consumer,
                           connection, protocol, size, expires_at, None, None, None)
                elif kind == SLIM_PUBLISHED_PLAIN:
                    _, ts, queue, message_id, protocol, size = record
                    yield (PUBLISHED, ts, queue, message_id, ts, 0, None, None, protocol, size,
                           None, None, None, None)
                elif kind == SLIM_PUBLISHED:
                    _, ts, queue, message_id, protocol, size, expires_at, headers, body = record
                    yield (PUBLISHED, ts, queue, message_id, ts, 0, None, None, protocol, size,
                           expires_at, None, headers, body)
                else:  # SLIM_ACKED or SLIM_AUTO_ACKED: unflatten knows no other
                    _, ts, message_id = record
                    queue, consumer, connection, protocol = consumers.get(key, _UNKNOWN_CONSUMER)
                    deliveries = held.get(key)
                    found = deliveries.pop(message_id, None) if deliveries else None
                    # not seen delivered (cannot happen within one journal run): no message fields
                    publish_ts, count, size, expires_at = found or (ts, 0, 0, None)
                    yield (ACKED, ts, queue, message_id, publish_ts, count, consumer, connection,
                           protocol, size, expires_at,
                           REASON_AUTO_ACK if kind == SLIM_AUTO_ACKED else None, None, None)
            elif tag in _KEYED:
                event, key = tag, record[13]
                if event == "consumer_opened":
                    consumers[key] = (record[2], record[6], record[7], record[8])
                    held[key] = {}
                elif event == "consumer_closed":
                    consumers.pop(key, None)
                    held.pop(key, None)
                else:
                    deliveries = held.get(key)
                    if deliveries:
                        deliveries.pop(record[3], None)
                yield (*record[:13], None)
            else:
                yield record

    def _iso(self, ts: float) -> str:
        second = int(ts)
        prefix = self._prefixes.get(second)
        if prefix is None:
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._prefixes[second] = prefix
        return f"{prefix}.{int((ts - second) * 1_000_000):06d}Z"

    def _name(self, name: bytes | str) -> str:
        """JSON string of a queue name or protocol, cached: there are few of them."""
        encoded = self._names.get(name)
        if encoded is None:
            if len(self._names) > 100_000:
                self._names.clear()
            encoded = self._names[name] = quote(_text(name))
        return encoded

    def _consumer(self, connection: int, consumer: bytes) -> str:
        key = (connection, consumer)
        encoded = self._names.get(key)
        if encoded is None:
            encoded = self._names[key] = (
                f',"connection":{connection},"consumer":{quote(f"{connection}/{_text(consumer)}")}')
        return encoded

    def encode(self, events: Iterable[Event]) -> list[tuple[str, str, int, int]]:
        """``(date, text, first_seq, count)`` chunks, one per UTC date in the batch.

        The loop is written flat (locals, f-strings, caches) because it runs
        for every record: about 1.5 us each instead of 4 with helper calls.
        """
        chunks: list[tuple[str, str, int, int]] = []
        lines: list[str] = []
        append = lines.append
        date = "\0"  # matches no timestamp
        first = seq = self.next_seq
        head = self._head
        bodies = self.bodies
        names = self._names
        name = self._name
        prefixes = self._prefixes
        iso = self._iso
        for (event, ts, queue, message_id, publish_ts, count, consumer, connection,
             protocol, size, expires_at, reason, headers, body) in self.expand(events):
            second = int(ts)
            prefix = prefixes.get(second)
            if prefix is None:
                prefix = iso(ts)[:19]
            if not prefix.startswith(date):
                if lines:
                    chunks.append((date, "".join(lines), first, seq - first))
                    lines = []
                    append = lines.append
                date, first = prefix[:10], seq
            micros = int((ts - second) * 1_000_000)
            line = f'{head}{seq},"ts":"{prefix}.{micros:06d}Z","event":"{event}"'
            seq += 1
            if queue is not None:
                line += f',"queue":{names.get(queue) or name(queue)}'
            if protocol is not None:
                line += f',"protocol":{names.get(protocol) or name(protocol)}'
            if connection is not None:
                if consumer is not None:
                    key = (connection, consumer)
                    line += names.get(key) or self._consumer(connection, consumer)
                else:
                    line += f',"connection":{connection}'
            if message_id is not None:
                published = int(publish_ts)
                published_prefix = prefixes.get(published) or iso(publish_ts)[:19]
                line += (
                    f',"message_id":{quote(message_id.decode("utf-8", "replace"))}'
                    f',"publish_ts":"{published_prefix}.'
                    f'{int((publish_ts - published) * 1_000_000):06d}Z"'
                    f',"delivery_count":{count},"size":{size}'
                )
                if expires_at is not None:
                    line += f',"ttl_ms":{round((expires_at - publish_ts) * 1000)}'
                if headers:
                    line += ',"headers":{' + ",".join(
                        f"{quote(str(k))}:{quote(str(v))}" for k, v in headers.items()) + "}"
                if bodies and body:
                    line += f',"body":"{base64.b64encode(body).decode("ascii")}"'
            if reason is not None:
                line += f',"reason":{quote(_text(reason))}'
            append(line + "}\n")
        if lines:
            chunks.append((date, "".join(lines), first, seq - first))
        self.next_seq = seq
        return chunks
