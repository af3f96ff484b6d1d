"""What the HTML report draws, aggregated on a real SparkSession from a small journal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from mqserver.analytics import figures
from mqserver.analytics.load import load

BASE = datetime(2026, 11, 20, 10, 0, 0)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def journal(tmp_path, span_s: float = 125.0):
    """q1: m0 acked after 100 ms and m1 redelivered then acked; q2: m2 expires; a
    connection record ``span_s`` after the first."""
    records = []

    def add(seconds: float, event: str, queue: str, message: str, **more) -> None:
        records.append({"v": 2, "seq": len(records) + 1, "node": "n1", "event": event,
                        "ts": iso(BASE + timedelta(seconds=seconds)), "queue": queue,
                        "message_id": message, **more})

    t0, t1, t2 = (iso(BASE + timedelta(seconds=s)) for s in (0, 1.5, 2))
    add(0, "published", "q1", "m0", publish_ts=t0, protocol="mqks")
    add(0.05, "delivered", "q1", "m0", publish_ts=t0, delivery_count=1, consumer="1/a")
    add(0.1, "acked", "q1", "m0", publish_ts=t0, delivery_count=1, consumer="1/a")
    add(1.5, "published", "q1", "m1", publish_ts=t1, protocol="mqks")
    add(1.6, "delivered", "q1", "m1", publish_ts=t1, delivery_count=1, consumer="1/a")
    add(1.7, "requeued", "q1", "m1", publish_ts=t1, delivery_count=1, consumer="1/a",
        reason="rejected")
    add(61.5, "delivered", "q1", "m1", publish_ts=t1, delivery_count=2, consumer="2/b")
    add(61.9, "acked", "q1", "m1", publish_ts=t1, delivery_count=2, consumer="2/b")
    add(2, "published", "q2", "m2", publish_ts=t2, protocol="phpmq", ttl_ms=1000)
    add(3.2, "expired", "q2", "m2", publish_ts=t2, reason="expired")
    records.append({"v": 2, "seq": len(records) + 1, "node": "n1", "event": "connection_closed",
                    "ts": iso(BASE + timedelta(seconds=span_s)), "connection": 1})
    folder = tmp_path / "journal" / "date=2026-11-20"
    folder.mkdir(parents=True)
    (folder / "seg-n1-0000000000000001.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))
    return str(tmp_path / "journal")


@pytest.mark.parametrize(("span", "seconds"), [
    (0, 1), (120, 1), (240, 1), (241, 2), (3600, 15), (6 * 3600, 120), (7 * 86400, 3600),
    (10 * 365 * 86400, 604800)])
def test_resolution_fits_the_span(span, seconds):
    assert figures.resolution(span) == seconds


def test_collect_counts_per_fitted_bucket(spark, tmp_path):
    events = load(spark, journal(tmp_path)).events
    data = figures.collect(events, {"malformed_lines": 0}, {})
    start = BASE.replace(tzinfo=UTC)
    assert (data.start, data.end) == (start, start + timedelta(seconds=125))
    assert data.bucket_seconds == 1 and data.buckets == 126
    assert data.totals | {"p50_ms": 0, "p99_ms": 0} == {
        "records": 11, "published": 3, "delivered": 3, "acked": 2, "requeued": 1,
        "dead_lettered": 0, "expired": 1, "moved": 0, "purged": 0, "deleted": 0,
        "redelivered": 1, "p50_ms": 0, "p99_ms": 0}
    assert data.totals["p50_ms"] == pytest.approx((100 + 60400) / 2)
    assert data.totals["p99_ms"] == pytest.approx(100 + 0.99 * 60300)
    assert data.timeline == [
        (0, "q1", "acked", 1), (0, "q1", "delivered", 1), (0, "q1", "published", 1),
        (1, "q1", "delivered", 1), (1, "q1", "published", 1), (1, "q1", "requeued", 1),
        (2, "q2", "published", 1), (3, "q2", "expired", 1),
        (61, "q1", "acked", 1), (61, "q1", "delivered", 1)]
    assert data.consumer_timeline == [
        (0, "1/a", "q1", "acked", 1), (0, "1/a", "q1", "delivered", 1),
        (1, "1/a", "q1", "delivered", 1), (61, "2/b", "q1", "acked", 1),
        (61, "2/b", "q1", "delivered", 1)]
    (queue, kind, count, quantiles), (_, other, *_) = data.latency
    assert (queue, kind, count, other) == ("q1", "publish_to_ack", 2, "publish_to_deliver")
    assert len(quantiles) == 101 and quantiles[0] == pytest.approx(100)
    assert quantiles[100] == pytest.approx(60400)


def test_a_long_journal_gets_coarser_buckets(spark, tmp_path):
    events = load(spark, journal(tmp_path, span_s=3 * 3600)).events
    data = figures.collect(events, {}, {})
    assert data.bucket_seconds == 60 and data.buckets == 181
    assert {b for b, *_ in data.timeline} == {0, 1}  # 61.9 s is in the second minute


def test_an_empty_journal(spark, tmp_path):
    (tmp_path / "journal" / "date=2026-11-20").mkdir(parents=True)
    data = figures.collect(load(spark, str(tmp_path / "journal")).events, {}, {})
    assert data.start is None and data.totals["records"] == 0 and data.timeline == []
