"""The collective's part of the report, in the terminal (``text``) and on the HTML page (``html``): its headline, the
sweep's bandwidth, each host's speed, the per-host and pairwise figures, NCCL's network and the history's comparison."""

from __future__ import annotations

from collections import Counter
from html import escape
from typing import Any

from preflight.collective.contracts import CollectiveSection, SpeedSection
from preflight.collective.speed_report import NO_LINK_FIGURE, NO_LINK_ON_ONE_HOST
from preflight.rendering import SHOWN_ROWS, STYLE, badge, figure, host_bars, num, ratio, spread_caption, status_line, table, versus
from preflight.svg_plot import Bar, Series, line_plot


def text(collective: CollectiveSection) -> list[Any]:
    """The collective's rich renderables: its outcome in one line (whatever the findings filter hides: it is the headline
    of a full check), the sweep, each host's speed, the localization tables, and NCCL's network."""
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    if collective["status"] != "skipped":
        verified = collective["verify"]
        detail = f" ({verified['bytes_per_rank']:,} B per rank, {verified['wrong']} wrong)" if verified else ""
        parts.append(status_line("collective", collective["status"], f"{collective['message']}{detail}"))
    if collective["sweep"] and (collective["world_size"] or 0) < 2:
        parts.append(Text.assemble(("bandwidth ", "bold"), "not measured: with one rank no byte crosses between processes "
                                   "(busbw is 0 by definition); run two ranks or more, e.g. training.nproc_per_node=2"))
    elif collective["sweep"]:
        sweep = Table(title=f"bandwidth ({collective['backend']}, {collective['world_size']} ranks; GB/s as nccl-tests)",
                      show_edge=False, pad_edge=False)
        for column in ("op", "bytes", "algbw mean", "busbw min", "busbw mean"):
            sweep.add_column(column, justify="right")
        for row in collective["sweep"]:
            sweep.add_row(row["op"], f"{row['bytes']:,}", f"{row['algbw_mean_GBps']:.3f}", f"{row['busbw_min_GBps']:.3f}",
                          f"{row['busbw_mean_GBps']:.3f}")
        parts.append(sweep)
    parts += _speed_parts(collective)
    parts += _localization_parts(collective)
    transport = collective.get("transport")
    if transport:
        parts.append(Text.assemble(("NCCL network ", "bold"), f"{transport['message']} (expected {transport['expected']})"))
        diagnostics = transport.get("diagnostics")  # absent in schema 5 reports written before NCCL 2.31's diagnostics
        if diagnostics:
            results = diagnostics["results"]
            worst = "not run" if not diagnostics["requested"] else "fail" if any(r["failed"] for r in results) else \
                "warn" if not diagnostics["ran"] or any(r["level"] == "INFO" for r in results) else "pass"
            said = "; ".join(diagnostics["summaries"]) or ("ran" if diagnostics["ran"] else "no report came back")
            parts.append(status_line("NCCL diagnostics", worst, f"NCCL {diagnostics['nccl_version']}: {said} (PF844)"))
    return parts


def _speed_parts(collective: CollectiveSection) -> list[Any]:
    """Each host beside the others from the full set's launch: its sending and receiving (its best link before schema 7),
    its compute, its start-up. Absent from reports before schema 6."""
    from rich.table import Table
    from rich.text import Text

    speed = collective.get("speed")
    if not speed:
        return []
    on_gpu = collective["backend"] == "nccl"
    unit, scale = ("TFLOPS", 1.0) if on_gpu else ("GFLOPS", 1000.0)
    links = {h["host"]: h for h in speed["hosts"]}
    compute = {c["host"]: c for c in speed["compute"]}
    link_median, compute_median = speed["host_stats"]["median"], speed["compute_stats"]["median"]
    verdicts = speed_verdicts(speed)
    # A one-host cluster has no link to measure: say so rather than print an empty figure (seen on a lent H200).
    neighbour = (f"neighbour test {speed['bytes']:,} B per message and its repeats" if link_median is not None
                 else NO_LINK_ON_ONE_HOST if len(set(links) | set(compute)) <= 1 else NO_LINK_FIGURE)
    medians = [f"median best link {figure(link_median)} GB/s"] if link_median is not None else []
    if compute_median is not None:
        medians.append(f"median compute {figure(compute_median, scale)} {unit}")
    table = Table(title=f"speed per host ({neighbour}, compute probe, start-up)", caption=", ".join(medians) or None,
                  show_edge=False, pad_edge=False)
    for column in ("host", "sends GB/s", "receives GB/s", "vs median", unit, "vs median", "import s", ""):
        table.add_column(column, justify="left" if column == "host" else "right")
    for start in speed["starts"]:
        host = start["host"]
        link, rate, verdict = links.get(host), compute.get(host), verdicts[host]
        # Schema 6 reports carry each host's best link only.
        sends = link.get("send_GBps", link["best_GBps"]) if link else None
        receives = link.get("recv_GBps", link["best_GBps"]) if link else None
        worse = min((v for v in (sends, receives) if v is not None), default=None)
        if len(speed["starts"]) <= SHOWN_ROWS or verdict:
            table.add_row(host, figure(sends), figure(receives), ratio(worse, link_median),
                          figure(rate["tflops"] if rate else None, scale), ratio(rate["tflops"] if rate else None, compute_median),
                          "" if start["import_s"] is None else f"{start['import_s']:.1f}",
                          Text(", ".join(verdict), style=STYLE["fail"]) if verdict else "")
    return [table, *_rail_parts(speed), Text.assemble(("speed ", "bold"), f"{speed['message']}; {speed['reference_message']}")]


