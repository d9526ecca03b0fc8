"""What every stage's rendering shares: the terminal's styles and figures (rich) and the HTML page's pieces (escaped
strings). A stage renders its own report section (its ``text`` and ``html``, preflight.stages.Stage); the report puts
the verdict, the findings and the hosts' facts around them (preflight.report.render, preflight.report_html)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from html import escape

from preflight.spread import Spread
from preflight.svg_plot import Bar, bar_chart, size_label

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "hang": "bold red", "unknown": "magenta", "incomplete": "magenta"}
SHOWN_ROWS = 16  # beyond this many hosts or pairs, the tables show only the outliers (and the pairs measured again)
BAR_ROWS = 64  # hosts drawn as bars; beyond, only the outliers and the slowest


def figure(value: float | None, scale: float = 1.0) -> str:
    return "" if value is None else f"{value * scale:.3g}"


def ratio(value: float | None, median: float | None) -> str:
    """A figure against its median, as a signed percentage."""
    return "" if value is None or not median else f"{(value - median) / median * 100:+.0f}%"


def versus(value: float | None, spread: Spread) -> str:
    """A figure against its spread's median, as a percentage."""
    return ratio(value, spread["median_GBps"])


def spread_caption(spread: Spread, what: str) -> str:
    if spread["median_GBps"] is None:
        return f"no {what}"
    factor = math.exp(spread["mad_log"] or 0.0)
    caption = f"median over {spread['count']} {what} {spread['median_GBps']:.3g} GB/s, typically within x{factor:.2f} of it"
    threshold = spread["threshold_GBps"]
    return caption + (f"; outlier below {threshold:.3g} GB/s" if threshold is not None else "; too few to name an outlier")


def status_line(title: str, status: str, text: str) -> object:
    """One bold title, its status styled, and a sentence: a stage's headline in the terminal."""
    from rich.text import Text

    return Text.assemble((f"{title} ", "bold"), (status.upper(), STYLE.get(status, "")), f"  {text}")


def prose(text: str) -> str:
    """A message or a fix, escaped, its `quoted commands` as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def badge(status: str) -> str:
    return f'<span class="badge s-{escape(status)}">{escape(status.upper())}</span>'


def table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller); one that is a whole <td> or <th> is kept as it is."""
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(c if c.startswith(("<td", "<th")) else f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>'


def num(value: float | int | None, digits: str = ".3f") -> str:
    return '<td class="num"></td>' if value is None else f'<td class="num">{value:{digits}}</td>'


def binary_size(value: int | str | None) -> str | None:
    """A size as binary units (23.5GiB); a word (unlimited) as it is."""
    if not isinstance(value, int):
        return value
    return size_label(value) + ("iB" if value >= 1024 else " B")


def spread_note(spread: Spread, what: str) -> str:
    if spread["median_GBps"] is None:
        return f"no {what}"
    threshold = spread["threshold_GBps"]
    return (f"median over {spread['count']} {what} {spread['median_GBps']:.3g} GB/s"
            + (f", outlier below {threshold:.3g} GB/s" if threshold is not None else ", too few to name an outlier"))


def host_bars(figures: list[Bar], spread: Spread, title: str) -> str:
    if len(figures) > BAR_ROWS:  # hundreds of rows read as noise: the outliers and the slowest make the point
        figures = sorted(figures, key=lambda b: (not b.outlier, b.value or 0.0))[:BAR_ROWS]
        title += f" (the {BAR_ROWS} slowest shown)"
    return (f"<h3>{escape(title)}</h3>" + bar_chart(figures, unit="GB/s", median=spread["median_GBps"], threshold=spread["threshold_GBps"])
            + f'<p class="note">{escape(spread_note(spread, "hosts"))}; dashed: the median, red: the outlier threshold, '
              "red bars: outliers</p>")
