"""The HTML report as one self-contained page: ``render(ReportData) -> str``.

Pure: what Spark aggregated (``mqserver.analytics.figures``) comes in, an
HTML string goes out, with the charts as inline SVG (``svg``) and every
number rounded for people (``human``).  Nothing is fetched from elsewhere,
so the file opens offline and can be mailed or attached to a ticket.

The page reads top-down: the journal's span, the headline numbers, the
balance of every queue, then throughput and depth over time, the latency
distribution of each queue, the consumers, and last the first rows of each
report.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mqserver.analytics import human, svg

SERIES = 8
"""Lines per chart: the busiest; the rest are summed as "others" where a sum makes sense."""
BARS = 20
OTHER_END = "dead-lettered, deleted or still held"
"""A consumer's deliveries neither acked nor requeued."""
TABLE_ROWS = 50
"""Rows of each report shown as a table."""
FLOW = (("published", "#4e79a7"), ("delivered", "#76b7b2"), ("acked", "#59a14f"),
        ("requeued", "#edc948"), ("dead_lettered", "#e15759"), ("expired", "#b07aa1"),
        ("moved", "#9c755f"), ("purged", "#bab0ac"), ("deleted", "#ff9da7"))
LEAVING = ("acked", "dead_lettered", "expired", "moved", "purged", "deleted")
BALANCE_COLUMNS = ("queue", "published", *LEAVING, "still_there", "ready", "in_flight",
                   "unmatched", "balanced")
