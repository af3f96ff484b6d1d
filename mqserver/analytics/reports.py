"""The reports: pure DataFrame -> DataFrame functions over journal events.

A copy of a message is identified by ``(node, queue, message_id,
publish_ts)``: client ids need not be unique, but one id published twice into
one queue in the same microsecond is not a case worth a join on seq.
Latencies and ages are in milliseconds.  Percentiles are exact (``percentile``,
linear interpolation), so a brute-force check in tests can match them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqserver.journal.schema import (
    ACKED,
    DEAD_LETTERED,
    DELIVERED,
    EXPIRED,
    MESSAGE_EVENTS,
    PUBLISHED,
    REQUEUED,
    TERMINAL_EVENTS,
)

KEY = ["node", "queue", "message_id", "publish_ts"]
PERCENTILES = (0.5, 0.95, 0.99)


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def _ms(later: str, earlier: str) -> Any:
    fn = _f()
    return (fn.unix_micros(fn.col(later)) - fn.unix_micros(fn.col(earlier))) / 1000.0


def _percentiles(column: str) -> list[Any]:
    fn = _f()
    values = fn.percentile(fn.col(column), list(PERCENTILES))
    return [values[i].alias(f"p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)]


def throughput(events: Any) -> Any:
    """Per minute x queue x protocol x event: records and body bytes."""
    fn = _f()
    return (
        events.where(fn.col("event").isin(*MESSAGE_EVENTS))
        .groupBy(fn.date_trunc("minute", "ts").alias("minute"), "queue", "protocol", "event")
        .agg(fn.count("*").alias("count"), fn.coalesce(fn.sum("size"), fn.lit(0)).alias("bytes"))
    )


def latency_samples(events: Any) -> Any:
    """One row per first delivery (``publish_to_deliver``) and per ack
    (``publish_to_ack``): queue, kind, ``latency_ms``."""
    fn = _f()
    first = events.where((fn.col("event") == DELIVERED) & (fn.col("delivery_count") == 1))
    first = first.select("queue", fn.lit("publish_to_deliver").alias("kind"),
                         _ms("ts", "publish_ts").alias("latency_ms"))
    acked = events.where(fn.col("event") == ACKED).select(
        "queue", fn.lit("publish_to_ack").alias("kind"),
        _ms("ts", "publish_ts").alias("latency_ms"))
    return first.unionByName(acked)


def latency(events: Any) -> Any:
    """Per queue: publish -> first delivery and publish -> ack, count and percentiles."""
    fn = _f()
    return latency_samples(events).groupBy("queue", "kind").agg(
        fn.count("*").alias("count"), *_percentiles("latency_ms"),
        fn.max("latency_ms").alias("max_ms"))


def redelivery(events: Any) -> Any:
    """Per queue: deliveries, redeliveries (delivery_count > 1) and their rate."""
    fn = _f()
    return (
        events.where(fn.col("event") == DELIVERED)
        .groupBy("queue")
        .agg(fn.count("*").alias("deliveries"),
             fn.sum((fn.col("delivery_count") > 1).cast("long")).alias("redeliveries"))
        .withColumn("redelivery_rate", fn.col("redeliveries") / fn.col("deliveries"))
    )


def requeues(events: Any) -> Any:
    """Per queue x reason: messages returned to their queue."""
    fn = _f()
    return events.where(fn.col("event") == REQUEUED).groupBy("queue", "reason").agg(
        fn.count("*").alias("count"))


def dead_letters(events: Any) -> Any:
    """Per queue x reason: messages dead-lettered (expiries are in ``ttl``)."""
    fn = _f()
    return events.where(fn.col("event") == DEAD_LETTERED).groupBy("queue", "reason").agg(
        fn.count("*").alias("count"))


def ttl(events: Any) -> Any:
    """Per queue: published with a TTL, expired, expiry ratio, age at expiry."""
    fn = _f()
    published = events.where((fn.col("event") == PUBLISHED) & fn.col("ttl_ms").isNotNull())
    published = published.groupBy("queue").agg(fn.count("*").alias("published_with_ttl"))
    expired = events.where(fn.col("event") == EXPIRED).withColumn("age_ms", _ms("ts", "publish_ts"))
    expired = expired.groupBy("queue").agg(
        fn.count("*").alias("expired"), fn.avg("age_ms").alias("avg_age_ms"),
        fn.max("age_ms").alias("max_age_ms"))
    joined = published.join(expired, "queue", "full_outer").fillna(
        0, ["published_with_ttl", "expired"])
    ratio = fn.when(fn.col("published_with_ttl") > 0,
                   fn.col("expired") / fn.col("published_with_ttl"))
    return joined.withColumn("expiry_ratio", ratio)


def depth(events: Any) -> Any:
    """Per queue, at the end of each minute with activity: messages not yet settled.

    Depth counts ready and in-flight copies (published minus every terminal
    event), from the start of the journal read.
    """
    fn = _f()
    from pyspark.sql import Window

    change = fn.when(fn.col("event") == PUBLISHED, 1).when(
        fn.col("event").isin(*TERMINAL_EVENTS), -1).otherwise(0)
    per_minute = (
        events.where(fn.col("event").isin(PUBLISHED, *TERMINAL_EVENTS))
        .groupBy("queue", fn.date_trunc("minute", "ts").alias("minute"))
        .agg(fn.sum((fn.col("event") == PUBLISHED).cast("long")).alias("published"),
             fn.sum((fn.col("event") != PUBLISHED).cast("long")).alias("settled"),
             fn.sum(change).alias("change"))
    )
    window = Window.partitionBy("queue").orderBy("minute").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return per_minute.withColumn("depth", fn.sum("change").over(window)).drop("change")


def _latest(events: Any) -> Any:
    """Each message copy's last event (by node seq)."""
    fn = _f()
    messages = events.where(fn.col("event").isin(*MESSAGE_EVENTS))
    latest = messages.groupBy(*KEY).agg(fn.max_by("event", "seq").alias("last_event"),
                                        fn.max("ts").alias("last_ts"))
    return latest


