"""Two small SVG charts for the HTML report, drawn here rather than by a plotting library: a line plot on a log2 x
axis (bandwidth against message size) and horizontal bars with a median and a threshold line (hosts side by side).

Each drawn point is a `<circle class="point">` and each bar a `<rect class="bar">` carrying its figures as data-
attributes and a `<title>` (the browser's tooltip), inside the `<rect class="plot-area">` that the axes frame: the
browser test measures exactly those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
FAIL_COLOUR = "#c62828"
BAR_COLOUR = "#4a7fb5"


@dataclass(frozen=True)
class Series:
    """One line of a plot: (x, y) points, x > 0."""

    name: str
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class Bar:
    """One bar: a label, its value, whether it is an outlier."""

    label: str
    value: float | None  # None: nothing measured (drawn as an empty row)
    outlier: bool = False


def size_label(size: float) -> str:
    """A byte count as a short binary size: 64K, 1M, 2G."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f}{unit}" if value.is_integer() else f"{value:.1f}{unit}"
    return f"{size:.0f}"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least top: steps of 1, 2 or 5 times a power of ten."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _number(value: float) -> str:
    return f"{value:.3g}"


def line_plot(series: Sequence[Series], *, x_label: str, y_label: str, width: int = 720, height: int = 320) -> str:
    """Lines with their points, x on a log2 scale (labelled as sizes), y linear from 0, a legend on the right."""
    left, right, top, bottom = 64, 130, 16, 48
    inner_w, inner_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points if x > 0]
    ys = [y for s in series for _, y in s.points]
    lo, hi = math.log2(min(xs)), math.log2(max(xs))
    span = hi - lo or 1.0
    ticks = nice_ticks(max(ys, default=0.0))

    def px(x: float) -> float:
        return left + (math.log2(x) - lo) / span * inner_w

    def py(y: float) -> float:
        return top + inner_h - y / ticks[-1] * inner_h

    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(y_label)} against {escape(x_label)}">',
           f'<rect class="plot-area" x="{left}" y="{top}" width="{inner_w}" height="{inner_h}" fill="#fafafa" stroke="#999"/>']
    for tick in ticks:
        y = py(tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + inner_w}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_number(tick)}</text>')
    step = max(1, math.ceil(span / 8))  # at most about 9 labels on the x axis
    for k in range(math.ceil(lo), math.floor(hi) + 1, step):
        x = px(2.0 ** k)
        out.append(f'<line x1="{x:.1f}" y1="{top + inner_h}" x2="{x:.1f}" y2="{top + inner_h + 4}" stroke="#999"/>'
                   f'<text x="{x:.1f}" y="{top + inner_h + 17}" text-anchor="middle" class="tick">{size_label(2.0 ** k)}</text>')
    out.append(f'<text x="{left + inner_w / 2:.1f}" y="{height - 8}" text-anchor="middle" class="axis-label">{escape(x_label)}</text>'
               f'<text transform="translate(14 {top + inner_h / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'class="axis-label">{escape(y_label)}</text>')
    for index, line in enumerate(series):
        colour = PALETTE[index % len(PALETTE)]
        coords = [(px(x), py(y), x, y) for x, y in line.points if x > 0]
        path = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy, _, _ in coords)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for cx, cy, x, y in coords:
            out.append(f'<circle class="point" data-series="{escape(line.name)}" data-x="{x:g}" data-y="{y:g}" '
                       f'cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{colour}">'
                       f'<title>{escape(line.name)} {size_label(x)}B: {_number(y)}</title></circle>')
        legend_y = top + 8 + index * 20
        out.append(f'<rect x="{left + inner_w + 14}" y="{legend_y}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{left + inner_w + 32}" y="{legend_y + 10}" class="legend">{escape(line.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(bars: Sequence[Bar], *, unit: str, median: float | None, threshold: float | None, width: int = 720) -> str:
    """Horizontal bars, one per label, with the median (dashed) and the outlier threshold (red); outliers in red."""
    left, right, top, bottom, row = 120, 80, 8, 36, 20
    inner_w, inner_h = width - left - right, row * len(bars)
    height = top + inner_h + bottom
    ticks = nice_ticks(max([b.value or 0.0 for b in bars] + [median or 0.0]))

    def px(value: float) -> float:
        return left + value / ticks[-1] * inner_w

    out = [f'<svg class="bars" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(unit)} per host">',
           f'<rect class="plot-area" x="{left}" y="{top}" width="{inner_w}" height="{inner_h}" fill="#fafafa" stroke="#999"/>']
    for tick in ticks:
        x = px(tick)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + inner_h}" stroke="#e3e3e3"/>'
                   f'<text x="{x:.1f}" y="{top + inner_h + 14}" text-anchor="middle" class="tick">{_number(tick)}</text>')
    out.append(f'<text x="{left + inner_w / 2:.1f}" y="{height - 6}" text-anchor="middle" class="axis-label">{escape(unit)}</text>')
    for index, bar in enumerate(bars):
        y = top + index * row
        colour = FAIL_COLOUR if bar.outlier else BAR_COLOUR
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end" class="bar-label">{escape(bar.label)}</text>')
        if bar.value is not None:
            out.append(f'<rect class="bar{" outlier" if bar.outlier else ""}" data-label="{escape(bar.label)}" data-value="{bar.value:g}" '
                       f'x="{left}" y="{y + 3}" width="{max(px(bar.value) - left, 1.0):.1f}" height="{row - 6}" fill="{colour}">'
                       f'<title>{escape(bar.label)}: {_number(bar.value)} {escape(unit)}{" (outlier)" * bar.outlier}</title></rect>')
    for value, name, colour in ((median, "median", "#333"), (threshold, "outlier below", FAIL_COLOUR)):
        if value is not None:
            x = px(value)
            out.append(f'<line class="marker" data-marker="{name}" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + inner_h}" '
                       f'stroke="{colour}" stroke-dasharray="5 3" stroke-width="1.5"><title>{name} {_number(value)}</title></line>')
    out.append("</svg>")
    return "\n".join(out)