KINDS = (("publish_to_ack", "publish → ack"), ("publish_to_deliver", "publish → first delivery"))
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#f6f7f9}
main{max-width:960px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:32px 0 8px}
.span{color:#555;margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(5,1fr);gap:10px}
.card{background:#fff;border:1px solid #dde;border-radius:6px;padding:10px 12px}
.card b{display:block;font-size:21px;font-weight:600;white-space:nowrap}.card small{color:#666}
.card.ok b{color:#2e7d32}.card.bad b{color:#c62828}
figure{background:#fff;border:1px solid #dde;border-radius:6px;margin:10px 0;padding:10px}
figcaption{font-weight:600}figcaption small{font-weight:400;color:#666;margin-left:8px}
svg.plot{display:block;max-width:100%;height:auto}
svg .grid{stroke:#e6e6e6}svg .frame{fill:none;stroke:#bbb}
svg .tick{font-size:11px;fill:#666}svg .label{font-size:12px;fill:#333}
svg .note{font-size:11px;fill:#555}svg .series{stroke-width:1.8}
.legend{list-style:none;padding:0;margin:4px 0 0 64px;display:flex;flex-wrap:wrap;gap:4px 14px}
.legend span{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;
vertical-align:-1px}
table{border-collapse:collapse;background:#fff;font-size:12.5px}
td,th{border:1px solid #dde;padding:3px 8px}td{text-align:right}
td:first-child,th{text-align:left}tr.bad td{background:#fdecea}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
.empty{color:#666;font-style:italic}
"""


@dataclass
class ReportData:
    """What the page shows; ``start``/``end`` are None for an empty journal."""

    start: datetime | None
    end: datetime | None
    bucket_seconds: int
    totals: dict[str, Any]
    """records, each message event's count, redelivered, p50_ms and p99_ms (publish -> ack)"""
    timeline: list[tuple[int, str, str, int]]
    """(bucket, queue, event, count)"""
    consumer_timeline: list[tuple[int, str, str, str, int]]
    """(bucket, consumer, queue, event, count)"""
    latency: list[tuple[str, str, int, list[float]]]
    """(queue, kind, samples, latency in ms at each percentile 0..100)"""
    summary: dict[str, Any]
    results: dict[str, list[dict[str, Any]]]

    @property
    def span_seconds(self) -> float:
        return (self.end - self.start).total_seconds() if self.start and self.end else 0.0

    @property
    def buckets(self) -> int:
        return int(self.span_seconds // self.bucket_seconds) + 1

    def bucket_time(self, bucket: int) -> float:
        """The epoch seconds at which ``bucket`` starts."""
        assert self.start is not None
        return human.utc(self.start).timestamp() + bucket * self.bucket_seconds

    @property
    def x_range(self) -> tuple[float, float]:
        assert self.start is not None and self.end is not None
        return human.utc(self.start).timestamp(), human.utc(self.end).timestamp()


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _figure(chart_id: str, title: str, note: str, chart: str,
            items: Iterable[tuple[str, str]] = ()) -> str:
    items = list(items)
    return (f"<figure id='{chart_id}'><figcaption>{_esc(title)}<small>{_esc(note)}</small>"
            f"</figcaption>{chart}{svg.legend(items) if items else ''}</figure>")


def _table(rows: list[dict[str, Any]], columns: Iterable[str], bad: str | None = None) -> str:
    columns = list(columns)
    head = "".join(f"<th>{_esc(c.replace('_', ' '))}</th>" for c in columns)
    body = "".join(
        f"<tr{' class=bad' if bad and not row.get(bad) else ''}>"
        + "".join(f"<td>{_esc(human.cell(c, row.get(c)))}</td>" for c in columns) + "</tr>"
        for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _rates(data: ReportData, counts: dict[int, int]) -> list[tuple[float, float]]:
    """Every bucket's count per second, empty buckets included, at the bucket's middle.

    The last bucket ends with the journal, usually part of the way through:
    its rate is over the part it covers, drawn at that part's middle, or,
    when that part is under a quarter of a bucket (too few events to say),
    it is left out.
    """
    points = []
    _, end = data.x_range
    for bucket in range(data.buckets):
        start = data.bucket_time(bucket)
        width = float(data.bucket_seconds)
        if bucket == data.buckets - 1 and bucket > 0:
            width = end - start
            if width < data.bucket_seconds / 4:
                break
        points.append((min(start + width / 2, end), counts.get(bucket, 0) / width))
    return points


def _queue_colors(data: ReportData) -> dict[str, str]:
    """One colour per queue on every chart, the busiest queues first."""
    published: dict[str, int] = defaultdict(int)
    for _, queue, event, n in data.timeline:
        published[queue] += n if event == "published" else 0
    return {q: svg.color(i) for i, q in enumerate(_busiest(published, len(published)))}


def _busiest(totals: dict[str, float], limit: int = SERIES) -> list[str]:
    return [k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def _time_tooltip(data: ReportData, fmt: Callable[[float], str]):
    def tip(series: svg.Series, x: float, y: float) -> str:
        moment = datetime.fromtimestamp(x, human.utc(data.start).tzinfo).strftime("%H:%M:%S")
        return f"{series.label}: {fmt(y)} at {moment}"
    return tip


def _header(data: ReportData) -> str:
    t = data.totals
    parts = ["<h1>mqserver journal report</h1>"]
    if data.start is None or data.end is None:
        parts.append("<p class='span'>The journal read holds no records.</p>")
        return "".join(parts)
    parts.append(
        f"<p class='span'>{_esc(human.timestamp(data.start))} → "
        f"{_esc(human.timestamp(data.end))} ({_esc(human.duration(data.span_seconds * 1000))}), "
        f"{_esc(human.count(t['records']))} records, charts in "
        f"{_esc(human.step(data.bucket_seconds))} steps"
        + (f", {_esc(human.count(data.summary['malformed_lines']))} malformed lines skipped"
           if data.summary.get("malformed_lines") else "") + "</p>")
    peak = max((v for _, v in _rates(data, _per_bucket(data, "published"))), default=0)
    average = t["published"] / data.span_seconds if data.span_seconds else None
    deliveries = t["delivered"]
    cards = [
        ("messages published", human.count(t["published"]),
         f"{human.count(t['acked'])} acked"),
        ("throughput", human.rate(average) if average is not None else human.NONE,
         f"published, peak {human.rate(peak)}"),
        ("latency p50", human.duration(t["p50_ms"]), "publish → ack, all queues"),
        ("latency p99", human.duration(t["p99_ms"]), "publish → ack, all queues"),
        ("redelivery rate",
         human.percent(t["redelivered"] / deliveries) if deliveries else human.NONE,
         f"{human.count(t['redelivered'])} of {human.count(deliveries)} deliveries"),
        ("dead letters", human.count(t["dead_lettered"]), "dead-lettered copies"),
        ("expired", human.count(t["expired"]), "TTL ran out"),
    ]
    balance = data.summary.get("balance")
    if balance is not None:
        cards.append(("balance", "balanced" if balance["balanced"] else "NOT balanced",
                      balance["verdict"]))
        cards.append(("still there", human.count(sum(
            r["still_there"] for r in balance["queues"])), "ready or in flight at the end"))
    parts.append("<div class='cards'>")
    for title, value, note in cards:
        state = (" ok" if balance["balanced"] else " bad") if title == "balance" else ""
        parts.append(f"<div class='card{state}'><small>{_esc(title)}</small><b>{_esc(value)}</b>"
                     f"<small>{_esc(note)}</small></div>")
    parts.append("</div>")
    return "".join(parts)


def _balance(data: ReportData) -> str:
    rows = data.results["balance"]
    parts = ["<h2 id='balance'>Balance per queue</h2>",
             "<p>published = acked + dead-lettered + expired + moved + purged + deleted + "
             "still there (ready or in flight)</p>"]
    parts.append(_table(rows, BALANCE_COLUMNS, bad="balanced"))
    parts.append(f"<p>balance: {_esc(data.summary['balance']['verdict'])}</p>")
    return "".join(parts)


def _per_bucket(data: ReportData, event: str,
                keep: Callable[[str], bool] = lambda queue: True) -> dict[int, int]:
    """``event``'s count per bucket, over the queues ``keep`` accepts."""
    counts: dict[int, int] = defaultdict(int)
    for bucket, queue, e, n in data.timeline:
        if e == event and keep(queue):
            counts[bucket] += n
    return counts


def _throughput(data: ReportData) -> str:
    step = human.step(data.bucket_seconds)
    flows = [(event, fill) for event, fill in FLOW if data.totals.get(event)]
    series = [svg.Series(event.replace("_", "-"), fill, _rates(data, _per_bucket(data, event)))
              for event, fill in flows]
    parts = [_figure("throughput", "Messages per second, all queues", f"{step} buckets",
                     svg.line_chart("throughput", series, data.x_range, y_format=human.significant,
                                    tooltip=_time_tooltip(data, human.rate)),
                     [(s.label, s.color) for s in series])]
    published: dict[str, int] = defaultdict(int)
    for _, queue, event, n in data.timeline:
        if event == "published":
            published[queue] += n
    queues = _busiest(published)
    colors = _queue_colors(data)
    series = [svg.Series(q, colors[q], _rates(data, _per_bucket(data, "published", q.__eq__)))
              for q in queues]
    others = _per_bucket(data, "published", lambda queue: queue not in queues)
    if others:
        series.append(svg.Series(f"{len(published) - len(queues)} other queues", "#999",
                                 _rates(data, others)))
    parts.append(_figure("published-by-queue", "Published per second, by queue",
                         f"{step} buckets", svg.line_chart(
                             "published by queue", series, data.x_range,
                             y_format=human.significant, tooltip=_time_tooltip(data, human.rate)),
                         [(s.label, s.color) for s in series]))
    return "".join(parts)


def _depth(data: ReportData) -> str:
    """Ready + in flight per queue: published minus every leaving event, summed from the start."""
    change: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for bucket, queue, event, n in data.timeline:
        if event == "published":
            change[queue][bucket] += n
        elif event in LEAVING:
            change[queue][bucket] -= n
    start, end = data.x_range
    curves: dict[str, list[tuple[float, float]]] = {}
    for queue, deltas in change.items():
        depth, points = 0, [(start, 0.0)]
        for bucket in range(data.buckets):
            depth += deltas.get(bucket, 0)
            points.append((min(data.bucket_time(bucket + 1), end), float(depth)))
        curves[queue] = points
    shown = _busiest({q: max(y for _, y in p) for q, p in curves.items()})
    colors = _queue_colors(data)
    series = [svg.Series(q, colors[q], curves[q]) for q in shown]
    note = f"at the end of each {human.step(data.bucket_seconds)}, from the start of the data read"
    if len(curves) > len(shown):
        note += f"; the {SERIES} deepest of {len(curves)} queues"
    return _figure("depth", "Queue depth (ready + in flight)", note,
                   svg.line_chart("depth", series, data.x_range,
                                  tooltip=_time_tooltip(data, human.count)),
                   [(s.label, s.color) for s in series])


def _latency(data: ReportData) -> str:
    parts = ["<h2 id='latency'>Latency</h2>"]
    for kind, title in KINDS:
        rows = [r for r in data.latency if r[1] == kind and r[2]]
        if not rows:
            parts.append(f"<p class='empty'>No {_esc(title)} samples.</p>")
            continue
        rows = sorted(rows, key=lambda r: (-r[2], r[0]))[:SERIES]
        values = [v for r in rows for v in r[3]]
        positive = [v for v in values if v > 0]
        lo, hi = (min(positive) if positive else 0.0), max(values)
        log = bool(positive) and hi / lo >= 50
        if not log:
            lo = min(values)
        colors = _queue_colors(data)
        series = [svg.Series(f"{queue}: {human.count(n)}, p50 {human.duration(q[50])}, "
                             f"p99 {human.duration(q[99])}", colors.get(queue, "#999"),
                             [(v, p / (len(q) - 1)) for p, v in enumerate(q)])
                  for queue, _, n, q in rows]

        names = {one.label: queue for one, (queue, *_) in zip(series, rows, strict=True)}

        def tip(one: svg.Series, x: float, y: float, names: dict[str, str] = names) -> str:
            return f"{names[one.label]}: {human.percent(y)} within {human.duration(x)}"
        chart = svg.line_chart(f"latency {kind}", series, (lo, hi), x_kind="ms", x_log=log,
                               y_max=1.0, y_format=human.percent, tooltip=tip)
        note = "log scale" if log else "linear scale"
        if sum(r[1] == kind for r in data.latency) > len(rows):
            note += f"; the {SERIES} busiest queues"
        parts.append(_figure(f"latency-{kind}", f"{title}: share of messages within a latency",
                             note, chart, [(s.label, s.color) for s in series]))
    return "".join(parts)


def _consumers(data: ReportData) -> str:
    parts = ["<h2 id='consumers'>Consumers</h2>"]
    acks: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for bucket, consumer, queue, event, n in data.consumer_timeline:
        if event == "acked":
            acks[f"{consumer} on {queue}"][bucket] += n
    shown = _busiest({c: sum(b.values()) for c, b in acks.items()})
    if shown:
        offset = len(_queue_colors(data))  # so that no consumer wears a queue's colour
        series = [svg.Series(c, svg.color(offset + i), _rates(data, acks[c]))
                  for i, c in enumerate(shown)]
        note = f"{human.step(data.bucket_seconds)} buckets"
        if len(acks) > len(shown):
            note += f"; the {SERIES} busiest of {len(acks)} consumers"
        parts.append(_figure("consumer-acks", "Acks per second, by consumer", note,
                             svg.line_chart("acks by consumer", series, data.x_range,
                                            y_format=human.significant,
                                            tooltip=_time_tooltip(data, human.rate)),
                             [(s.label, s.color) for s in series]))
    rows = sorted(data.results.get("consumers", []),
                  key=lambda r: (-(r["delivered"] or 0), r["consumer"], r["queue"]))[:BARS]
    bars = []
    for row in rows:
        acked, requeued = row["acked"] or 0, row["requeued"] or 0
        open_ = max((row["delivered"] or 0) - acked - requeued, 0)
        note = f"{human.percent(row['ack_rate'])} acked"
        if row.get("avg_processing_ms") is not None:
            note += f", {human.duration(row['avg_processing_ms'])} avg"
        bars.append(svg.Bar(f"{row['consumer']} on {row['queue']} ({row['protocol']})",
                            [("acked", acked, "#59a14f"), ("requeued", requeued, "#edc948"),
                             (OTHER_END, open_, "#bab0ac")], note))
    if bars:
        parts.append(_figure("consumer-deliveries", "Deliveries by consumer",
                             "how each delivery ended; avg = delivery to ack",
                             svg.bar_chart("deliveries by consumer", bars),
                             [("acked", "#59a14f"), ("requeued", "#edc948"),
                              (OTHER_END, "#bab0ac")]))
    if len(parts) == 1:
        parts.append("<p class='empty'>No consumer activity.</p>")
    return "".join(parts)


def _reports(data: ReportData) -> str:
    parts = ["<h2 id='reports'>Reports</h2>",
             "<p>The first rows of each report; all of them are in the Parquet output.</p>"]
    for name, rows in data.results.items():
        parts.append(f"<details id='report-{_esc(name)}'><summary>{_esc(name)} "
                     f"({human.count(len(rows))} rows)</summary>")
        if rows:
            parts.append(_table(rows[:TABLE_ROWS], rows[0]))
            if len(rows) > TABLE_ROWS:
                parts.append(f"<p>{human.count(len(rows) - TABLE_ROWS)} more rows in the "
                             "Parquet output</p>")
        parts.append("</details>")
    return "".join(parts)


def render(data: ReportData) -> str:
    """The whole page."""
    parts = ["<!doctype html><html lang='en'><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width'>",
             "<title>mqserver journal report</title>", f"<style>{STYLE}</style>",
             f"<main data-start='{data.x_range[0] if data.start else ''}' "
             f"data-end='{data.x_range[1] if data.end else ''}'>", _header(data)]
    if "balance" in data.results:
        parts.append(_balance(data))
    if data.start is not None:
        parts += ["<h2 id='flow'>Throughput and depth</h2>", _throughput(data), _depth(data),
                  _latency(data), _consumers(data)]
    parts += [_reports(data), "</main></html>"]
    return "\n".join(parts)
