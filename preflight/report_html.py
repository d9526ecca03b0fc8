"""The report as one self-contained HTML page (`preflight report --html`, `check --html`): inline CSS and SVG, no
script and nothing fetched, so it can be mailed, attached to a ticket or opened offline.

Top to bottom: the verdict and exit code; the findings, root cause first, with their fixes; the hosts' facts side by
side with the odd values marked; the collective with busbw against message size per op; each host's bandwidth
against the median, outliers marked; the pairwise stage; the connectivity test; the comparison with the history.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from html import escape

from preflight.contracts import CollectiveSection, ConnectivitySection, HostEntry, Report, Spread
from preflight.facts import HostFacts
from preflight.findings import CLUSTER
from preflight.report import speed_verdicts
from preflight.storage.contracts import StorageSection
from preflight.svg_plot import Bar, Series, bar_chart, line_plot, size_label

FACT_COLUMNS = 24  # hosts shown side by side; beyond, the hosts with an odd value first, then a count of the rest
BAR_ROWS = 64  # hosts drawn as bars; beyond, only the outliers and the slowest

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{display:flex;align-items:center;gap:16px;margin-bottom:6px}
.badge{font-weight:700;padding:2px 10px;border-radius:4px;color:#fff;display:inline-block}
.verdict .badge{font-size:24px;padding:6px 18px}
.s-pass,.s-ok{background:#2e7d32}.s-warn{background:#ef8f00}.s-fail,.s-hang,.s-slow{background:#c62828}
.s-unknown,.s-incomplete{background:#7b1fa2}.s-skipped,.s-untested{background:#888}
.meta{color:#555}table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.odd{background:#fff3cd;font-weight:600}
.fix{color:#444}.note{color:#666;font-style:italic}code{background:#f3f3f3;padding:0 3px}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .axis-label{font-size:12px}
"""


