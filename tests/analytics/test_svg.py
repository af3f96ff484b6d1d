"""Charts as inline SVG: axes span the data, every point is in the DOM."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from xml.etree import ElementTree

import pytest

from mqserver.analytics import human, svg

NS = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 27, 3, 10, 2, 500000, tzinfo=UTC).timestamp()


def parse(text: str) -> ElementTree.Element:
    return ElementTree.fromstring(text)


@pytest.mark.parametrize(("value", "tick", "top"), [
    (0, 1, 1), (0.8, 1, 0.8), (1, 1, 1), (1.1, 2, 1.2), (2.2, 2.5, 2.5), (3, 5, 3), (7, 10, 8),
    (120, 200, 120), (329, 500, 400), (0.03, 0.05, 0.03)])
def test_nice_ceiling(value, tick, top):
    assert svg.nice_ceiling(value) == pytest.approx(tick)
    assert svg.nice_ceiling(value, svg.TOP_FACTORS) == pytest.approx(top)


def test_time_ticks_are_round_clock_times_inside_the_span():
    ticks = svg.time_ticks(START, START + 121.3)  # 03:10:02.5 .. 03:12:03.8
    assert [label for _, label in ticks] == ["03:10:30", "03:11:00", "03:11:30", "03:12:00"]
    assert all(START <= t <= START + 121.3 for t, _ in ticks)
    hours = svg.time_ticks(START, START + 5 * 3600)
    assert [label for _, label in hours][:2] == ["04:00", "05:00"]
    days = svg.time_ticks(START, START + 3 * 86400)
    assert all(re.fullmatch(r"\d\d-\d\d( \d\d:\d\d)?", label) for _, label in days)
    assert svg.time_ticks(START, START) == []  # one record: no whole second inside


def test_linear_and_log_ticks():
    assert [v for v, _ in svg.linear_ticks(0, 250, human.count)] == [
        0, 50, 100, 150, 200, 250]
    assert [label for _, label in svg.log_ticks(0.3, 4000, human.duration)] == [
        "1 ms", "10 ms", "100 ms", "1 s"]


def test_line_chart_spans_exactly_the_range_given_and_holds_every_point():
    series = [svg.Series("published", "#123456", [(START, 3.0), (START + 60, 7.0)]),
              svg.Series("acked <b>", "#654321", [(START + 30, 1.0)])]
    root = parse(svg.line_chart("t", series, (START, START + 60)))
    assert root.tag == f"{NS}svg" and root.get("class") == "plot"
    assert (float(root.get("data-x-min")), float(root.get("data-x-max"))) == (START, START + 60)
    assert (root.get("data-y-min"), root.get("data-y-max")) == ("0.0", "8.0")
    points = root.findall(f"{NS}circle")
    assert [(float(p.get("data-x")), float(p.get("data-y"))) for p in points] == [
        (START, 3.0), (START + 60, 7.0), (START + 30, 1.0)]
    xs = [float(p.get("cx")) for p in points]
    assert xs[0] == svg.LEFT and xs[1] == svg.WIDTH - svg.RIGHT  # the ends of the plot area
    assert points[2].get("data-series") == "acked <b>"
    assert points[0].find(f"{NS}title").text == "published: 3"
    lines = root.findall(f"{NS}polyline")
    assert [line.get("stroke") for line in lines] == ["#123456", "#654321"]


def test_log_axis_puts_decades_evenly_and_clamps_zero_to_its_start():
    series = [svg.Series("q", "#000", [(0.0, 0.0), (1.0, 0.5), (100.0, 1.0)])]
    root = parse(svg.line_chart("cdf", series, (1.0, 100.0), x_kind="ms", x_log=True,
                                y_max=1.0, y_format=human.percent))
    cx = [float(p.get("cx")) for p in root.findall(f"{NS}circle")]
    assert cx[0] == cx[1] == svg.LEFT and cx[2] == svg.WIDTH - svg.RIGHT
    labels = [t.text for t in root.findall(f"{NS}text")]
    assert {"1 ms", "10 ms", "100 ms", "100 %"} <= set(labels)


def test_many_points_are_hover_targets_without_dots():
    points = [(START + i, float(i)) for i in range(svg.DOTS_UP_TO + 1)]
    root = parse(svg.line_chart("t", [svg.Series("s", "#111", points)],
                                (START, START + svg.DOTS_UP_TO)))
    assert {p.get("fill") for p in root.findall(f"{NS}circle")} == {"transparent"}


def test_bar_chart_stacks_segments_and_skips_empty_ones():
    bars = [svg.Bar("1/a on q", [("acked", 90, "#0f0"), ("requeued", 10, "#ff0"),
                                 ("not settled", 0, "#999")], "90 % acked"),
            svg.Bar("2/b on q", [("acked", 40, "#0f0")])]
    root = parse(svg.bar_chart("bars", bars))
    rects = root.findall(f"{NS}rect[@class='pt']")
    assert [(r.get("data-series"), float(r.get("data-x"))) for r in rects] == [
        ("acked", 90), ("requeued", 100), ("acked", 40)]
    assert float(rects[1].get("x")) == pytest.approx(
        float(rects[0].get("x")) + float(rects[0].get("width")), abs=0.11)
    assert root.get("data-x-max") == "100.0"
    assert "90 % acked" in [t.text for t in root.findall(f"{NS}text")]


def test_legend_escapes_labels():
    assert svg.legend([("<q>", "#fff")]) == (
        "<ul class='legend'><li><span style='background:#fff'></span>&lt;q&gt;</li></ul>")