def unacked(events: Any) -> Any:
    """Per queue: copies still delivered and unsettled at the journal's end, and the oldest.

    ``oldest_unacked_age_ms`` is the journal's last timestamp minus the
    delivery time of the longest-held one.
    """
    fn = _f()
    end = events.agg(fn.max("ts").alias("end_ts"))
    held = _latest(events).where(fn.col("last_event") == DELIVERED).crossJoin(end)
    return held.groupBy("queue").agg(
        fn.count("*").alias("in_flight"),
        fn.max(_ms("end_ts", "last_ts")).alias("oldest_unacked_age_ms"))


def consumers(events: Any) -> Any:
    """Per consumer and queue: deliveries, acks, requeues, ack rate, processing time."""
    fn = _f()
    mine = events.where(fn.col("consumer").isNotNull() & fn.col("event").isin(
        DELIVERED, ACKED, REQUEUED))
    counts = mine.groupBy("consumer", "queue").agg(
        fn.first("protocol", ignorenulls=True).alias("protocol"),
        fn.sum((fn.col("event") == DELIVERED).cast("long")).alias("delivered"),
        fn.sum((fn.col("event") == ACKED).cast("long")).alias("acked"),
        fn.sum((fn.col("event") == REQUEUED).cast("long")).alias("requeued"),
    )
    on = [*KEY, "consumer", "delivery_count"]
    deliveries = mine.where(fn.col("event") == DELIVERED).select(
        *on, fn.col("ts").alias("delivered_ts"))
    acks = mine.where(fn.col("event") == ACKED).select(*on, fn.col("ts").alias("acked_ts"))
    processing = acks.join(deliveries, on).select(
        "consumer", "queue", _ms("acked_ts", "delivered_ts").alias("processing_ms"))
    timing = processing.groupBy("consumer", "queue").agg(
        fn.avg("processing_ms").alias("avg_processing_ms"),
        fn.max("processing_ms").alias("max_processing_ms"))
    return (
        counts.join(timing, ["consumer", "queue"], "left")
        .withColumn("ack_rate", fn.when(fn.col("delivered") > 0,
                                       fn.col("acked") / fn.col("delivered")))
        .withColumn("requeue_ratio", fn.when(fn.col("delivered") > 0,
                                            fn.col("requeued") / fn.col("delivered")))
    )


