"""Numbers rounded for people."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from mqserver.analytics import human


@pytest.mark.parametrize(("value", "text"), [
    (0.055356130738711505, "0.0554"), (12.3456, "12.3"), (1234.5678, "1,235"), (0, "0"),
    (-0.5, "-0.5"), (2.0, "2"), (1e-9, "0"),
])
def test_significant(value, text):
    assert human.significant(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (1234, "1,234"), (99_999_999, "99,999,999"), (123_456_789, "123 M"),
    (1_234_567_890, "1.23 G"), (2.5, "2.5"), (None, human.NONE),
])
def test_count(value, text):
    assert human.count(value) == text


@pytest.mark.parametrize(("ms", "text"), [
    (0.4234, "0.423 ms"), (12.345, "12.3 ms"), (999.4, "999 ms"), (1500, "1.5 s"),
    (150_000, "2.5 min"), (5_400_000, "1.5 h"), (3 * 86_400_000, "3 d"), (None, human.NONE),
])
def test_duration(ms, text):
    assert human.duration(ms) == text


def test_rate_percent_step_and_time():
    assert (human.rate(0.05), human.rate(12.34), human.rate(12_345.6)) == (
        "0.05/s", "12.3/s", "12,346/s")
    assert (human.percent(0.055356), human.percent(0), human.percent(1e-7),
            human.percent(None)) == ("5.54 %", "0 %", "<0.01 %", human.NONE)
    assert [human.step(s) for s in (1, 15, 60, 300, 3600, 86400, 90)] == [
        "1 s", "15 s", "1 min", "5 min", "1 h", "1 d", "90 s"]
    assert human.timestamp(datetime(2026, 11, 27, 3, 35, 49, 123)) == "2026-11-27 03:35:49 UTC"


def test_cell_rounds_by_column():
    assert human.cell("p99_ms", 12.3456) == "12.3 ms"
    assert human.cell("redelivery_rate", 0.055356130738711505) == "5.54 %"
    assert human.cell("requeue_ratio", 0.5) == "50 %"
    assert human.cell("count", 12345) == "12,345"
    assert human.cell("balanced", True) == "yes" and human.cell("balanced", False) == "NO"
    assert human.cell("minute", datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02 03:04:05 UTC"
    assert human.cell("age", timedelta(seconds=90)) == "1.5 min"
    assert human.cell("queue", "orders") == "orders" and human.cell("x", None) == human.NONE
