"""The ``mqserver-journal`` data source: planning helpers alone, then real Spark streams.

Segments are written by the journal's own ``SegmentWriter``; the Spark tests
run ``trigger(availableNow=True)`` queries from a checkpoint and check that
every sealed record arrives exactly once, with the batch loader's values.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from mqserver.analytics.tail import (
    Segment,
    SegmentIndex,
    advance,
    last_seq,
    parse_line,
    plan,
    read_segment,
    scan,
    starting_offsets,
)
from mqserver.journal.schema import FIELD_NAMES, segment_name
from mqserver.journal.segments import SegmentWriter

T0 = 1_795_000_000.25  # 2026-11-18T11:06:40.25Z


def published(n: int, t: float) -> tuple[Any, ...]:
    """A full ``published`` event with a header and a body (14 fields, see encode.Event)."""
    return ("published", t, b"q1", f"m{n}".encode(), t, 0, None, None, b"mqks", 3, t + 5.0,
            None, {"h": str(n)}, b"b%03d" % n)


def acked(n: int, t: float) -> tuple[Any, ...]:
    return ("acked", t + 1.0, b"q1", f"m{n}".encode(), t, 1, b"c1", 7, b"phpmq", 3, None,
            None, None, None)


def events(first: int, count: int) -> list[Any]:
    """Messages ``first``.. published and acked, as one flat batch (what the broker hands over)."""
    return [value for n in range(first, first + count)
            for event in (published(n, T0 + n), acked(n, T0 + n)) for value in event]


def writer(directory: Path, node: str) -> SegmentWriter:
    return SegmentWriter(str(directory), node, lambda: T0, bodies=True)


def write_sealed(w: SegmentWriter, batch: list[Any]) -> str:
    """Write ``batch`` as one sealed segment; its path."""
    w.write(batch)
    assert w._path.endswith(".open")
    w.seal()
    return w._path[: -len(".open")]


def insert_garbage(path: str, after_line: int) -> None:
    lines = Path(path).read_bytes().splitlines(keepends=True)
    lines.insert(after_line, b'{"seq": "not a row", garbage\n')
    Path(path).write_bytes(b"".join(lines))


# --- planning helpers, no Spark ---------------------------------------------


def test_scan_lists_sealed_segments_per_node_in_seq_order(tmp_path: Path) -> None:
    day1, day2 = tmp_path / "date=2026-11-18", tmp_path / "date=2026-11-19"
    day1.mkdir()
    day2.mkdir()
    for folder, node, seq in [(day2, "a", 120), (day1, "a", 1), (day1, "a", 20), (day1, "b", 5)]:
        (folder / segment_name(node, seq)).write_text("")
    (day2 / (segment_name("a", 200) + ".open")).write_text("")
    (day1 / "notes.txt").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / segment_name("c", 1)).write_text("")
    nodes = scan(str(tmp_path))
    assert {node: [s.first_seq for s in segs] for node, segs in nodes.items()} == {
        "a": [1, 20, 120], "b": [5]}
    assert nodes["b"][0].path == str(day1 / segment_name("b", 5))
    assert scan(str(tmp_path / "missing")) == {}


def test_last_seq_reads_the_last_well_formed_record_from_the_end(tmp_path: Path) -> None:
    w = writer(tmp_path, "a")
    path = write_sealed(w, events(1, 3))  # seqs 1..6
    segment = Segment("a", 1, path)
    assert last_seq(segment) == 6
    assert last_seq(segment, chunk=7) == 6  # lines longer than a read
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":7,"ts":"2026-11-18T11:0')  # torn, as after a crash
    assert last_seq(segment, chunk=16) == 6
    Path(path).write_bytes(b"garbage\n\n")
    assert last_seq(segment) == 0


def test_index_reads_each_newest_segment_once(tmp_path: Path) -> None:
    a, b = writer(tmp_path, "a"), writer(tmp_path, "b")
    path = write_sealed(a, events(1, 2))
    write_sealed(b, events(1, 1))
    index = SegmentIndex(str(tmp_path))
    assert index.latest() == {"a": 4, "b": 2}
    Path(path).write_bytes(b"")  # sealed segments never change: the answer is kept
    assert index.latest() == {"a": 4, "b": 2}
    write_sealed(a, events(3, 1))
    assert index.latest() == {"a": 6, "b": 2}


def test_advance_takes_everything_new_never_moving_back() -> None:
    assert advance({}, {"a": 5, "b": 2}) == {"a": 5, "b": 2}
    assert advance({"a": 5, "gone": 9}, {"a": 7}) == {"a": 7, "gone": 9}
    assert advance({"a": 5}, {"a": 3}) == {"a": 5}
    assert advance({"a": 5}, {"a": 5}) == {"a": 5}


def test_advance_stops_at_the_available_now_target() -> None:
    assert advance({"a": 2}, {"a": 10, "b": 4}, target={"a": 6}) == {"a": 6}
    assert advance({"a": 6}, {"a": 10}, target={"a": 6}) == {"a": 6}


def test_advance_shares_max_records_fairly() -> None:
    assert advance({}, {"a": 100, "b": 2, "c": 100}, max_records=10) == {"a": 4, "b": 2, "c": 4}
    assert advance({"a": 10}, {"a": 100}, max_records=10) == {"a": 20}
    # a budget smaller than the node count still moves some node
    assert sum(advance({}, {"a": 9, "b": 9, "c": 9}, max_records=1).values()) == 1


def test_plan_picks_segments_overlapping_the_range(tmp_path: Path) -> None:
    nodes = {
        "a": [Segment("a", 1, "a1"), Segment("a", 11, "a11"), Segment("a", 21, "a21")],
        "b": [Segment("b", 1, "b1")],
    }
    assert plan(nodes, {}, {"a": 30, "b": 4}) == [
        ("a1", 0, 30), ("a11", 0, 30), ("a21", 0, 30), ("b1", 0, 4)]
    assert plan(nodes, {"a": 10, "b": 4}, {"a": 15, "b": 4}) == [("a11", 10, 15)]
    assert plan(nodes, {"a": 12}, {"a": 25}) == [("a11", 12, 25), ("a21", 12, 25)]
    assert plan(nodes, {"a": 20}, {"a": 20}) == []


def test_starting_offsets_option(tmp_path: Path) -> None:
    write_sealed(writer(tmp_path, "a"), events(1, 2))
    index = SegmentIndex(str(tmp_path))
    assert starting_offsets("earliest", index) == {}
    assert starting_offsets("latest", index) == {"a": 4}
    assert starting_offsets('{"a": 2}', index) == {"a": 2}
    for bad in ('{"a": "2"}', "[1]", "newest"):
        with pytest.raises(ValueError):
            starting_offsets(bad, index)


def test_parse_line_gives_spark_values_in_schema_order(tmp_path: Path) -> None:
    path = write_sealed(writer(tmp_path, "a"), events(1, 1))
    first = Path(path).read_bytes().splitlines()[0]
    row = dict(zip(FIELD_NAMES, parse_line(first) or (), strict=True))
    assert row["seq"] == 1 and row["event"] == "published" and row["node"] == "a"
    assert row["ts"].isoformat() == "2026-11-18T11:06:41.250000+00:00"
    assert row["publish_ts"] == row["ts"]
    assert (row["headers"], row["body"], row["ttl_ms"], row["consumer"]) == (
        {"h": "1"}, b"b001", 5000, None)
    naive = parse_line(b'{"seq":1,"event":"acked","ts":"2026-11-18T11:06:41"}')
    assert naive is not None and naive[FIELD_NAMES.index("ts")].utcoffset().total_seconds() == 0


@pytest.mark.parametrize("line", [
    b"", b"not json", b"[1, 2]", b"\xff\xfe",
    b'{"event":"acked","ts":"2026-11-18T11:06:41Z"}',  # no seq
    b'{"seq":1,"ts":"2026-11-18T11:06:41Z"}',  # no event
    b'{"seq":1,"event":"acked","ts":1795000000}',  # epoch, not ISO
    b'{"seq":"1","event":"acked","ts":"2026-11-18T11:06:41Z"}',
    b'{"seq":1,"event":"acked","ts":"2026-11-18T11:06:41Z","size":4294967296}',
    b'{"seq":1,"event":"acked","ts":"2026-11-18T11:06:41Z","delivery_count":true}',
    b'{"seq":1,"event":"acked","ts":"2026-11-18T11:06:41Z","headers":{"a":1}}',
    b'{"seq":1,"event":"acked","ts":"2026-11-18T11:06:41Z","body":"not base64!"}',
])
def test_parse_line_rejects_malformed_lines(line: bytes) -> None:
    assert parse_line(line) is None


def test_read_segment_filters_by_seq_and_skips_garbage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_sealed(writer(tmp_path, "a"), events(1, 3))  # seqs 1..6
    insert_garbage(path, 2)
    seq = FIELD_NAMES.index("seq")
    with caplog.at_level(logging.WARNING, logger="mqserver.analytics.tail"):
        assert [row[seq] for row in read_segment(path)] == [1, 2, 3, 4, 5, 6]
        assert [row[seq] for row in read_segment(path, 2, 5)] == [3, 4, 5]
    assert caplog.messages == [f"mqserver-journal: 1 malformed lines skipped in {path}"] * 2


# --- Spark ------------------------------------------------------------------


def _run(spark: Any, journal: Path, checkpoint: Path, **options: str) -> list[list[Any]]:
    """One availableNow run from ``checkpoint``: the rows of each micro-batch, as dicts."""
    batches: list[list[Any]] = []

    def collect(frame: Any, batch_id: int) -> None:
        batches.append([row.asDict() for row in frame.collect()])

    reader = spark.readStream.format("mqserver-journal")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load(str(journal)).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return batches


def _batch_loader_rows(spark: Any, journal: Path) -> dict[tuple[str, int], dict[str, Any]]:
    from mqserver.analytics.load import load

    loaded = load(spark, str(journal))
    rows = {(r["node"], r["seq"]): r.asDict() for r in loaded.events.drop("date").collect()}
    loaded.raw.unpersist()
    return rows


def _keyed(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    keyed = {(r["node"], r["seq"]): r for r in rows}
    assert len(keyed) == len(rows), "a record arrived twice"
    return keyed


def test_stream_reads_sealed_records_once_and_resumes_from_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    journal, checkpoint = tmp_path / "journal", tmp_path / "checkpoint"
    a = writer(journal, "a")
    write_sealed(a, events(1, 3))  # seqs 1..6
    insert_garbage(write_sealed(a, events(4, 2)), 1)  # seqs 7..10, a garbage line
    a.write(events(6, 1))  # seqs 11..12 stay .open
    assert [n for n in os.listdir(a.directory + "/date=2026-11-18") if n.endswith(".open")]

    first = _run(spark, journal, checkpoint)
    rows = _keyed([row for batch in first for row in batch])
    assert sorted(rows) == [("a", seq) for seq in range(1, 11)]
    assert rows[("a", 1)]["body"] == b"b001" and rows[("a", 1)]["headers"] == {"h": "1"}
    assert rows[("a", 2)]["consumer"] == "7/c1" and rows[("a", 2)]["event"] == "acked"

    a.seal()  # seqs 11..12
    write_sealed(a, events(7, 2))  # seqs 13..16
    write_sealed(writer(journal, "b"), events(1, 3))  # node b: seqs 1..6
    second = _run(spark, journal, checkpoint, maxRecordsPerTrigger="6")
    assert [len(batch) for batch in second] == [6, 6]  # 3 + 3 per node, then 3 + 3
    new = _keyed([row for batch in second for row in batch])
    assert sorted(new) == [("a", s) for s in range(11, 17)] + [("b", s) for s in range(1, 7)]
    # the same values as the batch loader, which reads the same (now all sealed) files
    assert {**rows, **new} == _batch_loader_rows(spark, journal)

    last = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    offset = (checkpoint / "offsets" / str(last)).read_text().splitlines()[-1]
    assert json.loads(offset) == {"a": 16, "b": 6}


def test_batch_read_matches_the_batch_loader(spark: Any, tmp_path: Path) -> None:
    write_sealed(writer(tmp_path, "a"), events(1, 2))
    insert_garbage(write_sealed(writer(tmp_path, "b"), events(1, 2)), 4)
    frame = spark.read.format("mqserver-journal").load(str(tmp_path))
    assert frame.columns == list(FIELD_NAMES)
    assert _keyed([r.asDict() for r in frame.collect()]) == _batch_loader_rows(spark, tmp_path)
