"""Writing results: reports and the archive as Parquet, and the HTML report.

The HTML report is one file with matplotlib PNGs embedded as data URIs, so it
can be mailed or attached to a ticket without its folder.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from mqserver.journal.schema import PUBLISHED

HTML_ROWS = 50
"""Rows of each report shown as a table in the HTML report."""


def write_report(frame: Any, path: str) -> None:
    frame.write.mode("overwrite").parquet(path)


def write_archive(events: Any, path: str) -> int:
    """Published messages (with bodies when journaled), partitioned by date and queue."""
    from pyspark.sql import functions as fn

    columns = ["node", "seq", "ts", "queue", "protocol", "message_id", "publish_ts", "size",
               "ttl_ms", "headers", "body"]
    messages = events.where(fn.col("event") == PUBLISHED).select(
        *columns, fn.to_date("ts").alias("date"))
    messages.write.mode("overwrite").partitionBy("date", "queue").parquet(path)
    return messages.count()


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _chart(name: str, rows: list[dict[str, Any]]) -> str | None:
    """A PNG (base64) for the reports that read better as a picture, else None."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    if not rows:
        return None
    figure, axes = pyplot.subplots(figsize=(8, 3.2))
    try:
        if name in ("throughput", "depth"):
            value = "count" if name == "throughput" else "depth"
            series: dict[str, list[tuple[Any, int]]] = {}
            for row in rows:
                label = (f"{row['queue']} {row['event']}" if name == "throughput"
                         else str(row["queue"]))
                series.setdefault(label, []).append((row["minute"], row[value]))
            for label, points in sorted(series.items())[:12]:
                points.sort()
                axes.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                          label=label)
            axes.set_ylabel("records per minute" if name == "throughput" else "messages")
            axes.legend(fontsize=7)
            figure.autofmt_xdate()
        elif name == "latency":
            labels = [f"{r['queue']}\n{r['kind']}" for r in rows][:20]
            for offset, key in enumerate(("p50_ms", "p95_ms", "p99_ms")):
                axes.bar([i + offset * 0.27 for i in range(len(labels))],
                         [r[key] or 0 for r in rows][:20], width=0.27, label=key)
            axes.set_xticks(range(len(labels)), labels, fontsize=7)
            axes.set_ylabel("ms")
            axes.legend(fontsize=7)
        elif name in ("dead_letters", "requeues"):
            labels = [f"{r['queue']}\n{r['reason']}" for r in rows][:20]
            axes.bar(range(len(labels)), [r["count"] for r in rows][:20])
            axes.set_xticks(range(len(labels)), labels, fontsize=7)
        else:
            return None
        axes.set_title(name)
        return _png(figure)
    finally:
        pyplot.close(figure)


BALANCE_COLUMNS = ("queue", "published", "acked", "dead_lettered", "expired", "moved", "purged",
                   "deleted", "still_there", "unmatched", "balanced")


def balance_text(rows: list[dict[str, Any]]) -> str:
    """The ``balance`` report as a plain table, one queue a line, and a verdict."""
    table = [BALANCE_COLUMNS] + [
        tuple("yes" if row[c] is True else "NO" if row[c] is False else str(row[c])
              for c in BALANCE_COLUMNS) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(BALANCE_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
             for line in table]
    return "\n".join([*lines, f"balance: {balance_verdict(rows)}"]) + "\n"


def balance_verdict(rows: list[dict[str, Any]]) -> str:
    """Whether every queue balances, else which do not."""
    off = [str(row["queue"]) for row in rows if not row["balanced"]]
    if not off:
        return f"all {len(rows)} queues balance"
    return f"{len(off)} of {len(rows)} queues do not balance: {', '.join(off)}"


def write_html(path: str, summary: dict[str, Any], results: dict[str, list[dict]]) -> None:
    """One self-contained page: summary, then each report's chart and first rows."""
    parts = ["<!doctype html><meta charset='utf-8'><title>mqserver analytics</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}</style>",
             "<h1>mqserver journal report</h1><ul>"]
    for key, value in summary.items():
        if key == "balance":  # its rows are the balance table below
            value = value["verdict"]
        parts.append(f"<li>{html.escape(str(key))}: {html.escape(str(value))}</li>")
    parts.append("</ul>")
    for name, rows in results.items():
        parts.append(f"<h2 id='{name}'>{html.escape(name)}</h2>")
        chart = _chart(name, rows)
        if chart is not None:
            parts.append(f"<img alt='{name} chart' src='data:image/png;base64,{chart}'>")
        if not rows:
            parts.append("<p>no rows</p>")
            continue
        columns = list(rows[0])
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns)
                     + "</tr>")
        for row in rows[:HTML_ROWS]:
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(row[c]))}</td>"
                                          for c in columns) + "</tr>")
        parts.append("</table>")
        if len(rows) > HTML_ROWS:
            parts.append(f"<p>{len(rows) - HTML_ROWS} more rows in the Parquet output</p>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