def _rail_parts(speed: SpeedSection) -> list[Any]:
    """On rails, each host's best link on each rail against that rail's median (each rail judged on its own)."""
    from rich.table import Table
    from rich.text import Text

    rails = speed.get("rails")
    if not rails:
        return []
    table = Table(title="speed per rail (rank r of every host on rail r; each rail against its own median)",
                  caption="median: " + ", ".join(f"rail {r['rail']} {figure(r['median_GBps'])} GB/s" for r in rails),
                  show_edge=False, pad_edge=False)
    table.add_column("host")
    for rail in rails:
        table.add_column(f"rail {rail['rail']} GB/s", justify="right")
        table.add_column("vs median", justify="right")
    table.add_column("")
    cells = {(r["rail"], h["host"]): h for r in rails for h in r["hosts"]}
    for host in dict.fromkeys(h["host"] for r in rails for h in r["hosts"]):
        row: list[Any] = [host]
        slow = []
        for rail in rails:
            mine = cells.get((rail["rail"], host))
            row += [f"{figure(mine['best_GBps'])} {mine['interface']}" if mine else "",
                    ratio(mine["best_GBps"], rail["median_GBps"]) if mine else ""]
            if mine and mine["verdict"] != "ok":
                slow.append(f"rail {rail['rail']} ({mine['interface']}) {mine['verdict']}")
        if len(cells) <= SHOWN_ROWS * len(rails) or slow:
            table.add_row(*row, Text(", ".join(slow), style=STYLE["fail"]) if slow else "")
    return [table]


def _rail_html(speed: SpeedSection) -> list[str]:
    """On rails, the page's per-rail table: each host on each rail, its best link, that against the rail's median, and
    its interface and status there (a slow rail's cells marked), as the terminal's speed per rail."""
    rails = speed.get("rails")
    if not rails:
        return []
    cells = {(r["rail"], h["host"]): h for r in rails for h in r["hosts"]}
    head = ["host"] + [f"rail {r['rail']} {what}" for r in rails for what in ("GB/s", "of median", "status")]
    rows = []
    for host in dict.fromkeys(h["host"] for r in rails for h in r["hosts"]):
        row = [escape(host)]
        for rail in rails:
            mine = cells.get((rail["rail"], host))
            if mine is None:
                row += [num(None), num(None), ""]
                continue
            odd = " odd" if mine["verdict"] != "ok" else ""
            # A way the rail's judge warned or failed on, or found starved of CPU, shows even where the host is not named
            # slow (a warning).
            ways = [f"{way} {name}" for way, name in (("sending", mine["sending"]), ("receiving", mine["receiving"]))
                    if name in ("warn", "fail", "starved")]
            status = escape(f"{mine['interface']}: {mine['verdict']}" + (f" ({', '.join(ways)})" if ways else ""))
            share = "" if mine["ratio"] is None else f"{mine['ratio']:.2f}x"
            row += [f'<td class="num{odd}">{figure(mine["best_GBps"])}</td>',
                    f'<td class="num{odd}">{share}</td>', f'<td class="odd">{status}</td>' if odd else status]
        rows.append(row)
    medians = ", ".join(f"rail {r['rail']} {figure(r['median_GBps']) or 'none'} GB/s" for r in rails)
    return [f'<h3 id="rails">Speed per rail</h3><p>Rank r of every host on rail r; each rail judged against its own median '
            f"({escape(medians)}).</p>", table(head, rows, "rails")]


