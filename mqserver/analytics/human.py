"""Numbers, durations and times rounded for people, for the HTML report.

A report that prints ``0.055356130738711505`` makes its reader do the
rounding; these helpers keep three significant digits (whole numbers stay
whole, with thousands separators) and pick the unit a person would say.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

NONE = "\N{EN DASH}"
"""What a missing value shows."""


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, without exponent or trailing zeros."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{min(decimals, 6)}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def count(value: float | None) -> str:
    """A count: ``1,234``; from a hundred million on ``123 M``, ``1.2 G``."""
    if value is None:
        return NONE
    if abs(value) >= 1e9:
        return f"{significant(value / 1e9)} G"
    if abs(value) >= 1e8:
        return f"{significant(value / 1e6)} M"
    if float(value).is_integer():
        return f"{int(value):,}"
    return significant(value)


def rate(per_second: float) -> str:
    """Messages per second: ``1,234/s``, ``12.3/s``, ``0.05/s``."""
    return f"{significant(per_second) if per_second < 1000 else count(round(per_second))}/s"


def percent(ratio: float | None) -> str:
    """A ratio as a percentage: ``5.5 %``; a tiny non-zero share is ``<0.01 %``."""
    if ratio is None:
        return NONE
    if 0 < ratio * 100 < 0.01:
        return "<0.01 %"
    return f"{significant(ratio * 100)} %"


def duration(ms: float | None) -> str:
    """Milliseconds in a unit people read: ``0.42 ms``, ``12 ms``, ``3.4 s``, ``2.5 min``."""
    if ms is None:
        return NONE
    for limit, scale, unit in ((1e3, 1.0, "ms"), (60e3, 1e3, "s"), (3600e3, 60e3, "min"),
                               (48 * 3600e3, 3600e3, "h")):
        if abs(ms) < limit:
            return f"{significant(ms / scale)} {unit}"
    return f"{significant(ms / 86400e3)} d"


def timestamp(moment: datetime) -> str:
    """A UTC time to the second: ``2026-11-27 03:35:49 UTC``."""
    return utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


def utc(moment: datetime) -> datetime:
    """Spark hands back naive datetimes in the session's time zone, which is UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def step(seconds: float) -> str:
    """A bucket or tick step: ``1 s``, ``5 min``, ``6 h``, ``1 d``."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{significant(seconds)} s"


def cell(column: str, value: Any) -> str:
    """A report's table cell, rounded according to what its column holds."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, timedelta):
        return duration(value.total_seconds() * 1000)
    if isinstance(value, (int, float)):
        if column.endswith("_ms"):
            return duration(value)
        if column.endswith(("_rate", "_ratio")):
            return percent(value)
        return count(value)
    return str(value)
