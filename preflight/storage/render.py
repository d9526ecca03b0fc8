"""The storage test's part of the report: a table per path in the terminal (``text``), and on the HTML page each path's
hosts and their write and read bars (``html``)."""

from __future__ import annotations

from html import escape
from typing import Any

from preflight.rendering import SHOWN_ROWS, STYLE, badge, binary_size, host_bars, num, prose, spread_caption, table, versus
from preflight.storage.contracts import StorageSection
from preflight.svg_plot import Bar


def text(storage: StorageSection) -> list[Any]:
    """A table per storage path: each host's filesystem, free space and throughput against the median over hosts."""
    from rich.table import Table
    from rich.text import Text

    from preflight.storage.judge import size

    parts: list[Any] = []
    for path in storage["paths"]:
        # One host's figure is its own median: a caption would only say so.
        caption = (f"write: {spread_caption(path['write_spread'], 'hosts')}; read: {spread_caption(path['read_spread'], 'hosts')}"
                   if max(path["write_spread"]["count"], path["read_spread"]["count"]) > 1 else None)
        table = Table(title=f"storage {path['path']} ({'shared, ' if path['shared'] else ''}{size(path['write_bytes'])} per host)",
                      caption=caption, show_edge=False, pad_edge=False)
        for column in ("host", "filesystem", "free", "write GB/s", "vs median", "read GB/s", "vs median", ""):
            table.add_column(column, justify="left" if column in ("host", "filesystem", "") else "right")
        for host in path["hosts"]:
            if len(path["hosts"]) <= SHOWN_ROWS or host["status"] != "pass":
                rates = [(f"{v:.3f}" if v is not None else "", versus(v, spread))
                         for v, spread in ((host["write_GBps"], path["write_spread"]), (host["read_GBps"], path["read_spread"]))]
                table.add_row(host["host"], f"{host['fstype'] or ''} {host['source'] or ''}".strip(),
                              size(host["free_bytes"]) if host["free_bytes"] is not None else "", *rates[0], *rates[1],
                              Text(host["status"], style=STYLE[host["status"]]) if host["status"] != "pass" else "")
        parts.append(table)
    return parts


def html(storage: StorageSection) -> str:
    out = ['<h2 id="storage">Storage</h2>', f'<p class="note">each host wrote, fsynced and read back its test file at once, '
           f'{storage["elapsed_s"]:.1f} s; the read is O_DIRECT (direct) or after dropping the file from the page cache (fadvise)</p>']
    for path in storage["paths"]:
        groups = " | ".join(", ".join(g) for g in path["groups"])
        out.append(f"<h3>{escape(path['path'])}</h3><p>{badge(path['status'])} {'shared' if path['shared'] else 'each host its own'}, "
                   f"{path['write_bytes']:,} B per host" + (f"; hosts by whose files they read: {escape(groups)}" if path["shared"] else "")
                   + "</p>")
        rows = [[escape(h["host"]), badge(h["status"]), escape(h["user"] or ""), escape(f"{h['fstype'] or ''} {h['source'] or ''}"),
                 escape(binary_size(h["free_bytes"]) or ""), num(h["write_GBps"]), num(h["read_GBps"]), escape(h["read_uncached"] or ""),
                 prose(h["message"] if h["status"] != "pass" else "")] for h in path["hosts"]]
        out.append(table(("host", "status", "user", "filesystem", "free", "write GB/s", "read GB/s", "read", "finding"), rows, "storage"))
        for what, spread in (("write", path["write_spread"]), ("read", path["read_spread"])):
            figures = {h["host"]: h["write_GBps"] if what == "write" else h["read_GBps"] for h in path["hosts"]}
            threshold = spread["threshold_GBps"]
            bars = [Bar(host, value, threshold is not None and value < threshold) for host, value in figures.items() if value is not None]
            if len(bars) > 1:
                out.append(host_bars(bars, spread, f"{path['path']}: {what} per host"))
    return "\n".join(out)