def seq_gaps(events: Any) -> Any:
    """Per node: records, seq range, and seqs missing (lost records) or repeated."""
    fn = _f()
    return (
        events.groupBy("node")
        .agg(fn.count("*").alias("records"), fn.countDistinct("seq").alias("distinct_seqs"),
             fn.min("seq").alias("min_seq"), fn.max("seq").alias("max_seq"))
        .withColumn("missing", fn.col("max_seq") - fn.col("min_seq") + 1 - fn.col("distinct_seqs"))
        .withColumn("duplicates", fn.col("records") - fn.col("distinct_seqs"))
        .drop("distinct_seqs")
    )


def _copies(events: Any) -> Any:
    """Per copy key: how often it was published and ended, each terminal event
    counted, and whether its last message event was a delivery.

    Keys are counted, not deduplicated: copies of one message dead-lettered
    from two queues into a third keep their publish time and share a key
    there, and each is published and ended once.
    """
    fn = _f()
    counts = [fn.sum((fn.col("event") == event).cast("long")).alias(event)
              for event in (PUBLISHED, *TERMINAL_EVENTS)]
    copies = events.where(fn.col("event").isin(*MESSAGE_EVENTS)).groupBy(*KEY).agg(
        *counts, fn.max_by("event", "seq").alias("last_event"))
    ended = sum((fn.col(event) for event in TERMINAL_EVENTS[1:]), fn.col(TERMINAL_EVENTS[0]))
    return (copies.withColumn("open", fn.greatest(fn.col(PUBLISHED) - ended, fn.lit(0)))
            .withColumn("unmatched", fn.greatest(ended - fn.col(PUBLISHED), fn.lit(0))))


def balance(events: Any) -> Any:
    """Per queue: published = acked + dead-lettered + expired + moved + purged + deleted
    + still there.

    Every copy that leaves a queue gets one terminal event (journal schema
    2), so the terms are counts of events.  ``still_there`` is the copies
    published with no end yet, read per copy, not by subtraction: those
    whose last event is a delivery are ``in_flight``, the rest ``ready``.
    ``unmatched`` counts ends the data read holds no publish for (a copy
    ended twice, a lost record, or one published before ``--since``);
    ``balanced`` says whether the equation holds, which is when there are
    none.  A copy still there may also be one the journal never saw end: a
    restart of a server on the memory store, or a version 1 journal's purge.
    """
    fn = _f()
    terms = [fn.sum(event).alias(event) for event in (PUBLISHED, *TERMINAL_EVENTS)]
    in_flight = (fn.col("last_event") == DELIVERED) & (fn.col("open") > 0)
    out = _copies(events).groupBy("queue").agg(
        *terms, fn.sum("open").alias("still_there"),
        fn.sum(fn.when(in_flight, fn.col("open")).otherwise(0)).alias("in_flight"),
        fn.sum("unmatched").alias("unmatched"))
    ended = sum((fn.col(event) for event in TERMINAL_EVENTS[1:]), fn.col(TERMINAL_EVENTS[0]))
    return (out.withColumn("ready", fn.col("still_there") - fn.col("in_flight"))
            .withColumn("balanced", fn.col(PUBLISHED) == ended + fn.col("still_there"))
            .select("queue", PUBLISHED, *TERMINAL_EVENTS, "still_there", "ready", "in_flight",
                    "unmatched", "balanced")
            .orderBy("queue"))


def unterminated(events: Any) -> Any:
    """Per queue: copies published with no terminal event (still queued or in
    flight, or their end was lost): ``balance``'s ``still_there``."""
    fn = _f()
    open_ = _copies(events).where(fn.col("open") > 0)
    return open_.groupBy("queue").agg(fn.sum("open").alias("unterminated"))


REPORTS: dict[str, Callable[[Any], Any]] = {
    "balance": balance,
    "throughput": throughput,
    "latency": latency,
    "redelivery": redelivery,
    "requeues": requeues,
    "dead_letters": dead_letters,
    "ttl": ttl,
    "depth": depth,
    "unacked": unacked,
    "consumers": consumers,
    "seq_gaps": seq_gaps,
    "unterminated": unterminated,
}
"""Every report by name, in the order they are written."""
