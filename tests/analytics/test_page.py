"""The HTML page from plain data: sections, rounded numbers, charts within the span."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from html.parser import HTMLParser

from mqserver.analytics import page
from mqserver.analytics.page import ReportData

START = datetime(2026, 11, 27, 3, 10, 2, 250000)
END = START + timedelta(seconds=121.5)


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags
                if t == tag and all(a.get(k) == v for k, v in attrs.items())]


def balance_row(queue: str, published: int, acked: int, still: int, ok: bool = True) -> dict:
    return {"queue": queue, "published": published, "acked": acked, "dead_lettered": 0,
            "expired": 0, "moved": 0, "purged": 0, "deleted": 0, "still_there": still,
            "ready": still, "in_flight": 0, "unmatched": 0 if ok else 1, "balanced": ok}


def data(**overrides) -> ReportData:
    rows = [balance_row("orders", 30, 28, 2), balance_row("pq", 5, 3, 1, ok=False)]
    values = dict(
        start=START, end=END, bucket_seconds=1,
        totals={"records": 120, "published": 35, "delivered": 40, "redelivered": 3,
                "acked": 31, "requeued": 3, "dead_lettered": 1, "expired": 2, "moved": 0,
                "purged": 0, "deleted": 0, "p50_ms": 1.23456, "p99_ms": 1234.5678},
        timeline=[(0, "orders", "published", 20), (0, "orders", "delivered", 18),
                  (3, "orders", "acked", 18), (60, "orders", "published", 10),
                  (121, "orders", "acked", 10), (5, "pq", "published", 5),
                  (9, "pq", "expired", 2), (30, "pq", "acked", 3)],
        consumer_timeline=[(3, "1/fast", "orders", "acked", 18),
                           (121, "2/slow", "orders", "acked", 10),
                           (30, "3/p", "pq", "delivered", 3)],
        latency=[("orders", "publish_to_ack", 28, [0.5 + i * 20 for i in range(101)]),
                 ("pq", "publish_to_ack", 3, [2.0] * 101),
                 ("orders", "publish_to_deliver", 28, [0.0] * 50 + [0.3] * 51)],
        summary={"malformed_lines": 2, "balance": {
            "balanced": False, "verdict": "1 of 2 queues do not balance: pq", "queues": rows}},
        results={"balance": rows, "consumers": [
            {"consumer": "1/fast", "queue": "orders", "protocol": "mqks", "delivered": 20,
             "acked": 18, "requeued": 2, "ack_rate": 0.9, "requeue_ratio": 0.1,
             "avg_processing_ms": 0.123456, "max_processing_ms": 2.0},
            {"consumer": "2/slow", "queue": "orders", "protocol": "mqks", "delivered": 12,
             "acked": 10, "requeued": 0, "ack_rate": 10 / 12, "requeue_ratio": 0.0,
             "avg_processing_ms": None, "max_processing_ms": None}],
            "redelivery": [{"queue": "orders", "deliveries": 40, "redeliveries": 3,
                            "redelivery_rate": 0.075}]})
    values.update(overrides)
    return ReportData(**values)


def test_every_chart_spans_the_journal_and_has_points():
    report = data()
    html = page.render(report)
    doc = Elements(html)
    start, end = report.x_range
    assert doc.find("main")[0]["data-start"] == repr(start)
    plots = doc.find("svg", **{"class": "plot"})
    ids = [a["id"] for a in doc.find("figure")]
    assert ids == ["throughput", "published-by-queue", "depth", "latency-publish_to_ack",
                   "latency-publish_to_deliver", "consumer-acks", "consumer-deliveries"]
    assert len(plots) == len(ids)
    for plot in plots:
        if plot["data-x-kind"] == "time":
            assert (float(plot["data-x-min"]), float(plot["data-x-max"])) == (start, end)
    charts = re.split(r"<figure ", html)[1:]
    for chart in charts:
        assert "class='pt'" in chart, chart[:80]


def test_rates_fill_empty_buckets_and_depth_runs_from_zero():
    report = data()
    html = page.render(report)
    throughput = html.split("<figure id='throughput'>")[1].split("</figure>")[0]
    published = re.findall(r"data-series='published' data-x='([^']+)' data-y='([^']+)'",
                           throughput)
    assert len(published) == report.buckets == 122
    assert float(published[0][1]) == 20 and float(published[5][1]) == 5
    assert float(published[1][1]) == 0
    acked = re.findall(r"data-series='acked' data-x='[^']+' data-y='([^']+)'", throughput)
    assert float(acked[-1]) == 20  # 10 in the last half second the journal covers
    shorter = page.render(data(end=START + timedelta(seconds=121.2)))
    throughput = shorter.split("<figure id='throughput'>")[1].split("</figure>")[0]
    assert len(re.findall(r"data-series='acked' ", throughput)) == 121  # 0.2 s: left out
    depth = html.split("<figure id='depth'>")[1].split("</figure>")[0]
    orders = [float(y) for y in re.findall(r"data-series='orders' data-x='[^']+' data-y='([^']+)'",
                                           depth)]
    assert orders[0] == 0 and orders[1] == 20 and orders[4] == 2 and orders[-1] == 2
    assert max(orders) == 20
    pq = [float(y) for y in re.findall(r"data-series='pq' data-x='[^']+' data-y='([^']+)'", depth)]
    assert pq[-1] == 0 and max(pq) == 5


def test_header_numbers_are_rounded_for_people():
    doc = Elements(page.render(data()))
    text = " ".join(doc.text)
    assert "2026-11-27 03:10:02 UTC → 2026-11-27 03:12:03 UTC (2.02 min)" in text
    assert "2 malformed lines skipped" in text
    for shown in ("35", "0.288/s", "peak 20/s", "1.23 ms", "1.23 s", "7.5 %", "3 of 40",
                  "NOT balanced", "1 of 2 queues do not balance: pq", "90 % acked, 0.123 ms avg",
                  "83.3 %"):
        assert shown in text, shown
    # nothing like 0.055356130738711505 or 12.345
    assert not re.search(r"(?<![\d.])(?:0\.0*[1-9]\d{3,}|[1-9]\d*\.\d{3,})", text)
    assert [a.get("class") for a in doc.find("tr") if a.get("class")] == ["bad"]
    assert doc.find("div", **{"class": "card bad"})


def test_latency_uses_a_log_axis_for_wide_spreads_and_notes_percentiles():
    html = page.render(data())
    ack = html.split("<figure id='latency-publish_to_ack'>")[1].split("</figure>")[0]
    assert "log scale" in ack and "orders: 28, p50 1 s, p99 1.98 s" in ack
    plot = Elements(ack).find("svg")[0]
    assert (float(plot["data-x-min"]), float(plot["data-x-max"])) == (0.5, 2000.5)
    deliver = html.split("<figure id='latency-publish_to_deliver'>")[1].split("</figure>")[0]
    assert "linear scale" in deliver
    assert Elements(deliver).find("svg")[0]["data-x-max"] == "0.3"


def test_many_queues_fold_into_others():
    timeline = [(0, f"q{n:02}", "published", n + 1) for n in range(12)]
    html = page.render(data(timeline=timeline))
    by_queue = html.split("<figure id='published-by-queue'>")[1].split("</figure>")[0]
    assert "4 other queues" in by_queue and "q11" in by_queue and "q03'" not in by_queue


def test_an_empty_journal_and_reports_left_out():
    html = page.render(data(start=None, end=None, totals={"records": 0}, timeline=[],
                            consumer_timeline=[], latency=[], summary={}, results={}))
    assert "The journal read holds no records." in html and "<svg" not in html
    html = page.render(data(results={}, summary={}, consumer_timeline=[], latency=[]))
    assert "id='balance'" not in html and "No consumer activity." in html
    assert "No publish → ack samples." in html
