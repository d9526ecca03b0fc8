"""The connectivity test's part of the report: its headline in the terminal (``text``), and on the HTML page its counts
and every failed path (``html``); with rails, both show a table of the rails, each rail's paths and whom it names."""

from __future__ import annotations

from html import escape
from typing import Any

from preflight.connectivity.contracts import ConnectivitySection, LossPath, MtuPath, RailPaths, TcpPath
from preflight.rendering import STYLE, badge, num, status_line, table

RAIL_COLUMNS = ("rail", "interfaces", "hosts", "TCP failed", "MTU failed", "loss failed", "worst loss %", "rtt ms", "status", "names")


def _rail_cells(rail: RailPaths) -> list[str]:
    """A rail's row, as text: its counts as failed/tested, and whom its failed findings name."""
    return [str(rail["rail"]), ", ".join(rail["interfaces"]), str(len(rail["hosts"])),
            f"{rail['tcp_failed']}/{rail['tcp_tested']}", f"{rail['mtu_failed']}/{rail['mtu_tested']}",
            f"{rail['loss_failed']}/{rail['loss_tested']}",
            "" if rail["loss_max_percent"] is None else f"{rail['loss_max_percent']:.1f}",
            "" if rail["rtt_median_ms"] is None else f"{rail['rtt_median_ms']:.2f}", rail["status"],
            ", ".join("a path, no one host" if name == "*" else name for name in rail["named"])]


def text(connectivity: ConnectivitySection) -> list[Any]:
    if connectivity["status"] == "skipped":
        return []
    parts: list[Any] = [status_line("connectivity", connectivity["status"],
                                    f"{connectivity['message']} ({connectivity['elapsed_s']:.1f} s)")]
    if connectivity.get("rails"):
        from rich.table import Table
        from rich.text import Text

        rails = Table(title="connectivity per rail (rail r of every host to its peers' rail r; failed/tested)", show_edge=False,
                      pad_edge=False)
        for column in RAIL_COLUMNS:
            rails.add_column(column, justify="left" if column in ("interfaces", "status", "names") else "right")
        for rail in connectivity["rails"]:
            cells = _rail_cells(rail)
            rails.add_row(*cells[:8], Text(rail["status"], style=STYLE[rail["status"]]), cells[9])
        parts.append(rails)
    return parts


def html(connectivity: ConnectivitySection) -> str:
    if connectivity["status"] == "skipped":
        return ""
    out = ['<h2 id="connectivity">Connectivity</h2>',
           f"<p>{badge(connectivity['status'])} {escape(connectivity['message'])} ({connectivity['elapsed_s']:.1f} s)</p>"]
    rtt, loss = connectivity["rtt_median_ms"], connectivity["loss_max_percent"]
    out.append(f"<p>{len(connectivity['hosts'])} host(s), {escape(connectivity['mode'])}: {connectivity['tcp_tested']} TCP connects "
               f"({len(connectivity['tcp_failed'])} failed), {connectivity['mtu_tested']} MTU paths "
               f"({len(connectivity['mtu_failed'])} failed), {connectivity['loss_tested']} loss paths "
               f"({len(connectivity['loss_failed'])} above the threshold)"
               + (f", median round trip {rtt:.2f} ms" if rtt is not None else "")
               + (f", worst loss {loss:.1f}%" if loss is not None else "") + ".</p>")
    rails = connectivity.get("rails")
    if rails:
        out.append(table(RAIL_COLUMNS, [[badge(cell) if i == 8 else escape(cell) for i, cell in enumerate(_rail_cells(rail))]
                                        for rail in rails], "rails"))
    # With rails, a failed path's rail is its first column; the rendezvous, on the job's interface, has none.
    rail: tuple[str, ...] = ("rail",) if rails else ()

    def on(path: TcpPath | MtuPath | LossPath) -> list[str]:
        return [str(path["rail"]) if "rail" in path else ""] if rails else []

    if connectivity["tcp_failed"]:
        out.append(table((*rail, "from", "to", "address", "port", "rendezvous", "result", "detail"),
                          [[*on(p), escape(p["source"]), escape(p["destination"]), escape(p["address"]), num(p["port"], "d"),
                            "yes" if p["rendezvous"] else "", escape(p["result"]), escape(p["detail"])]
                           for p in connectivity["tcp_failed"]], "tcp-failed"))
    if connectivity["mtu_failed"]:
        out.append(table((*rail, "from", "to", "MTU", "largest passed"),
                          [[*on(p), escape(p["source"]), escape(p["destination"]), num(p["mtu"], "d"), num(p["largest_passed"], "d")]
                           for p in connectivity["mtu_failed"]], "mtu-failed"))
    if connectivity["loss_failed"]:
        out.append(table((*rail, "from", "to", "sent", "echoed", "loss", "rtt ms"),
                          [[*on(p), escape(p["source"]), escape(p["destination"]), num(p["sent"], "d"), num(p["echoed"], "d"),
                            num(p["loss_percent"], ".1f"), num(p["rtt_ms"], ".2f")] for p in connectivity["loss_failed"]],
                          "loss-failed"))
    return "\n".join(out)
