"""Charts as inline SVG: plain data in, an ``<svg>`` string out.

Why SVG written here rather than matplotlib PNGs or a JavaScript library:
the report must be one file that opens on a machine without internet (no
CDN), and the charts are a few lines, points and bars.  Inline SVG needs no
script, prints, zooms without blur, shows each point's value as a tooltip
(``<title>``), and keeps every point and axis range in the DOM, where the
browser test reads them (``data-x-min``/``data-x-max`` on each ``svg.plot``,
``data-x``/``data-y`` on each point).

Axes span the data given: a time axis runs from the journal's first record
to its last, never wider, with ticks at round clock times.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mqserver.analytics import human

WIDTH, HEIGHT = 880, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 30
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
"""Tableau's ten categorical colours: distinct for most colour vision."""
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
              43200, 86400, 172800, 604800)
MAX_TICKS = 8
TICK_FACTORS = (1, 2, 2.5, 5, 10)
"""Steps between ticks: 1, 2, 2.5 or 5 times a power of ten."""
TOP_FACTORS = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)
"""Tops of value axes, finer than the ticks so that the data fills most of the height."""
NOTE_WIDTH = 170
"""Room right of the longest bar for its note."""
DOTS_UP_TO = 80
"""Points per series drawn as visible dots; more are hover targets on the line only."""


@dataclass
class Series:
    """One line: its legend label, colour and (x, y) points, x ascending."""

    label: str
    color: str
    points: list[tuple[float, float]]


@dataclass
class Bar:
    """One row of a horizontal bar chart: stacked segments (name, value, colour)."""

    label: str
    segments: list[tuple[str, float, str]]
    note: str = ""