def _prose(text: str) -> str:
    """A message or a fix, escaped, its `quoted commands` as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _status(status: str) -> str:
    return f'<span class="badge s-{escape(status)}">{escape(status.upper())}</span>'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller); one that is a whole <td> or <th> is kept as it is."""
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(c if c.startswith(("<td", "<th")) else f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>'


def _num(value: float | int | None, digits: str = ".3f") -> str:
    return '<td class="num"></td>' if value is None else f'<td class="num">{value:{digits}}</td>'


def _header(report: Report) -> str:
    hosts = Counter(h["status"] for h in report["hosts"])
    per_status = ", ".join(f"{n} {s}" for s, n in sorted(hosts.items()))
    return (f'<div class="verdict" id="verdict">{_status(report["status"])}<span>exit code <b id="exit-code">{report["exit_code"]}</b>'
            f'</span><h1>{escape(report["cluster"])}</h1></div>'
            f'<div class="meta">{len(report["hosts"])} host(s) ({escape(per_status)}), playbook {escape(report["playbook"])}, '
            f'{report["elapsed_s"]:.1f} s, {escape(report["created_at"])}, preflight {escape(report["preflight_version"])}, '
            f'config <code>{escape(report["spec_digest"][:12])}</code></div>')


def _findings(report: Report) -> str:
    rows: list[list[str]] = []
    passed: list[list[str]] = []
    for finding in report["findings"]:  # root cause first, as the report keeps them
        where = "(cluster)" if finding["host"] == CLUSTER else finding["host"]
        fix = _prose(finding["remedy"])
        workaround = finding.get("workaround") or {}
        if workaround:
            fix += '<br><span class="note">workaround: ' + escape(" ".join(f"{k}={v}" for k, v in workaround.items())) + "</span>"
        row = [_status(finding["status"]), escape(where), f"<code>{escape(finding['code'])}</code>", _prose(finding["message"]),
               f'<td class="fix">{fix}</td>']
        (passed if finding["status"] == "pass" else rows).append(row)
    head = ("status", "host", "code", "finding", "fix")
    out = ['<h2 id="findings">Findings</h2>']
    out.append(_table(head, rows, "findings") if rows else '<p class="note">Every check passed.</p>')
    if passed:
        out.append(f"<details><summary>{len(passed)} passed check(s)</summary>{_table(head, passed, 'passed')}</details>")
    return "\n".join(out)


def _interfaces(facts: HostFacts) -> str:
    return ", ".join(f"{i['name']} mtu {i['mtu']}" for i in facts["net"]["interfaces"] if not i["loopback"] and i["operstate"] != "down")


def _bytes(value: int | str | None) -> str | None:
    """A size as binary units (23.5GiB); a word (unlimited) as it is."""
    if not isinstance(value, int):
        return value
    return size_label(value) + ("iB" if value >= 1024 else " B")


# (label, reading, compared): a value that differs from most hosts' is marked, where a difference means something.
FACT_ROWS: list[tuple[str, Callable[[HostFacts], object], bool]] = [
    ("address", lambda f: "", False),  # filled from the host entry
    ("hostname", lambda f: f["host"]["hostname"], False),
    ("os", lambda f: f["host"]["os"], True),
    ("kernel", lambda f: f["host"]["kernel"], True),
    ("python", lambda f: f["host"]["python"], True),
    ("torch", lambda f: f["torch"]["version"] if f["torch"]["installed"] else "not installed", True),
    ("torch's CUDA", lambda f: f["torch"]["cuda"], True),
    ("torch's NCCL", lambda f: f["torch"]["nccl_version"], True),
    ("NVIDIA driver", lambda f: f["gpu"]["driver_version"], True),
    ("CUDA (driver)", lambda f: f["gpu"]["cuda_driver_version"], True),
    ("GPUs", lambda f: ", ".join(sorted(Counter(d["name"] for d in f["gpu"]["devices"]).elements())) or "none", True),
    ("/dev/shm", lambda f: _bytes(f["resources"]["dev_shm_bytes"]), True),
    ("memlock", lambda f: _bytes(f["resources"]["memlock"]), True),
    ("interfaces", _interfaces, True),
    ("InfiniBand ACTIVE", lambda f: sum(1 for p in f["net"]["infiniband"] if p["state"] == "ACTIVE"), True),
    ("NCCL/gloo env", lambda f: " ".join(f"{k}={v}" for k, v in sorted(f["nccl"]["env"].items())) or "none", True),
]


def _facts(hosts: Sequence[HostEntry]) -> str:
    with_facts = [h for h in hosts if h["facts"] is not None]
    missing = [h for h in hosts if h["facts"] is None]
    out = ['<h2 id="facts">Hosts side by side</h2>']
    if missing:
        out.append(_table(("host", "status", "why it has no facts"),
                          [[escape(h["name"]), _status(h["status"]), escape(h["reason"] or "")] for h in missing], "unreached"))
    if not with_facts:
        return "\n".join(out)
    values: dict[str, list[str]] = {}
    odd: dict[str, list[bool]] = {}
    for label, read, compared in FACT_ROWS:
        cells = [h["address"] if label == "address" else ("" if (v := read(h["facts"])) is None else str(v))  # type: ignore[arg-type]
                 for h in with_facts]
        counts = Counter(cells)
        most = max(counts.values())
        # Odd: a value fewer hosts share than the commonest; when every value is as common, each is odd.
        tie = len(counts) > 1 and list(counts.values()).count(most) == len(counts)
        values[label] = cells
        odd[label] = [compared and len(counts) > 1 and (counts[c] < most or tie) for c in cells]
    for label in [label for label, cells in values.items() if not any(cells)]:  # nothing to show (GPU rows on CPU hosts)
        del values[label], odd[label]
    order = sorted(range(len(with_facts)), key=lambda i: not any(odd[label][i] for label in odd))
    shown = order[:FACT_COLUMNS]
    rows = []
    for label in values:
        rows.append([f"<th>{escape(label)}</th>", *(f'<td class="odd">{escape(values[label][i])}</td>' if odd[label][i]
                                                    else escape(values[label][i]) for i in shown)])
    out.append(_table(["", *(with_facts[i]["name"] for i in shown)], rows, "facts"))
    if len(with_facts) > len(shown):
        out.append(f'<p class="note">{len(with_facts) - len(shown)} more host(s), every value as most hosts have it, not shown.</p>')
    out.append('<p class="note">Marked: a value that fewer hosts have than the commonest one.</p>')
    return "\n".join(out)


def _spread_note(spread: Spread, what: str) -> str:
    if spread["median_GBps"] is None:
        return f"no {what}"
    threshold = spread["threshold_GBps"]
    return (f"median over {spread['count']} {what} {spread['median_GBps']:.3g} GB/s"
            + (f", outlier below {threshold:.3g} GB/s" if threshold is not None else ", too few to name an outlier"))


def _host_bars(figures: list[Bar], spread: Spread, title: str) -> str:
    if len(figures) > BAR_ROWS:  # hundreds of rows read as noise: the outliers and the slowest make the point
        figures = sorted(figures, key=lambda b: (not b.outlier, b.value or 0.0))[:BAR_ROWS]
        title += f" (the {BAR_ROWS} slowest shown)"
    return (f"<h3>{escape(title)}</h3>" + bar_chart(figures, unit="GB/s", median=spread["median_GBps"], threshold=spread["threshold_GBps"])
            + f'<p class="note">{escape(_spread_note(spread, "hosts"))}; dashed: the median, red: the outlier threshold, '
              "red bars: outliers</p>")


def _collective(collective: CollectiveSection) -> str:
    out = ['<h2 id="collective">Collective</h2>',
           f"<p>{_status(collective['status'])} {escape(collective['backend'])}, {collective['world_size'] or 0} rank(s): "
           f"{escape(collective['message'])}</p>"]
    verify = collective["verify"]
    if verify:
        out.append(f"<p>all_gather verified: {verify['bytes_per_rank']:,} B per rank over {verify['ranks']} ranks, "
                   f"{verify['wrong']} element(s) wrong.</p>")
    isolation = collective["isolation"]
    if isolation:
        out.append(f"<p>Isolation: culprits <b>{escape(', '.join(isolation['culprits']) or 'none')}</b>, healthy "
                   f"{escape(', '.join(isolation['healthy']) or 'none')} {escape(isolation['note'])}</p>")
    sweep = collective["sweep"]
    if sweep and (collective["world_size"] or 0) < 2:
        out.append('<p class="note" id="no-bandwidth">Bandwidth not measured: with one rank no byte crosses between processes '
                   "(busbw is 0 by definition). Run two ranks or more, e.g. <code>training.nproc_per_node=2</code>.</p>")
    elif sweep:
        ops = list(dict.fromkeys(row["op"] for row in sweep))
        series = [Series(op, [(row["bytes"], row["busbw_mean_GBps"]) for row in sweep if row["op"] == op]) for op in ops]
        out.append('<h3>Bus bandwidth against message size</h3><div id="sweep-plot">'
                   + line_plot(series, x_label="message size (bytes, log scale)", y_label="busbw GB/s (mean over ranks)") + "</div>")
        out.append("<details><summary>the sweep's figures</summary>" + _table(
            ("op", "bytes", "algbw mean", "busbw min", "busbw mean"),
            [[escape(r["op"]), _num(r["bytes"], ","), _num(r["algbw_mean_GBps"]), _num(r["busbw_min_GBps"]), _num(r["busbw_mean_GBps"])]
             for r in sweep], "sweep") + "</details>")
    for spread in collective.get("per_host") or []:
        if len(spread["hosts"]) > 1:
            bars = [Bar(f["host"], f["busbw_GBps"], f["outlier"]) for f in spread["hosts"]]
            out.append(_host_bars(bars, spread["spread"], f"Per host: {spread['op']} at {spread['bytes']:,} B (slowest rank)"))
    pairwise = collective.get("pairwise")
    if pairwise and pairwise["status"] != "skipped":
        out.append(f"<h3>Pairwise</h3><p>{_status(pairwise['status'])} {escape(pairwise['message'])} ({pairwise['rounds']} round(s), "
                   f"{escape(pairwise['mode'])}, {pairwise['op']} {pairwise['bytes']:,} B, {pairwise['elapsed_s']:.1f} s)</p>")
        bars = [Bar(h["host"], h["best_GBps"], h["verdict"] == "slow") for h in pairwise["hosts"]]
        out.append(_host_bars(bars, pairwise["host_spread"], "Each host's best pair"))
        out.append("<details><summary>every pair</summary>" + _table(
            ("pair", "round", "status", "GB/s", "outlier"),
            [[escape("-".join(p["hosts"])), _num(p["round"], "d"), _status(p["status"]), _num(p["busbw_GBps"]),
              "slow" if p["outlier"] else ""] for p in pairwise["pairs"]], "pairs") + "</details>")
    speed = collective.get("speed")
    if speed:
        links, compute = {h["host"]: h for h in speed["hosts"]}, {c["host"]: c for c in speed["compute"]}
        verdicts = speed_verdicts(speed)
        out.append(f'<h3 id="speed">Speed per host</h3><p>{escape(speed["message"])}; {escape(speed["reference_message"])}</p>')
        # Schema 6 reports carry each host's best link only.
        out.append(_table(
            ("host", "sends GB/s", "receives GB/s", "compute TFLOPS", "torch import s", "verdict"),
            [[escape(h), _num(links[h].get("send_GBps", links[h]["best_GBps"]) if h in links else None),
              _num(links[h].get("recv_GBps", links[h]["best_GBps"]) if h in links else None),
              _num(compute[h]["tflops"] if h in compute else None, ".4g"), _num(start["import_s"], ".1f"), escape(", ".join(verdicts[h]))]
             for start in speed["starts"] for h in [start["host"]]], "speed"))
    baseline = collective.get("baseline")
    if baseline:
        out.append(f'<h2 id="baseline">Against the cluster\'s history</h2><p>{escape(baseline["message"])}</p>')
        if baseline["figures"]:
            out.append(_table(
                ("source", "op", "bytes", "host", "GB/s", "median", "runs", "change"),
                [[escape(f["source"]), escape(f["op"]), _num(f["bytes"], ","), escape(f["host"]), _num(f["GBps"]),
                  _num(f["median_GBps"]), _num(f["runs"], "d"),
                  f'<td class="num{" odd" if f["below"] else ""}">{f["change_percent"]:+.1f}%</td>'] for f in baseline["figures"]],
                "baseline"))
    return "\n".join(out)


def _connectivity(connectivity: ConnectivitySection) -> str:
    out = ['<h2 id="connectivity">Connectivity</h2>',
           f"<p>{_status(connectivity['status'])} {escape(connectivity['message'])} ({connectivity['elapsed_s']:.1f} s)</p>"]
    rtt, loss = connectivity["rtt_median_ms"], connectivity["loss_max_percent"]
    out.append(f"<p>{len(connectivity['hosts'])} host(s), {escape(connectivity['mode'])}: {connectivity['tcp_tested']} TCP connects "
               f"({len(connectivity['tcp_failed'])} failed), {connectivity['mtu_tested']} MTU paths "
               f"({len(connectivity['mtu_failed'])} failed), {connectivity['loss_tested']} loss paths "
               f"({len(connectivity['loss_failed'])} above the threshold)"
               + (f", median round trip {rtt:.2f} ms" if rtt is not None else "")
               + (f", worst loss {loss:.1f}%" if loss is not None else "") + ".</p>")
    if connectivity["tcp_failed"]:
        out.append(_table(("from", "to", "address", "port", "rendezvous", "result", "detail"),
                          [[escape(p["source"]), escape(p["destination"]), escape(p["address"]), _num(p["port"], "d"),
                            "yes" if p["rendezvous"] else "", escape(p["result"]), escape(p["detail"])]
                           for p in connectivity["tcp_failed"]], "tcp-failed"))
    if connectivity["mtu_failed"]:
        out.append(_table(("from", "to", "MTU", "largest passed"),
                          [[escape(p["source"]), escape(p["destination"]), _num(p["mtu"], "d"), _num(p["largest_passed"], "d")]
                           for p in connectivity["mtu_failed"]], "mtu-failed"))
    if connectivity["loss_failed"]:
        out.append(_table(("from", "to", "sent", "echoed", "loss", "rtt ms"),
                          [[escape(p["source"]), escape(p["destination"]), _num(p["sent"], "d"), _num(p["echoed"], "d"),
                            _num(p["loss_percent"], ".1f"), _num(p["rtt_ms"], ".2f")] for p in connectivity["loss_failed"]],
                          "loss-failed"))
    return "\n".join(out)


def _storage(storage: StorageSection) -> str:
    out = ['<h2 id="storage">Storage</h2>', f'<p class="note">each host wrote, fsynced and read back its test file at once, '
           f'{storage["elapsed_s"]:.1f} s; the read is O_DIRECT (direct) or after dropping the file from the page cache (fadvise)</p>']
    for path in storage["paths"]:
        groups = " | ".join(", ".join(g) for g in path["groups"])
        out.append(f"<h3>{escape(path['path'])}</h3><p>{_status(path['status'])} {'shared' if path['shared'] else 'each host its own'}, "
                   f"{path['write_bytes']:,} B per host" + (f"; hosts by whose files they read: {escape(groups)}" if path["shared"] else "")
                   + "</p>")
        rows = [[escape(h["host"]), _status(h["status"]), escape(h["user"] or ""), escape(f"{h['fstype'] or ''} {h['source'] or ''}"),
                 escape(_bytes(h["free_bytes"]) or ""), _num(h["write_GBps"]), _num(h["read_GBps"]), escape(h["read_uncached"] or ""),
                 _prose(h["message"] if h["status"] != "pass" else "")] for h in path["hosts"]]
        out.append(_table(("host", "status", "user", "filesystem", "free", "write GB/s", "read GB/s", "read", "finding"), rows, "storage"))
        for what, spread in (("write", path["write_spread"]), ("read", path["read_spread"])):
            figures = {h["host"]: h["write_GBps"] if what == "write" else h["read_GBps"] for h in path["hosts"]}
            threshold = spread["threshold_GBps"]
            bars = [Bar(host, value, threshold is not None and value < threshold) for host, value in figures.items() if value is not None]
            if len(bars) > 1:
                out.append(_host_bars(bars, spread, f"{path['path']}: {what} per host"))
    return "\n".join(out)


def report_html(report: Report) -> str:
    """The whole page."""
    parts = [_header(report), _findings(report), _facts(report["hosts"])]
    connectivity = report.get("connectivity")  # absent from schema 2 reports
    if connectivity and connectivity["status"] != "skipped":
        parts.append(_connectivity(connectivity))
    collective = report["collective"]
    if collective and collective["status"] != "skipped":
        parts.append(_collective(collective))
    storage = report.get("storage")  # absent before schema 6
    if storage:
        parts.append(_storage(storage))
    title = f"preflight {report['status'].upper()}: {report['cluster']} {report['created_at']}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
