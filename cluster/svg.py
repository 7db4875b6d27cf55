"""Line charts as inline SVG, drawn by hand so the reports need no plotting library, and
the page look they share (the load test's reports and ``tessera capacity --html``).

Layer: PURE. Numbers in, SVG and HTML text out: axes with round ticks (linear, or log10
for latencies), one polyline per series, a legend; the head of a report page. No I/O, no
clock. Must not know what the numbers mean (the report modules do). It sits in
``cluster`` because both the load test and the console draw with it and neither may
import the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Final

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
WIDTH, HEIGHT = 640, 330
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 70

PAGE_STYLE = """\
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1340px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
td:first-child { text-align: left; }
th { background: #f4f4f4; text-align: left; }
.facts td { text-align: left; }
.grid { display: flex; flex-wrap: wrap; gap: 16px; }
.grid svg { border: 1px solid #ddd; }
li { margin: 4px 0; }
"""
"""The look every report shares (the demo's, the real demo's, the capacity report's)."""


def page_head(title: str) -> str:
    """An HTML page up to the end of ``<body>``'s opening tag, in the reports' look."""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title>\n<style>\n{PAGE_STYLE}</style></head><body>"
    )


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 5 x a power of ten apart)."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks: list[float] = []
    value = first
    while True:
        ticks.append(round(value, 10))
        if value >= high - step * 1e-9:
            return ticks
        value += step


def log_ticks(low: float, high: float) -> list[float]:
    low_exp = math.floor(math.log10(max(low, 1e-12)))
    high_exp = math.ceil(math.log10(max(high, low * 10, 1e-12)))
    return [10.0**e for e in range(low_exp, high_exp + 1)]


def _label(value: float, unit: str) -> str:
    if unit == "ms":
        if value >= 1000:
            return f"{value / 1000:g} s"
        return f"{value:g} ms"
    if unit == "%":
        return f"{value:g}%"
    if abs(value) >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    x_unit: str = "",
    y_unit: str = "",
    log_x: bool = False,
    y_min: float | None = 0.0,
    y_max: float | None = None,
    step: bool = False,
) -> str:
    """An SVG chart; ``step`` draws each series as a step function (CDFs, counts)."""
    points = [p for s in series for p in s.points if not log_x or p[0] > 0]
    if not points:
        return _empty(title)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks = log_ticks(min(xs), max(xs)) if log_x else nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(min(ys) if y_min is None else y_min, max(ys) if y_max is None else y_max)
    frame = _Frame(x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1], log_x)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{escape(title)}</text>',
    ]
    out += _grid(frame, x_ticks, y_ticks, x_unit, y_unit)
    out += _axes(x_label, y_label)
    out += _lines(frame, series, step)
    out.append("</svg>")
    return "\n".join(out)


PLOT_W: Final = WIDTH - LEFT - RIGHT
PLOT_H: Final = HEIGHT - TOP - BOTTOM


@dataclass(frozen=True, slots=True)
class _Frame:
    """Where a value lands on the plot: the axes' ends (ticks, not logs) and the scale."""

    x_first: float
    x_last: float
    y_lo: float
    y_hi: float
    log_x: bool

    def px(self, x: float) -> float:
        if self.log_x:
            lo, hi, v = math.log10(self.x_first), math.log10(self.x_last), math.log10(x)
        else:
            lo, hi, v = self.x_first, self.x_last, x
        return LEFT + (v - lo) / ((hi - lo) or 1.0) * PLOT_W

    def py(self, y: float) -> float:
        return TOP + PLOT_H - (y - self.y_lo) / ((self.y_hi - self.y_lo) or 1.0) * PLOT_H


def _grid(
    frame: _Frame, x_ticks: Sequence[float], y_ticks: Sequence[float], x_unit: str, y_unit: str
) -> list[str]:
    out = []
    for t in x_ticks:
        x = frame.px(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + PLOT_H}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{TOP + PLOT_H + 14}" text-anchor="middle">'
            f"{escape(_label(t, x_unit))}</text>"
        )
    for t in y_ticks:
        y = frame.py(t)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + PLOT_W}" y2="{y:.1f}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(_label(t, y_unit))}</text>"
        )
    return out


def _axes(x_label: str, y_label: str) -> list[str]:
    return [
        f'<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" '
        'fill="none" stroke="#888"/>',
        f'<text x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H + 30}" text-anchor="middle">'
        f"{escape(x_label)}</text>",
        f'<text x="14" y="{TOP + PLOT_H / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + PLOT_H / 2})">{escape(y_label)}</text>',
    ]


def _lines(frame: _Frame, series: Sequence[Series], step: bool) -> list[str]:
    """One polyline per series, and its entry in the legend."""
    out = []
    legend_x, legend_y = LEFT, HEIGHT - 18
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = [p for p in s.points if not frame.log_x or p[0] > 0]
        coords: list[str] = []
        for j, (x, y) in enumerate(pts):
            if step and j:
                coords.append(f"{frame.px(x):.1f},{frame.py(pts[j - 1][1]):.1f}")
            coords.append(f"{frame.px(x):.1f},{frame.py(y):.1f}")
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        if coords:
            out.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.8"{dash} '
                f'points="{" ".join(coords)}"/>'
            )
        out.append(
            f'<line x1="{legend_x}" y1="{legend_y - 4}" x2="{legend_x + 18}" '
            f'y2="{legend_y - 4}" stroke="{color}" stroke-width="3"{dash}/>'
        )
        out.append(f'<text x="{legend_x + 22}" y="{legend_y}">{escape(s.label)}</text>')
        legend_x += 30 + 7 * len(s.label)
    return out


def _empty(title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="60">'
        f'<text x="10" y="30" font-family="sans-serif">{escape(title)}: no data</text></svg>'
    )


def cdf_points(values: Sequence[float], max_points: int = 400) -> list[tuple[float, float]]:
    """(value, % of samples at or below it), thinned to about ``max_points``."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return []
    stride = max(1, n // max_points)
    points = [(ordered[i], 100.0 * (i + 1) / n) for i in range(0, n, stride)]
    if points[-1][1] < 100.0:
        points.append((ordered[-1], 100.0))
    return points
