"""The journal's record format, in one place for the server and the Spark pipeline.

Pure Python on purpose: the broker imports it without pyspark, and the
pipeline builds its Spark schema from the same list, so the two cannot drift.
"""

from __future__ import annotations

VERSION = 2
"""Value of every record's ``v`` field; bumped when a field changes meaning.

2: every copy that leaves its queue gets a terminal event: ``moved``,
``purged`` and ``deleted`` are new, and ``consumer_closed`` says why when its
queue went (version 1 journaled none of them, so its moved, purged and
deleted copies look still queued)."""

# Event names (the ``event`` field).
PUBLISHED = "published"
DELIVERED = "delivered"
ACKED = "acked"
REQUEUED = "requeued"
DEAD_LETTERED = "dead_lettered"
EXPIRED = "expired"
MOVED = "moved"
"""An operator moved this copy to another queue (``POST /api/queues/Q/move``); a
``published`` record with reason ``moved`` tells its arrival in the target."""
PURGED = "purged"
DELETED = "deleted"
CONSUMER_OPENED = "consumer_opened"
CONSUMER_CLOSED = "consumer_closed"
CONNECTION_OPENED = "connection_opened"
CONNECTION_CLOSED = "connection_closed"
PUBLISHER_KEY = "publisher_key"
"""Not an event, and the journal process writes no line for it: it says which
queue and protocol a key stands for in the plain published records that carry
it (see ``mqserver.journal.encode``); with no queue, the key is forgotten."""

# The broker's slim captures of the per-message events (see
# ``mqserver.journal.encode``): small ints, which cost the broker less to hand
# over than names.  Journal files only ever hold event names.
SLIM_PUBLISHED = 0
SLIM_DELIVERED = 1
SLIM_ACKED = 2
SLIM_AUTO_ACKED = 3
# the common cases, with fewer values: no expiry, headers or body (the
# queue and protocol ride in the key, see PUBLISHER_KEY); a first delivery
# without expiry
SLIM_PUBLISHED_PLAIN = 4
SLIM_DELIVERED_FIRST = 5
SLIM_KIND = 7
"""Mask of the tag in a slim record's first value.  Keys are multiples of 8,
and the records a consumer (or, plain published ones, a queue and protocol)
causes carry ``key + tag`` there
(an addition, which Python 3.11 specializes for ints, where ``|`` is not):
one value less to hand over per record."""

MESSAGE_EVENTS = (PUBLISHED, DELIVERED, ACKED, REQUEUED, DEAD_LETTERED, EXPIRED, MOVED, PURGED,
                  DELETED)
TERMINAL_EVENTS = (ACKED, DEAD_LETTERED, EXPIRED, MOVED, PURGED, DELETED)
"""Events after which this copy of a message is gone from its queue: every
copy that leaves a queue gets exactly one of them."""

# Reasons (the ``reason`` field) the broker writes itself.
REASON_REJECTED = "rejected"
REASON_CONSUMER_GONE = "consumer_gone"
REASON_AUTO_ACK = "auto_ack"
REASON_EXPIRED = "expired"
REASON_MOVED = "moved"
REASON_QUEUE_DELETED = "queue_deleted"
"""``deleted`` and ``consumer_closed``: the queue was deleted (HTTP, MQKS delete_queue)."""
REASON_UNUSED = "unused"
"""``deleted``: the queue's delete-when-unused delay ran out (it had no consumers left)."""

FIELDS: tuple[tuple[str, str, str], ...] = (
    ("v", "INT", "schema version"),
    ("seq", "BIGINT", "per-node journal sequence, +1 per record, continues across restarts"),
    ("node", "STRING", "broker node name (--journal-node, default the host name)"),
    ("ts", "TIMESTAMP", "broker time of the event, ISO-8601 UTC with microseconds"),
    ("event", "STRING", "one of the event names above"),
    ("queue", "STRING", "queue name"),
    ("protocol", "STRING", "protocol of the publisher (published) or of the consumer"),
    ("message_id", "STRING", "message id as the client gave it (not unique across queues)"),
    ("publish_ts", "TIMESTAMP", "when this copy entered its queue; latency needs no join"),
    ("delivery_count", "INT",
     "deliveries of this copy so far: delivered/acked count this one, others the earlier ones"),
    ("consumer", "STRING", "consumer as '<connection>/<consumer id>'"),
    ("connection", "BIGINT", "broker connection id"),
    ("size", "INT", "body size in bytes"),
    ("ttl_ms", "BIGINT", "time to live from publish_ts, when the message has one"),
    ("reason", "STRING",
     "why: rejected, consumer_gone, auto_ack, expired, maxlen, retries, moved, queue_deleted, "
     "unused, or a client's dead-letter reason"),
    ("headers", "MAP<STRING,STRING>", "message headers, when it has any"),
    ("body", "BINARY", "base64 body, only with --journal-bodies"),
)

SPARK_DDL = ", ".join(f"`{name}` {kind}" for name, kind, _ in FIELDS)
"""The schema for ``spark.read.schema(SPARK_DDL).json(...)``."""

FIELD_NAMES = tuple(name for name, _, _ in FIELDS)

SEGMENT_PREFIX = "seg-"
SEALED_SUFFIX = ".jsonl"
OPEN_SUFFIX = ".jsonl.open"
DATE_DIR = "date="


def segment_name(node: str, first_seq: int) -> str:
    """File name of a sealed segment; zero-padded so names sort by seq."""
    return f"{SEGMENT_PREFIX}{node}-{first_seq:016d}{SEALED_SUFFIX}"


def parse_segment_name(name: str) -> tuple[str, int] | None:
    """``(node, first_seq)`` of a segment file name (sealed or open), else None."""
    if not name.startswith(SEGMENT_PREFIX):
        return None
    stem = name[len(SEGMENT_PREFIX):]
    for suffix in (OPEN_SUFFIX, SEALED_SUFFIX):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    else:
        return None
    node, _, seq = stem.rpartition("-")
    if not node or not seq.isdigit():
        return None
    return node, int(seq)
