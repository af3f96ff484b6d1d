"""Writing results: reports and the archive as Parquet, the balance as text, the
HTML report."""

from __future__ import annotations

from typing import Any

from mqserver.analytics.page import ReportData, render
from mqserver.journal.schema import PUBLISHED


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


def write_html(path: str, data: ReportData) -> None:
    """The self-contained HTML report (``mqserver.analytics.page``)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(data))
