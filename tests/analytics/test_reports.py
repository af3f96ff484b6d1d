"""Every report against a brute-force computation over a generated journal.

The journal has redeliveries, TTL expiries, dead letters, messages left in
flight or never delivered, a lost record (a seq gap), a torn last line and a
garbage line; the pure-Python side recomputes each report from the records.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mqserver.analytics import cli
from mqserver.analytics.load import load
from mqserver.analytics.reports import REPORTS

BASE = datetime(2026, 11, 20, 10, 0, 0, tzinfo=UTC)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def generate(seed: int = 7, count: int = 300) -> list[dict[str, Any]]:
    """Records in time order, seq assigned in that order, one seq skipped."""
    rng = random.Random(seed)
    events: list[tuple[datetime, dict[str, Any]]] = []

    def add(t: datetime, **record: Any) -> None:
        events.append((t, record))

    for n in range(count):
        queue, protocol = rng.choice([("q1", "mqks"), ("q2", "phpmq")])
        consumer = rng.choice(["1/a", "2/b"])
        t = BASE + timedelta(milliseconds=rng.randrange(0, 180_000))
        ttl = rng.choice([None, None, 500])
        msg = {"queue": queue, "message_id": f"m{n}", "publish_ts": iso(t),
               "size": rng.randrange(1, 200)}
        if ttl:
            msg["ttl_ms"] = ttl
        add(t, event="published", protocol=protocol, delivery_count=0, **msg)
        fate = rng.random()
        if fate < 0.06:  # moved, purged or deleted with its queue before any delivery
            add(t + timedelta(milliseconds=rng.randrange(1, 900)),
                event=rng.choice(["moved", "purged", "deleted"]), protocol=protocol,
                delivery_count=0, **msg)
            continue
        if ttl and fate < 0.4:
            add(t + timedelta(milliseconds=ttl + rng.randrange(1, 900)), event="expired",
                protocol=protocol, delivery_count=0, reason="expired", **msg)
            continue
        if fate > 0.95:
            continue  # never delivered
        count_ = 1
        t = t + timedelta(milliseconds=rng.randrange(1, 3000))
        while True:
            on = {"consumer": consumer, "protocol": "mqks" if consumer == "1/a" else "phpmq",
                  "delivery_count": count_}
            add(t, event="delivered", **on, **msg)
            t = t + timedelta(milliseconds=rng.randrange(1, 2000))
            roll = rng.random()
            if roll < 0.6:
                add(t, event="acked", **on, **msg)
            elif roll < 0.8 and count_ < 3:
                add(t, event="requeued", reason=rng.choice(["rejected", "consumer_gone"]),
                    **on, **msg)
                count_ += 1
                t = t + timedelta(milliseconds=rng.randrange(1, 500))
                continue
            elif roll < 0.88:
                add(t, event="dead_lettered", reason=rng.choice(["bad", "retries"]),
                    delivery_count=count_, protocol=on["protocol"], **msg)
            elif roll < 0.92:  # its queue deleted while in flight
                add(t, event="deleted", reason="queue_deleted", **on, **msg)
            break  # else left in flight
    # an end with no publish in the data (as if published before --since): q2 does not balance
    add(BASE + timedelta(seconds=30), event="purged", queue="q2", message_id="ghost",
        publish_ts=iso(BASE), protocol="phpmq", delivery_count=0, size=1)
    events.sort(key=lambda pair: pair[0])
    records = []
    seq = 1
    for i, (t, record) in enumerate(events):
        if i == 40:
            seq += 1  # a lost record
        records.append({"v": 1, "seq": seq, "node": "n1", "ts": iso(t), **record})
        seq += 1
    return records


def write(records: list[dict[str, Any]], root: Path) -> None:
    """Two sealed segments, a garbage line, a torn last line, and an open one ignored."""
    folder = root / "date=2026-11-20"
    folder.mkdir(parents=True)
    half = len(records) // 2
    lines = [json.dumps(r) for r in records]
    (folder / "seg-n1-0000000000000001.jsonl").write_text("\n".join(lines[:half]) + "\nnot json\n")
    torn = json.dumps({"v": 1, "seq": 99999, "node": "n1", "event": "acked"})[:25]
    (folder / f"seg-n1-{half:016d}.jsonl").write_text("\n".join(lines[half:]) + "\n" + torn)
    (folder / "seg-n1-0000000099999999.jsonl.open").write_text(lines[0] + "\n")


def ms(later: str, earlier: str) -> float:
    def parse(s: str) -> datetime:
        return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ")
    return (parse(later) - parse(earlier)).total_seconds() * 1000


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    position = p * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def minute(ts: str) -> str:
    return ts[:16]


def key(r: dict) -> tuple:
    return (r["node"], r["queue"], r["message_id"], r["publish_ts"])


MESSAGE_EVENTS = {"published", "delivered", "acked", "requeued", "dead_lettered", "expired",
                  "moved", "purged", "deleted"}
TERMINAL = {"acked", "dead_lettered", "expired", "moved", "purged", "deleted"}


def brute(records: list[dict[str, Any]]) -> dict[str, dict]:
    """Each report as {key tuple: value tuple}, computed the obvious way."""
    out: dict[str, dict] = {}
    throughput: Counter = Counter()
    size: Counter = Counter()
    for r in records:
        if r["event"] in MESSAGE_EVENTS:
            k = (minute(r["ts"]), r["queue"], r.get("protocol"), r["event"])
            throughput[k] += 1
            size[k] += r.get("size", 0)
    out["throughput"] = {k: (throughput[k], size[k]) for k in throughput}
    lat: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        if r["event"] == "delivered" and r["delivery_count"] == 1:
            lat[(r["queue"], "publish_to_deliver")].append(ms(r["ts"], r["publish_ts"]))
        if r["event"] == "acked":
            lat[(r["queue"], "publish_to_ack")].append(ms(r["ts"], r["publish_ts"]))
    out["latency"] = {k: (len(v), percentile(v, .5), percentile(v, .95), percentile(v, .99),
                          max(v)) for k, v in lat.items()}
    deliveries: Counter = Counter()
    redeliveries: Counter = Counter()
    for r in records:
        if r["event"] == "delivered":
            deliveries[r["queue"]] += 1
            redeliveries[r["queue"]] += r["delivery_count"] > 1
    out["redelivery"] = {(q,): (deliveries[q], redeliveries[q], redeliveries[q] / deliveries[q])
                         for q in deliveries}
    for name, event in (("requeues", "requeued"), ("dead_letters", "dead_lettered")):
        c = Counter((r["queue"], r["reason"]) for r in records if r["event"] == event)
        out[name] = {k: (v,) for k, v in c.items()}
    with_ttl = Counter(r["queue"] for r in records
                       if r["event"] == "published" and "ttl_ms" in r)
    ages: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["event"] == "expired":
            ages[r["queue"]].append(ms(r["ts"], r["publish_ts"]))
    out["ttl"] = {(q,): (with_ttl[q], len(ages[q]), len(ages[q]) / with_ttl[q] if with_ttl[q]
                         else None) for q in set(with_ttl) | set(ages)}
    change: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        if r["event"] == "published":
            change[(r["queue"], minute(r["ts"]))][0] += 1
        elif r["event"] in TERMINAL:
            change[(r["queue"], minute(r["ts"]))][1] += 1
    depth = {}
    running: Counter = Counter()
    for (q, m) in sorted(change):
        pub, settled = change[(q, m)]
        running[q] += pub - settled
        depth[(q, m)] = (pub, settled, running[q])
    out["depth"] = depth
    last: dict[tuple, dict] = {}
    for r in records:
        if r["event"] in MESSAGE_EVENTS and (key(r) not in last or r["seq"] > last[key(r)]["seq"]):
            last[key(r)] = r
    end = max(r["ts"] for r in records)
    held: dict[str, list[float]] = defaultdict(list)
    for r in last.values():
        if r["event"] == "delivered":
            held[r["queue"]].append(ms(end, r["ts"]))
    out["unacked"] = {(q,): (len(v), max(v)) for q, v in held.items()}
    stats: dict[tuple, Counter] = defaultdict(Counter)
    delivered_at = {}
    processing: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        if r.get("consumer") and r["event"] in ("delivered", "acked", "requeued"):
            k = (r["consumer"], r["queue"])
            stats[k][r["event"]] += 1
            dk = (*key(r), r["consumer"], r["delivery_count"])
            if r["event"] == "delivered":
                delivered_at[dk] = r["ts"]
            elif r["event"] == "acked":
                processing[k].append(ms(r["ts"], delivered_at[dk]))
    out["consumers"] = {k: (s["delivered"], s["acked"], s["requeued"],
                            s["acked"] / s["delivered"], max(processing[k], default=None))
                        for k, s in stats.items()}
    seqs = [r["seq"] for r in records]
    out["seq_gaps"] = {("n1",): (len(seqs), min(seqs), max(seqs),
                                 max(seqs) - min(seqs) + 1 - len(set(seqs)))}
    ended = {key(r) for r in records if r["event"] in TERMINAL}
    open_ = Counter(r["queue"] for r in records
                    if r["event"] == "published" and key(r) not in ended)
    out["unterminated"] = {(q,): (v,) for q, v in open_.items()}
    in_flight = Counter(r["queue"] for k, r in last.items() if r["event"] == "delivered")
    unmatched = Counter(r["queue"] for r in records if r["event"] in TERMINAL and key(r) not in {
        key(p) for p in records if p["event"] == "published"})
    out["balance"] = {}
    for q in {r["queue"] for r in records if r["event"] in MESSAGE_EVENTS}:
        c = Counter(r["event"] for r in records if r.get("queue") == q)
        terms = tuple(c[e] for e in ("published", "acked", "dead_lettered", "expired", "moved",
                                     "purged", "deleted"))
        out["balance"][(q,)] = (*terms, open_[q], open_[q] - in_flight[q], in_flight[q],
                                unmatched[q], terms[0] == sum(terms[1:]) + open_[q])
    return out


COLUMNS = {
    "throughput": (("minute", "queue", "protocol", "event"), ("count", "bytes")),
    "latency": (("queue", "kind"), ("count", "p50_ms", "p95_ms", "p99_ms", "max_ms")),
    "redelivery": (("queue",), ("deliveries", "redeliveries", "redelivery_rate")),
    "requeues": (("queue", "reason"), ("count",)),
    "dead_letters": (("queue", "reason"), ("count",)),
    "ttl": (("queue",), ("published_with_ttl", "expired", "expiry_ratio")),
    "depth": (("queue", "minute"), ("published", "settled", "depth")),
    "unacked": (("queue",), ("in_flight", "oldest_unacked_age_ms")),
    "consumers": (("consumer", "queue"),
                  ("delivered", "acked", "requeued", "ack_rate", "max_processing_ms")),
    "seq_gaps": (("node",), ("records", "min_seq", "max_seq", "missing")),
    "unterminated": (("queue",), ("unterminated",)),
    "balance": (("queue",), ("published", "acked", "dead_lettered", "expired", "moved",
                             "purged", "deleted", "still_there", "ready", "in_flight",
                             "unmatched", "balanced")),
}


def normalise(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M")
    if isinstance(value, float):
        return round(value, 6)
    return value


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[list[dict], Path]:
    records = generate()
    root = tmp_path_factory.mktemp("journal")
    write(records, root)
    return records, root


@pytest.fixture(scope="module")
def loaded(spark, generated):
    return load(spark, str(generated[1]))


def test_malformed_and_torn_lines_are_counted_and_open_segments_ignored(loaded, generated):
    records, _ = generated
    assert loaded.malformed == 2
    assert loaded.events.count() == len(records)


@pytest.mark.parametrize("name", list(REPORTS))
def test_report_matches_brute_force(loaded, generated, name):
    records, _ = generated
    keys, values = COLUMNS[name]
    got = {}
    for row in REPORTS[name](loaded.events).collect():
        got[tuple(normalise(row[k]) for k in keys)] = tuple(normalise(row[v]) for v in values)
    expected = {k: tuple(normalise(v) for v in vs) for k, vs in brute(records)[name].items()}
    assert expected, name  # the generator exercises every report
    assert got == expected


def test_since_until_filter(spark, generated):
    records, root = generated
    from mqserver.analytics.load import parse_time

    since, until = parse_time("2026-11-20T10:01:00Z"), parse_time("2026-11-20T10:02:00")
    journal = load(spark, str(root), since, until)
    assert journal.events.count() == sum("10:01:" in r["ts"] for r in records)


def test_cli_writes_parquet_archive_and_html(spark, generated, tmp_path, capsys):
    _, root = generated
    out = tmp_path / "out"
    assert cli.main(["--journal", str(root), "--out", str(out), "--reports",
                     "throughput,latency,dead_letters", "--archive", "--html"]) == 0
    assert spark.read.parquet(str(out / "latency")).count() == 4
    archive = spark.read.parquet(str(out / "archive"))
    assert archive.count() == 300 and {"date", "queue"} <= set(archive.columns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["malformed_lines"] == 2 and summary["archived_messages"] == 300
    page = (out / "report.html").read_text()
    assert page.count("<svg class='plot'") == 7 and "2 malformed lines skipped" in page
    assert "<img" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "2 malformed journal lines skipped" in capsys.readouterr().err
    assert spark.sparkContext._jsc is not None  # the test's session was not stopped


def test_cli_rejects_unknown_reports(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--journal", "j", "--out", "o", "--reports", "nope"])
    assert "unknown reports" in capsys.readouterr().err


def test_cli_prints_the_balance_and_keeps_it_in_summary_and_html(spark, generated, tmp_path,
                                                                 capsys):
    records, root = generated
    out = tmp_path / "out"
    assert cli.main(["--journal", str(root), "--out", str(out), "--reports", "balance",
                     "--html"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["queue", "published", "acked", "dead_lettered", "expired",
                               "moved", "purged", "deleted", "still_there", "unmatched",
                               "balanced"]
    expected = brute(records)["balance"]
    rows = {line.split()[0]: line.split()[1:] for line in text[1:3]}
    for (queue,), values in expected.items():
        *counts, still, _, _, unmatched, balanced = values
        assert rows[queue] == [*map(str, counts), str(still), str(unmatched),
                               "yes" if balanced else "NO"]
    assert text[3] == "balance: 1 of 2 queues do not balance: q2"
    summary = json.loads((out / "summary.json").read_text())["balance"]
    assert (summary["balanced"], summary["unbalanced_queues"]) == (False, ["q2"])
    assert [row["queue"] for row in summary["queues"]] == ["q1", "q2"]
    page = (out / "report.html").read_text()
    assert "<h2 id='balance'>Balance per queue</h2>" in page
    assert "balance: 1 of 2 queues do not balance: q2" in page