@dataclass
class Axis:
    """A linear or logarithmic map from data to pixels, with its ticks."""

    lo: float
    hi: float
    start: float
    end: float
    log: bool = False
    ticks: list[tuple[float, str]] = field(default_factory=list)

    def __call__(self, value: float) -> float:
        if self.log:
            value, lo, hi = (math.log10(max(value, self.lo)), math.log10(self.lo),
                             math.log10(self.hi))
        else:
            lo, hi = self.lo, self.hi
        return self.start + (value - lo) / ((hi - lo) or 1) * (self.end - self.start)


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def nice_ceiling(value: float, factors: tuple[float, ...] = TICK_FACTORS) -> float:
    """The smallest of ``factors`` times a power of ten at or above ``value`` (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in factors:
        if value <= factor * power * (1 + 1e-9):
            return float(factor * power)
    return float(10 * power)


def linear_ticks(lo: float, hi: float, fmt: Callable[[float], str]) -> list[tuple[float, str]]:
    """Ticks at round values, at most ``MAX_TICKS`` of them."""
    width = hi - lo
    tick = nice_ceiling(width / (MAX_TICKS - 1)) if width > 0 else 1.0
    first = math.ceil(lo / tick - 1e-9) * tick
    count = math.floor((hi - first) / tick + 1e-9) + 1
    return [(first + i * tick, fmt(first + i * tick)) for i in range(count)]


def time_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """Ticks at round UTC clock times (epoch seconds) inside [lo, hi]."""
    step = next((s for s in TIME_STEPS if (hi - lo) / s <= MAX_TICKS - 1), TIME_STEPS[-1])
    pattern = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%m-%d"
    if step < 86400 and hi - lo > 86400:
        pattern = "%m-%d %H:%M"
    first = math.ceil(lo / step) * step
    return [(t, datetime.fromtimestamp(t, UTC).strftime(pattern))
            for t in range(int(first), int(hi) + 1, step) if lo <= t <= hi]


def log_ticks(lo: float, hi: float, fmt: Callable[[float], str]) -> list[tuple[float, str]]:
    """Ticks at the powers of ten inside [lo, hi]."""
    return [(10.0 ** k, fmt(10.0 ** k))
            for k in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)]


def _text(x: float, y: float, text: str, anchor: str = "middle", cls: str = "tick") -> str:
    return (f"<text class='{cls}' x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}'>"
            f"{html.escape(text)}</text>")


def _frame(x: Axis, y: Axis, x_kind: str, title: str, body: list[str], height: int) -> str:
    """The ``<svg>`` with grid lines, tick labels and the data ranges in attributes."""
    left, right, bottom, top = x.start, x.end, y.start, y.end
    parts = [f"<svg class='plot' xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {WIDTH} "
             f"{height}' width='{WIDTH}' height='{height}' role='img' "
             f"aria-label='{html.escape(title, quote=True)}' data-x-kind='{x_kind}' "
             f"data-x-min='{x.lo!r}' data-x-max='{x.hi!r}' data-y-min='{y.lo!r}' "
             f"data-y-max='{y.hi!r}'>"]
    for value, label in y.ticks:
        py = y(value)
        parts.append(f"<line class='grid' x1='{left}' x2='{right}' y1='{py:.1f}' "
                     f"y2='{py:.1f}'/>")
        parts.append(_text(left - 6, py + 4, label, "end"))
    for value, label in x.ticks:
        px = x(value)
        parts.append(f"<line class='grid' x1='{px:.1f}' x2='{px:.1f}' y1='{top}' "
                     f"y2='{bottom}'/>")
        parts.append(_text(px, bottom + 16, label))
    parts.append(f"<rect class='frame' x='{left}' y='{top}' width='{right - left}' "
                 f"height='{bottom - top}'/>")
    parts.extend(body)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, series: Sequence[Series], x_range: tuple[float, float], *,
               x_kind: str = "time", x_log: bool = False, y_max: float | None = None,
               y_format: Callable[[float], str] = human.count,
               x_format: Callable[[float], str] = human.duration,
               tooltip: Callable[[Series, float, float], str] | None = None) -> str:
    """Lines over ``x_range`` (epoch seconds when ``x_kind`` is ``time``), y from 0 up to
    a round value at or above ``y_max`` (default: the highest point).

    ``tooltip`` makes each point's hover text.
    """
    lo, hi = x_range
    top = nice_ceiling(y_max if y_max is not None
                       else max((p[1] for s in series for p in s.points), default=0), TOP_FACTORS)
    height = HEIGHT
    x = Axis(lo, hi, LEFT, WIDTH - RIGHT, log=x_log)
    x.ticks = (time_ticks(lo, hi) if x_kind == "time" else
               log_ticks(lo, hi, x_format) if x_log else linear_ticks(lo, hi, x_format))
    y = Axis(0.0, top, height - BOTTOM, TOP)
    y.ticks = linear_ticks(0.0, top, y_format)
    body = []
    for one in series:
        coords = [(x(px), y(py)) for px, py in one.points]
        label = html.escape(one.label, quote=True)
        body.append(f"<polyline class='series' data-label='{label}' fill='none' "
                    f"stroke='{one.color}' points='"
                    + " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords) + "'/>")
        radius, fill = (2.2, one.color) if len(one.points) <= DOTS_UP_TO else (3.5, "transparent")
        for (px, py), (cx, cy) in zip(one.points, coords, strict=True):
            hover = tooltip(one, px, py) if tooltip else f"{one.label}: {y_format(py)}"
            body.append(f"<circle class='pt' cx='{cx:.1f}' cy='{cy:.1f}' r='{radius}' "
                        f"fill='{fill}' data-series='{label}' data-x='{px!r}' data-y='{py!r}'>"
                        f"<title>{html.escape(hover)}</title></circle>")
    return _frame(x, y, x_kind, title, body, height)


def bar_chart(title: str, bars: Sequence[Bar], *,
              x_format: Callable[[float], str] = human.count) -> str:
    """Horizontal stacked bars, one row per ``Bar``, labels inside the left margin."""
    row, label_width = 22, 260
    height = TOP + BOTTOM + row * max(len(bars), 1)
    total = max((sum(v for _, v, _ in bar.segments) for bar in bars), default=0)
    x = Axis(0.0, nice_ceiling(total, TOP_FACTORS), label_width, WIDTH - RIGHT - NOTE_WIDTH)
    x.ticks = linear_ticks(0.0, x.hi, x_format)
    y = Axis(0.0, 1.0, height - BOTTOM, TOP)
    body = []
    for index, bar in enumerate(bars):
        top = TOP + index * row + 4
        body.append(_text(label_width - 8, top + 12, bar.label, "end", "label"))
        left = 0.0
        for name, value, fill in bar.segments:
            if value <= 0:
                continue
            x0, x1 = x(left), x(left + value)
            body.append(f"<rect class='pt' x='{x0:.1f}' y='{top}' width='{x1 - x0:.1f}' "
                        f"height='{row - 8}' fill='{fill}' data-series='{html.escape(name)}' "
                        f"data-x='{left + value!r}' data-y='{index}'><title>"
                        f"{html.escape(f'{bar.label}: {x_format(value)} {name}')}</title></rect>")
            left += value
        if bar.note:
            body.append(_text(x(left) + 6, top + 12, bar.note, "start", "note"))
    return _frame(x, y, "count", title, body, height)


def legend(items: Sequence[tuple[str, str]]) -> str:
    """An HTML legend: (label, colour) pairs as swatches."""
    return "<ul class='legend'>" + "".join(
        f"<li><span style='background:{fill}'></span>{html.escape(label)}</li>"
        for label, fill in items) + "</ul>"
