# -*- test-case-name: tests.unit.test_journal_encode -*-
"""Turning captured journal events into JSON lines, one batch at a time.

The broker only appends small tuples of plain values (``Event``); everything
costly happens here, once per batch and normally in the journal's own
process, which runs on the other core.  It is not free there: at W1's rate
it needed about three times the broker's CPU per message, and what it takes
from the machine the broker and its clients lose.  So the common records are
written by one f-string each, straight from the flat batch: timestamps are
rendered once per distinct value, a consumer's fields once per consumer, a
delivery's message fields once for the delivery and its ack, and names once.
"""

from __future__ import annotations

import base64
import time
from json.encoder import encode_basestring_ascii as quote
from typing import Any

from mqserver.journal.schema import (
    CONSUMER_CLOSED,
    CONSUMER_OPENED,
    PUBLISHED,
    PUBLISHER_KEY,
    REQUEUED,
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
* published, plain (4): ``(key + SLIM_PUBLISHED_PLAIN, ts, message_id,
  size)``: no expiry, no headers, body not journaled; the key stands for a
  queue and protocol, told by a ``PUBLISHER_KEY`` record before its first use
* delivered (7): ``(key + SLIM_DELIVERED, ts, message_id, publish_ts,
  delivery_count, size, expires_at)``
* delivered, first (5): ``(key + SLIM_DELIVERED_FIRST, ts, message_id,
  publish_ts, size)``: delivery count 1, no expiry
* acked (3): ``(key + SLIM_ACKED, ts, message_id)``, or ``SLIM_AUTO_ACKED``
  for a delivery without manual ack (reason ``auto_ack``)

The broker hands them over flattened, one list of values for a whole batch
(see ``mqserver.journal.writer``); ``Encoder.encode`` walks it by each
event's width.
"""

EVENT_WIDTH = 14
"""Width of every event that is not slim (its first value is its name)."""

_DAY = 86400


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Encoder:
    """Assigns ``seq`` and renders events as JSON lines, grouped by UTC date."""

    def __init__(self, node: str, bodies: bool = False, next_seq: int = 1) -> None:
        self.bodies = bodies
        self.next_seq = next_seq
        self._head = f'{{"v":{VERSION},"node":{quote(node)},"seq":'
        self._prefixes: dict[int, str] = {}  # second -> "YYYY-MM-DDTHH:MM:SS"
        self._stamps: dict[float, str] = {}  # ts -> its ISO text (the broker shares them)
        self._names: dict[Any, str] = {}  # (queue, protocol, connection, consumer) -> fields
        # key (a consumer's, or a queue and protocol's) -> the fields it stands for
        self._consumers: dict[int, str] = {}
        # consumer key -> message id -> the delivery's message fields, for the ack
        self._held: dict[int, dict[bytes, str]] = {}

    def _stamp(self, ts: float) -> str:
        """ISO-8601 UTC with microseconds, remembered for the next record at ``ts``."""
        second = int(ts)
        prefix = self._prefixes.get(second)
        if prefix is None:
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            prefix = self._prefixes[second] = time.strftime(
                "%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        text = f"{prefix}.{int((ts - second) * 1_000_000):06d}Z"
        if len(self._stamps) >= 65536:
            self._stamps.clear()
        self._stamps[ts] = text
        return text

    def _where(self, queue: Any, protocol: Any, connection: Any = None,
               consumer: Any = None) -> str:
        """The queue, protocol, connection and consumer fields (those not None)."""
        key = (queue, protocol, connection, consumer)
        text = self._names.get(key)
        if text is None:
            text = ""
            if queue is not None:
                text += f',"queue":{quote(_text(queue))}'
            if protocol is not None:
                text += f',"protocol":{quote(_text(protocol))}'
            if connection is not None:
                text += f',"connection":{connection}'
                if consumer is not None:
                    text += f',"consumer":{quote(f"{connection}/{_text(consumer)}")}'
            if len(self._names) > 100_000:
                self._names.clear()
            self._names[key] = text
        return text

    def _message(self, message_id: bytes, publish_ts: float, count: int, size: int,
                 expires_at: float | None) -> str:
        """A message's fields, from its id to its time to live."""
        text = (f',"message_id":{quote(message_id.decode("utf-8", "replace"))}'
                f',"publish_ts":"{self._stamps.get(publish_ts) or self._stamp(publish_ts)}"'
                f',"delivery_count":{count},"size":{size}')
        if expires_at is not None:
            text += f',"ttl_ms":{round((expires_at - publish_ts) * 1000)}'
        return text

    def _extras(self, headers: dict[str, str] | None, body: bytes | None) -> str:
        text = ""
        if headers:
            text += ',"headers":{' + ",".join(
                f"{quote(str(k))}:{quote(str(v))}" for k, v in headers.items()) + "}"
        if self.bodies and body:
            text += f',"body":"{base64.b64encode(body).decode("ascii")}"'
        return text

    def encode(self, values: list[Any]) -> list[tuple[str, str, int, int]]:
        """``(date, text, first_seq, count)`` chunks, one per UTC date in the batch.

        ``values`` is the flat batch the broker built (see the module doc).
        The loop is written flat, with a branch per slim record, because it
        runs for every record; anything else goes through ``_full``.
        """
        chunks: list[tuple[str, str, int, int]] = []
        lines: list[str] = []
        append = lines.append
        first = seq = self.next_seq
        head = self._head
        stamps, stamp = self._stamps, self._stamp
        where, message = self._where, self._message
        consumers, held = self._consumers, self._held
        date, day_start, day_end = "", 0.0, -1.0  # no ts is in this day
        i, end = 0, len(values)
        while i < end:
            tag, ts = values[i], values[i + 1]
            ts_text = stamps.get(ts) or stamp(ts)
            if not day_start <= ts < day_end:
                if lines:
                    chunks.append((date, "".join(lines), first, seq - first))
                    lines = []
                    append = lines.append
                day_start = float(int(ts) // _DAY * _DAY)
                day_end = day_start + _DAY
                date, first = ts_text[:10], seq
            line = f'{head}{seq},"ts":"{ts_text}","event":'
            if tag.__class__ is not int:
                i, full = self._full(values, i, line)
                if full is None:
                    continue
                line = full
            else:
                kind = tag & SLIM_KIND
                key = tag - kind
                if kind in (SLIM_ACKED, SLIM_AUTO_ACKED):
                    message_id = values[i + 2]
                    i += 3
                    deliveries = held.get(key)
                    fields = deliveries.pop(message_id, None) if deliveries else None
                    # not seen delivered (cannot happen within one journal run)
                    fields = fields or message(message_id, ts, 0, 0, None)
                    reason = ',"reason":"auto_ack"' if kind == SLIM_AUTO_ACKED else ""
                    line += f'"acked"{consumers.get(key, "")}{fields}{reason}}}\n'
                elif kind in (SLIM_DELIVERED_FIRST, SLIM_DELIVERED):
                    if kind == SLIM_DELIVERED_FIRST:
                        _, _, message_id, publish_ts, size = values[i:i + 5]
                        count, expires_at = 1, None
                        i += 5
                    else:
                        _, _, message_id, publish_ts, count, size, expires_at = values[i:i + 7]
                        i += 7
                    fields = message(message_id, publish_ts, count, size, expires_at)
                    deliveries = held.get(key)
                    if deliveries is None:
                        deliveries = held[key] = {}
                    deliveries[message_id] = fields
                    line += f'"delivered"{consumers.get(key, "")}{fields}}}\n'
                elif kind == SLIM_PUBLISHED_PLAIN:
                    message_id, size = values[i + 2], values[i + 3]
                    i += 4
                    line += (f'"published"{consumers.get(key, "")}'
                             f',"message_id":{quote(message_id.decode("utf-8", "replace"))}'
                             f',"publish_ts":"{ts_text}","delivery_count":0,"size":{size}}}\n')
                elif kind == SLIM_PUBLISHED:
                    _, _, queue, message_id, protocol, size, expires_at, headers, body = (
                        values[i:i + 9])
                    i += 9
                    line += (f'"published"{where(queue, protocol)}'
                             f'{message(message_id, ts, 0, size, expires_at)}'
                             f'{self._extras(headers, body)}}}\n')
                else:
                    raise ValueError(f"unknown slim journal record {tag!r}")
            seq += 1
            append(line)
        if lines:
            chunks.append((date, "".join(lines), first, seq - first))
        self.next_seq = seq
        return chunks

    def _full(self, values: list[Any], i: int, line: str) -> tuple[int, str | None]:
        """The full event at ``values[i]`` (see ``Event``): where the next one
        starts and its line, which begins as ``line`` (None: not an event).
        Consumer and publisher-key records teach the slim ones their fields."""
        if len(values) - i < EVENT_WIDTH:
            raise ValueError(f"journal batch ends inside a {values[i]!r} record")
        (event, _, queue, message_id, publish_ts, count, consumer, connection, protocol, size,
         expires_at, reason, headers, extra) = values[i:i + EVENT_WIDTH]
        fields = self._where(queue, protocol, connection, consumer)
        if event == PUBLISHER_KEY:
            if queue is None:
                self._consumers.pop(extra, None)
            else:
                self._consumers[extra] = fields
            return i + EVENT_WIDTH, None
        if event == CONSUMER_OPENED:
            self._consumers[extra] = fields
            self._held[extra] = {}
        elif event == CONSUMER_CLOSED:
            self._consumers.pop(extra, None)
            self._held.pop(extra, None)
        elif event == REQUEUED:
            deliveries = self._held.get(extra)
            if deliveries:
                deliveries.pop(message_id, None)
        line += f"{quote(event)}{fields}"
        if message_id is not None:
            line += self._message(message_id, publish_ts, count, size, expires_at)
            # only a published record's extra is a body (the others' is a consumer key)
            line += self._extras(headers, extra if event == PUBLISHED else None)
        if reason is not None:
            line += f',"reason":{quote(_text(reason))}'
        return i + EVENT_WIDTH, line + "}\n"
