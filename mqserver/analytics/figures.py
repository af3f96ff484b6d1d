"""What the HTML report draws, aggregated on Spark.

The Parquet reports count per minute, which for a two-minute journal is two
points.  The report instead fits its time buckets to the journal's span
(``resolution``: 1 s buckets for a few minutes, minutes for hours, hours for
weeks) and Spark counts per bucket, so only a few hundred rows per series
reach the driver whatever the journal's size.  The rendering
(``mqserver.analytics.page``) is a pure function of what is collected here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mqserver.analytics.page import ReportData
from mqserver.analytics.reports import latency_samples
from mqserver.journal.schema import ACKED, DELIVERED, MESSAGE_EVENTS

RESOLUTIONS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200,
               86400, 604800)
"""Bucket sizes in seconds, the finest that fits ``MAX_BUCKETS`` is chosen."""
MAX_BUCKETS = 240
QUANTILES = [i / 100 for i in range(101)]
"""The latency distribution is drawn from these exact percentiles of each queue."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def resolution(span_seconds: float) -> int:
    """The finest bucket (seconds) that cuts ``span_seconds`` into at most ``MAX_BUCKETS``."""
    return next((size for size in RESOLUTIONS if span_seconds / size <= MAX_BUCKETS),
                RESOLUTIONS[-1])


def _bucket(start_us: int, seconds: int) -> Any:
    from pyspark.sql import functions as fn

    return fn.floor((fn.unix_micros("ts") - fn.lit(start_us)) / (seconds * 1_000_000)).alias(
        "bucket")


def totals(events: Any) -> dict[str, Any]:
    """The journal's span, records, each message event's count and redeliveries."""
    from pyspark.sql import functions as fn

    counts = [fn.sum((fn.col("event") == event).cast("long")).alias(event)
              for event in MESSAGE_EVENTS]
    redelivered = ((fn.col("event") == DELIVERED) & (fn.col("delivery_count") > 1)).cast("long")
    row = events.agg(fn.count("*").alias("records"), fn.min(fn.unix_micros("ts")).alias("start"),
                     fn.max(fn.unix_micros("ts")).alias("end"), *counts,
                     fn.sum(redelivered).alias("redelivered")).first()
    return {key: value or 0 for key, value in row.asDict().items()
            } | {"start": row["start"], "end": row["end"]}


def overall_latency(events: Any) -> tuple[float | None, float | None]:
    """p50 and p99 of publish -> ack over every queue (exact percentiles)."""
    from pyspark.sql import functions as fn

    acked = latency_samples(events).where(fn.col("kind") == "publish_to_ack")
    values = acked.agg(fn.percentile("latency_ms", [0.5, 0.99]).alias("p")).first()["p"]
    return (values[0], values[1]) if values else (None, None)


def timeline(events: Any, start_us: int, seconds: int) -> list[tuple[int, str, str, int]]:
    """Per bucket x queue x message event: how many."""
    from pyspark.sql import functions as fn

    rows = (events.where(fn.col("event").isin(*MESSAGE_EVENTS))
            .groupBy(_bucket(start_us, seconds), "queue", "event").count().collect())
    return sorted((int(r["bucket"]), r["queue"], r["event"], r["count"]) for r in rows)


def consumer_timeline(events: Any, start_us: int,
                      seconds: int) -> list[tuple[int, str, str, str, int]]:
    """Per bucket x consumer x queue: deliveries and acks."""
    from pyspark.sql import functions as fn

    mine = events.where(fn.col("consumer").isNotNull() & fn.col("event").isin(DELIVERED, ACKED))
    rows = mine.groupBy(_bucket(start_us, seconds), "consumer", "queue", "event").count().collect()
    return sorted((int(r["bucket"]), r["consumer"], r["queue"], r["event"], r["count"])
                  for r in rows)


def latency_distribution(events: Any) -> list[tuple[str, str, int, list[float]]]:
    """Per queue x kind: samples and the latency at each of ``QUANTILES``."""
    from pyspark.sql import functions as fn

    rows = latency_samples(events).groupBy("queue", "kind").agg(
        fn.count("*").alias("count"), fn.percentile("latency_ms", QUANTILES).alias("q")).collect()
    return sorted((r["queue"], r["kind"], r["count"], list(r["q"])) for r in rows)


def _moment(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def collect(events: Any, summary: dict[str, Any], results: dict[str, list[dict]]) -> ReportData:
    """Everything the HTML report shows, from the journal's events and the reports' rows."""
    counts = totals(events)
    if not counts["records"]:
        return ReportData(None, None, 1, counts, [], [], [], summary, results)
    start_us, end_us = counts.pop("start"), counts.pop("end")
    seconds = resolution((end_us - start_us) / 1e6)
    counts["p50_ms"], counts["p99_ms"] = overall_latency(events)
    return ReportData(
        start=_moment(start_us), end=_moment(end_us), bucket_seconds=seconds, totals=counts,
        timeline=timeline(events, start_us, seconds),
        consumer_timeline=consumer_timeline(events, start_us, seconds),
        latency=latency_distribution(events), summary=summary, results=results)
