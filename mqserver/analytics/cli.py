"""``mqserver-analytics``: journal -> Parquet reports, archive, HTML.

``main(argv)`` can be called in-process (tests reuse their session; a session
this function did not create is never stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

REPORT_HELP = "comma-separated report names (default: all)"
HTML_REPORTS = ("balance", "consumers")
"""Reports the HTML report shows in charts and its header, computed for ``--html``
even when ``--reports`` leaves them out (then not written as Parquet)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from mqserver.analytics.reports import REPORTS

    parser = argparse.ArgumentParser(
        prog="mqserver-analytics",
        description="Reports over an mqserver event journal, on Spark (docs/analytics.md).")
    parser.add_argument("--journal", required=True, help="journal directory (--journal of twistd)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--master", default=None,
                        help="Spark master, e.g. local[*] or spark://HOST:PORT (default: "
                             "spark-submit's, else local[*])")
    parser.add_argument("--since", default=None, help="first time included (ISO, UTC)")
    parser.add_argument("--until", default=None, help="first time excluded (ISO, UTC)")
    parser.add_argument("--reports", default=None,
                        help=f"{REPORT_HELP}: {', '.join(REPORTS)}")
    parser.add_argument("--archive", action="store_true",
                        help="also write published messages to OUT/archive (by date, queue)")
    parser.add_argument("--html", action="store_true", help="also write OUT/report.html")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration; repeatable")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.reports.split(",")] if args.reports else list(REPORTS)
    unknown = [n for n in names if n not in REPORTS]
    if unknown:
        parser.error(f"unknown reports {unknown}; available: {', '.join(REPORTS)}")
    args.names = names
    return args


def _progress(message: str) -> None:
    print(f"mqserver-analytics: {message}", file=sys.stderr, flush=True)


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mqserver.analytics import export, figures
    from mqserver.analytics.load import load, parse_time
    from mqserver.analytics.reports import REPORTS
    from mqserver.analytics.session import build_session

    conf = dict(item.split("=", 1) for item in args.conf)
    started = time.monotonic()
    spark, created = build_session(args.master, conf)
    try:
        _progress(f"Spark {spark.version} on {spark.sparkContext.master}")
        journal = load(spark, args.journal,
                       parse_time(args.since) if args.since else None,
                       parse_time(args.until) if args.until else None)
        os.makedirs(args.out, exist_ok=True)
        summary: dict[str, Any] = {"journal": args.journal, "malformed_lines": journal.malformed}
        if journal.malformed:
            _progress(f"{journal.malformed} malformed journal lines skipped")
        results: dict[str, list[dict[str, Any]]] = {}
        extra = [n for n in HTML_REPORTS if args.html and n not in args.names]
        for name in [*args.names, *extra]:
            t0 = time.monotonic()
            frame = REPORTS[name](journal.events)
            if name in args.names:
                export.write_report(frame, os.path.join(args.out, name))
            if args.html or name == "balance":
                results[name] = _rows(frame)
            _progress(f"report {name} {'written' if name in args.names else 'computed'} in "
                      f"{time.monotonic() - t0:.1f} s")
        if "balance" in results:
            # the integrity check: on stdout and in summary.json too
            rows = results["balance"]
            unbalanced = [row["queue"] for row in rows if not row["balanced"]]
            summary["balance"] = {"balanced": not unbalanced,
                                  "verdict": export.balance_verdict(rows),
                                  "unbalanced_queues": unbalanced, "queues": rows}
            sys.stdout.write(export.balance_text(rows))
            sys.stdout.flush()
        summary["records"] = journal.events.count()
        if args.archive:
            count = export.write_archive(journal.events, os.path.join(args.out, "archive"))
            summary["archived_messages"] = count
            _progress(f"archive: {count} messages")
        summary["seconds"] = round(time.monotonic() - started, 1)
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
        if args.html:
            t0 = time.monotonic()
            data = figures.collect(journal.events, summary, results)
            export.write_html(os.path.join(args.out, "report.html"), data)
            _progress(f"HTML report ({data.bucket_seconds} s buckets) in "
                      f"{time.monotonic() - t0:.1f} s: {os.path.join(args.out, 'report.html')}")
        journal.raw.unpersist()
        _progress(f"done: {summary['records']} records in {summary['seconds']} s")
    finally:
        if created:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