def speed_verdicts(speed: SpeedSection) -> dict[str, list[str]]:
    """Per host, what the speed section names it for: slow network, slow compute, slow start (none: an empty list)."""
    verdicts: dict[str, list[str]] = {start["host"]: [] for start in speed["starts"]}
    for link in speed["hosts"]:
        if link["verdict"] != "ok":
            # Which way is slow, where the section says (schema 7): a host that only sends slowly is named so, and one
            # starved of CPU only while sending likewise.
            names = ("starved",) if link["verdict"] == "cpu contention" else ("warn", "fail")
            ways = [way for way in ("sending", "receiving") if link.get(way) in names]
            named = f"{link['verdict']} ({' and '.join(ways)})" if ways and link["verdict"] in ("slow network", "cpu contention") \
                else link["verdict"]
            verdicts.setdefault(link["host"], []).append(named)
    for host in speed["slow_compute"]:
        if "slow compute" not in verdicts.setdefault(host, []):
            verdicts[host].append("slow compute")
    for start in speed["starts"]:
        if start["straggler"]:
            verdicts[start["host"]].append("slow start")
    return verdicts


def _localization_parts(collective: CollectiveSection) -> list[Any]:
    """Each host's sweep figure and the pairwise stage's pairs and hosts beside their medians, outliers marked; and
    the comparison with the cluster's history. Absent from reports before schema 4."""
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    slow = Text("slow", style=STYLE["fail"])
    spreads = collective.get("per_host") or []
    if spreads and len(spreads[0]["hosts"]) > 1:
        table = Table(title="per host (sweep's largest size, slowest rank; a synchronous collective evens them out)",
                      caption="; ".join(f"{s['op']}: {spread_caption(s['spread'], 'hosts')}" for s in spreads),
                      show_edge=False, pad_edge=False)
        table.add_column("host")
        for spread in spreads:
            table.add_column(f"{spread['op']} {spread['bytes']:,} B", justify="right")
            table.add_column("vs median", justify="right")
        table.add_column("")
        rows: dict[str, list[Any]] = {}
        for k, spread in enumerate(spreads):
            for figure in spread["hosts"]:
                row = rows.setdefault(figure["host"], [figure["host"], *[""] * (2 * len(spreads)), ""])
                row[1 + 2 * k], row[2 + 2 * k] = f"{figure['busbw_GBps']:.3f}", versus(figure["busbw_GBps"], spread["spread"])
                if figure["outlier"]:
                    row[-1] = slow
        for row in rows.values():
            if len(rows) <= SHOWN_ROWS or row[-1]:
                table.add_row(*row)
        parts.append(table)
    pairwise = collective.get("pairwise")
    if pairwise and pairwise["status"] != "skipped":
        table = Table(title=f"pairwise ({pairwise['op']} {pairwise['bytes']:,} B, {pairwise['rounds']} round(s), {pairwise['mode']})",
                      caption=spread_caption(pairwise["pair_spread"], "pairs"), show_edge=False, pad_edge=False)
        for column in ("pair", "round", "GB/s", "vs median", ""):
            table.add_column(column, justify="left" if column == "pair" else "right")
        # Measured again: in the re-pair mode every pair after round 1 (a suspect with a known-good host); in a round-robin
        # a pair measured twice (once more, to tell a slow link from noise).
        times = Counter(frozenset(pair["hosts"]) for pair in pairwise["pairs"])
        for pair in pairwise["pairs"]:
            again = pair["round"] > 1 if pairwise["mode"] == "re-pair" else times[frozenset(pair["hosts"])] > 1
            if len(pairwise["pairs"]) <= SHOWN_ROWS or pair["outlier"] or again:
                rate = f"{pair['busbw_GBps']:.3f}" if pair["status"] == "pass" else pair["status"]
                table.add_row("-".join(pair["hosts"]), str(pair["round"]), rate, versus(pair["busbw_GBps"], pairwise["pair_spread"]),
                              slow if pair["outlier"] else "")
        parts.append(table)
        hosts = Table(title="pairwise per host (its best pair)", caption=spread_caption(pairwise["host_spread"], "hosts"),
                      show_edge=False, pad_edge=False)
        for column in ("host", "pairs", "best GB/s", "vs median", ""):
            hosts.add_column(column, justify="left" if column == "host" else "right")
        for entry in pairwise["hosts"]:
            if len(pairwise["hosts"]) <= SHOWN_ROWS or entry["verdict"] != "ok":
                best = "" if entry["best_GBps"] is None else f"{entry['best_GBps']:.3f}"
                hosts.add_row(entry["host"], str(entry["pairs"]), best, versus(entry["best_GBps"], pairwise["host_spread"]),
                              slow if entry["verdict"] == "slow" else entry["verdict"] if entry["verdict"] != "ok" else "")
        parts.append(hosts)
        parts.append(Text.assemble(("pairwise ", "bold"), (pairwise["status"].upper(), STYLE.get(pairwise["status"], "")),
                                   f"  {pairwise['message']} ({pairwise['elapsed_s']:.1f} s)"))
    baseline = collective.get("baseline")
    if baseline:
        below = any(f["below"] for f in baseline["figures"])
        parts.append(Text.assemble(("baseline ", "bold"), ("BELOW" if below else "OK", STYLE["warn" if below else "pass"]),
                                   f"  {baseline['message']}"))
    return parts


