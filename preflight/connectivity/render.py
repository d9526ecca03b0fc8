"""The connectivity test's part of the report: its headline in the terminal (``text``), and on the HTML page its counts
and every failed path (``html``)."""

from __future__ import annotations

from html import escape
from typing import Any

from preflight.connectivity.contracts import ConnectivitySection
from preflight.rendering import badge, num, status_line, table


def text(connectivity: ConnectivitySection) -> list[Any]:
    if connectivity["status"] == "skipped":
        return []
    return [status_line("connectivity", connectivity["status"], f"{connectivity['message']} ({connectivity['elapsed_s']:.1f} s)")]


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
    if connectivity["tcp_failed"]:
        out.append(table(("from", "to", "address", "port", "rendezvous", "result", "detail"),
                          [[escape(p["source"]), escape(p["destination"]), escape(p["address"]), num(p["port"], "d"),
                            "yes" if p["rendezvous"] else "", escape(p["result"]), escape(p["detail"])]
                           for p in connectivity["tcp_failed"]], "tcp-failed"))
    if connectivity["mtu_failed"]:
        out.append(table(("from", "to", "MTU", "largest passed"),
                          [[escape(p["source"]), escape(p["destination"]), num(p["mtu"], "d"), num(p["largest_passed"], "d")]
                           for p in connectivity["mtu_failed"]], "mtu-failed"))
    if connectivity["loss_failed"]:
        out.append(table(("from", "to", "sent", "echoed", "loss", "rtt ms"),
                          [[escape(p["source"]), escape(p["destination"]), num(p["sent"], "d"), num(p["echoed"], "d"),
                            num(p["loss_percent"], ".1f"), num(p["rtt_ms"], ".2f")] for p in connectivity["loss_failed"]],
                          "loss-failed"))
    return "\n".join(out)
