"""The report as one self-contained HTML page (`preflight report --html`, `check --html`): inline CSS and SVG, no
script and nothing fetched, so it can be mailed, attached to a ticket or opened offline.

Top to bottom: the verdict and exit code; the findings, root cause first, with their fixes; the hosts' facts side by
side with the odd values marked; the collective with busbw against message size per op; each host's bandwidth
against the median, outliers marked; the pairwise stage; the connectivity test; the comparison with the history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from html import escape

from preflight.contracts import HostEntry
from preflight.facts import HostFacts
from preflight.findings import CLUSTER
from preflight.rendering import badge, binary_size, prose, table
from preflight.report import stage_sections
from preflight.report_shape import Report

FACT_COLUMNS = 24  # hosts shown side by side; beyond, the hosts with an odd value first, then a count of the rest

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


def _header(report: Report) -> str:
    hosts = Counter(h["status"] for h in report["hosts"])
    per_status = ", ".join(f"{n} {s}" for s, n in sorted(hosts.items()))
    return (f'<div class="verdict" id="verdict">{badge(report["status"])}<span>exit code <b id="exit-code">{report["exit_code"]}</b>'
            f'</span><h1>{escape(report["cluster"])}</h1></div>'
            f'<div class="meta">{len(report["hosts"])} host(s) ({escape(per_status)}), playbook {escape(report["playbook"])}, '
            f'{report["elapsed_s"]:.1f} s, {escape(report["created_at"])}, preflight {escape(report["preflight_version"])}, '
            f'config <code>{escape(report["spec_digest"][:12])}</code></div>')


def _findings(report: Report) -> str:
    rows: list[list[str]] = []
    passed: list[list[str]] = []
    for finding in report["findings"]:  # root cause first, as the report keeps them
        where = "(cluster)" if finding["host"] == CLUSTER else finding["host"]
        fix = prose(finding["remedy"])
        workaround = finding.get("workaround") or {}
        if workaround:
            fix += '<br><span class="note">workaround: ' + escape(" ".join(f"{k}={v}" for k, v in workaround.items())) + "</span>"
        row = [badge(finding["status"]), escape(where), f"<code>{escape(finding['code'])}</code>", prose(finding["message"]),
               f'<td class="fix">{fix}</td>']
        (passed if finding["status"] == "pass" else rows).append(row)
    head = ("status", "host", "code", "finding", "fix")
    out = ['<h2 id="findings">Findings</h2>']
    out.append(table(head, rows, "findings") if rows else '<p class="note">Every check passed.</p>')
    if passed:
        out.append(f"<details><summary>{len(passed)} passed check(s)</summary>{table(head, passed, 'passed')}</details>")
    return "\n".join(out)


def _interfaces(facts: HostFacts) -> str:
    return ", ".join(f"{i['name']} mtu {i['mtu']}" for i in facts["net"]["interfaces"] if not i["loopback"] and i["operstate"] != "down")


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
    ("/dev/shm", lambda f: binary_size(f["resources"]["dev_shm_bytes"]), True),
    ("memlock", lambda f: binary_size(f["resources"]["memlock"]), True),
    ("interfaces", _interfaces, True),
    ("InfiniBand ACTIVE", lambda f: sum(1 for p in f["net"]["infiniband"] if p["state"] == "ACTIVE"), True),
    ("NCCL/gloo env", lambda f: " ".join(f"{k}={v}" for k, v in sorted(f["nccl"]["env"].items())) or "none", True),
]


def _facts(hosts: Sequence[HostEntry]) -> str:
    with_facts = [h for h in hosts if h["facts"] is not None]
    missing = [h for h in hosts if h["facts"] is None]
    out = ['<h2 id="facts">Hosts side by side</h2>']
    if missing:
        out.append(table(("host", "status", "why it has no facts"),
                          [[escape(h["name"]), badge(h["status"]), escape(h["reason"] or "")] for h in missing], "unreached"))
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
    out.append(table(["", *(with_facts[i]["name"] for i in shown)], rows, "facts"))
    if len(with_facts) > len(shown):
        out.append(f'<p class="note">{len(with_facts) - len(shown)} more host(s), every value as most hosts have it, not shown.</p>')
    out.append('<p class="note">Marked: a value that fewer hosts have than the commonest one.</p>')
    return "\n".join(out)


def report_html(report: Report) -> str:
    """The whole page."""
    parts = [_header(report), _findings(report), _facts(report["hosts"])]
    parts += [stage.html(section) for stage, section in stage_sections(report)]
    title = f"preflight {report['status'].upper()}: {report['cluster']} {report['created_at']}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