def html(collective: CollectiveSection) -> str:
    """The collective's part of the page: its outcome, the sweep plotted, each host's bars, the pairwise stage, the
    speed tables (per host and, on rails, per rail) and the history's comparison (a skipped collective: none)."""
    if collective["status"] == "skipped":
        return ""
    out = ['<h2 id="collective">Collective</h2>',
           f"<p>{badge(collective['status'])} {escape(collective['backend'])}, {collective['world_size'] or 0} rank(s): "
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
        out.append("<details><summary>the sweep's figures</summary>" + table(
            ("op", "bytes", "algbw mean", "busbw min", "busbw mean"),
            [[escape(r["op"]), num(r["bytes"], ","), num(r["algbw_mean_GBps"]), num(r["busbw_min_GBps"]), num(r["busbw_mean_GBps"])]
             for r in sweep], "sweep") + "</details>")
    for spread in collective.get("per_host") or []:
        if len(spread["hosts"]) > 1:
            bars = [Bar(f["host"], f["busbw_GBps"], f["outlier"]) for f in spread["hosts"]]
            out.append(host_bars(bars, spread["spread"], f"Per host: {spread['op']} at {spread['bytes']:,} B (slowest rank)"))
    pairwise = collective.get("pairwise")
    if pairwise and pairwise["status"] != "skipped":
        out.append(f"<h3>Pairwise</h3><p>{badge(pairwise['status'])} {escape(pairwise['message'])} ({pairwise['rounds']} round(s), "
                   f"{escape(pairwise['mode'])}, {pairwise['op']} {pairwise['bytes']:,} B, {pairwise['elapsed_s']:.1f} s)</p>")
        bars = [Bar(h["host"], h["best_GBps"], h["verdict"] == "slow") for h in pairwise["hosts"]]
        out.append(host_bars(bars, pairwise["host_spread"], "Each host's best pair"))
        out.append("<details><summary>every pair</summary>" + table(
            ("pair", "round", "status", "GB/s", "outlier"),
            [[escape("-".join(p["hosts"])), num(p["round"], "d"), badge(p["status"]), num(p["busbw_GBps"]),
              "slow" if p["outlier"] else ""] for p in pairwise["pairs"]], "pairs") + "</details>")
    speed = collective.get("speed")
    if speed:
        links, compute = {h["host"]: h for h in speed["hosts"]}, {c["host"]: c for c in speed["compute"]}
        verdicts = speed_verdicts(speed)
        out.append(f'<h3 id="speed">Speed per host</h3><p>{escape(speed["message"])}; {escape(speed["reference_message"])}</p>')
        # Schema 6 reports carry each host's best link only.
        out.append(table(
            ("host", "sends GB/s", "receives GB/s", "compute TFLOPS", "torch import s", "verdict"),
            [[escape(h), num(links[h].get("send_GBps", links[h]["best_GBps"]) if h in links else None),
              num(links[h].get("recv_GBps", links[h]["best_GBps"]) if h in links else None),
              num(compute[h]["tflops"] if h in compute else None, ".4g"), num(start["import_s"], ".1f"), escape(", ".join(verdicts[h]))]
             for start in speed["starts"] for h in [start["host"]]], "speed"))
        out += _rail_html(speed)
    baseline = collective.get("baseline")
    if baseline:
        out.append(f'<h2 id="baseline">Against the cluster\'s history</h2><p>{escape(baseline["message"])}</p>')
        if baseline["figures"]:
            out.append(table(
                ("source", "op", "bytes", "host", "GB/s", "median", "runs", "change"),
                [[escape(f["source"]), escape(f["op"]), num(f["bytes"], ","), escape(f["host"]), num(f["GBps"]),
                  num(f["median_GBps"]), num(f["runs"], "d"),
                  f'<td class="num{" odd" if f["below"] else ""}">{f["change_percent"]:+.1f}%</td>'] for f in baseline["figures"]],
                "baseline"))
    return "\n".join(out)
