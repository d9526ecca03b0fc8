"""The report's other forms, from one real check of a 3-host namespace cluster (`check --html --prometheus`): the
HTML page as headless Chromium lays it out, the Prometheus textfile as the official client parses it, `preflight
report`, and the gate's metrics. Browser: tests/browser.py (Debian's chromium over the DevTools protocol)."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import Browser, Page, chromium, open_page, screenshot, seen
from conftest import preflight
from prometheus_client.parser import text_string_to_metric_families
from test_cluster import Cluster
from test_collective import FAST

from preflight.cli import main

pytestmark = pytest.mark.sandbox

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Checked:
    report: dict[str, Any]
    html: Path
    prometheus: Path
    folder: Path


@pytest.fixture(scope="module")
def checked(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Checked:
    """One full check (connectivity, verified all_gather, sweep) of 3 hosts, writing every output at once."""
    folder = tmp_path_factory.mktemp("outputs")
    cluster = Cluster(sandbox_factory(3), folder, "out3")
    html, prom = folder / "page" / "report.html", folder / "metrics" / "preflight.prom"
    # Both ops on gloo (its default sweeps all_reduce alone): the plot and the bars are drawn per op.
    report, _elapsed, _result = cluster.check(*FAST, "--html", str(html), "--prometheus", str(prom),
                                              "collective.sweep_ops=[all_gather,all_reduce]", playbook="full")
    assert report["status"] == "pass", report["findings"][:3]
    return Checked(report, html, prom, folder)


@pytest.fixture(scope="module")
def page(checked: Checked) -> Iterator[tuple[Browser, Page]]:
    if shutil.which("chromium") is None:
        pytest.fail("chromium is not installed (bash tests/setup.sh installs it)")
    with chromium() as endpoint, open_page(endpoint, checked.html) as opened:
        yield opened


def test_the_page_shows_the_verdict_and_exit_code_first(checked: Checked, page: tuple[Browser, Page]) -> None:
    browser, _ = page
    first = browser.evaluate("document.body.firstElementChild.id")
    verdict = browser.evaluate("document.getElementById('verdict').innerText")
    assert first == "verdict" and verdict.startswith("PASS") and "exit code 0" in verdict
    headings = browser.evaluate("[...document.querySelectorAll('h2')].map(h => h.id)")
    assert headings == ["findings", "facts", "connectivity", "collective", "baseline"]
    names = browser.evaluate("[...document.querySelectorAll('table.facts thead th')].map(th => th.innerText)")
    assert names == ["", "h1", "h2", "h3"]


def test_every_sweep_point_is_drawn_inside_the_axes(checked: Checked, page: tuple[Browser, Page]) -> None:
    browser, _ = page
    layout = browser.evaluate("""(() => {
        const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        const plot = document.querySelector('#sweep-plot svg');
        return {area: box(plot.querySelector('rect.plot-area')),
                points: [...plot.querySelectorAll('circle.point')].map(c => ({op: c.dataset.series, x: +c.dataset.x,
                          y: +c.dataset.y, box: box(c)}))};
    })()""")
    sweep = checked.report["collective"]["sweep"]
    drawn = sorted((p["op"], p["x"], round(p["y"], 6)) for p in layout["points"])
    assert drawn == sorted((r["op"], r["bytes"], round(r["busbw_mean_GBps"], 6)) for r in sweep)
    left, top, right, bottom = layout["area"]
    assert right - left > 300 and bottom - top > 150
    for point in layout["points"]:
        x0, y0, x1, y1 = point["box"]
        centre = ((x0 + x1) / 2, (y0 + y1) / 2)
        assert x1 - x0 > 0 and left <= centre[0] <= right and top <= centre[1] <= bottom, point
    # log2 x: the points of one op are spaced evenly, since the sweep's sizes double.
    xs = sorted((p["box"][0] + p["box"][2]) / 2 for p in layout["points"] if p["op"] == "all_gather")
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert max(gaps) - min(gaps) < 1.0, gaps


def test_each_host_has_a_bar_beside_the_median(checked: Checked, page: tuple[Browser, Page]) -> None:
    browser, _ = page
    bars = browser.evaluate("""[...document.querySelectorAll('svg.bars')].map(svg => {
        const area = svg.querySelector('rect.plot-area').getBoundingClientRect();
        return {area: [area.left, area.top, area.right, area.bottom],
                bars: [...svg.querySelectorAll('rect.bar')].map(b => { const r = b.getBoundingClientRect();
                        return {host: b.dataset.label, value: +b.dataset.value, box: [r.left, r.top, r.right, r.bottom]}; }),
                markers: [...svg.querySelectorAll('line.marker')].map(m => m.dataset.marker)};
    })""")
    per_host = checked.report["collective"]["per_host"]
    assert len(bars) == len(per_host) == 2  # all_gather and all_reduce
    for chart, spread in zip(bars, per_host):
        assert [b["host"] for b in chart["bars"]] == [f["host"] for f in spread["hosts"]] == ["h1", "h2", "h3"]
        assert chart["markers"][0] == "median"
        left, top, right, bottom = chart["area"]
        for bar in chart["bars"]:
            x0, y0, x1, y1 = bar["box"]
            assert left <= x0 < x1 <= right + 0.5 and top <= y0 < y1 <= bottom, bar
        # Bar lengths are proportional to the figures.
        widths = {b["host"]: (b["box"][2] - b["box"][0]) / b["value"] for b in chart["bars"]}
        assert max(widths.values()) / min(widths.values()) < 1.05, widths


def test_the_page_is_self_contained_and_clean(checked: Checked, page: tuple[Browser, Page], tmp_path: Path) -> None:
    browser, loaded = page
    shot = screenshot(browser)
    seen(browser, loaded)
    assert loaded.console_errors == []
    assert loaded.requests == [checked.html.resolve().as_uri()], "the page fetched something besides itself"
    assert shot.startswith(PNG_MAGIC) and len(shot) > 20_000
    width, height = int.from_bytes(shot[16:20], "big"), int.from_bytes(shot[20:24], "big")
    assert width == 1200 and height > 1000  # the whole page, beyond the viewport


def test_the_metrics_parse_with_the_official_client(checked: Checked) -> None:
    text = checked.prometheus.read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    report = checked.report
    assert all(f.type == "gauge" and f.name.startswith("preflight_") for f in families.values())
    exit_code = families["preflight_exit_code"].samples
    assert [(s.labels, s.value) for s in exit_code] == [({"command": "check", "cluster": "out3"}, 0)]
    assert families["preflight_run_duration_seconds"].samples[0].value == report["elapsed_s"]
    assert abs(families["preflight_last_run_timestamp_seconds"].samples[0].value - time.time()) < 600
    statuses = {(s.labels["code"], s.labels["host"]): s.value for s in families["preflight_finding_status"].samples}
    worst: dict[tuple[str, str], int] = {}
    for f in report["findings"]:
        key = (f["code"], f["host"])
        worst[key] = max(worst.get(key, 0), {"pass": 0, "warn": 1}[f["status"]])
    assert statuses == worst and ("PF601", "*") in statuses
    samples = families["preflight_collective_busbw_bytes_per_second"].samples
    busbw = {(s.labels["op"], int(s.labels["size_bytes"])): s.value for s in samples}
    assert busbw == pytest.approx({(r["op"], r["bytes"]): r["busbw_mean_GBps"] * 1e9 for r in report["collective"]["sweep"]})
    hosts = {s.labels["host"] for s in families["preflight_host_busbw_bytes_per_second"].samples}
    assert hosts == {"h1", "h2", "h3"}
    assert not list(checked.prometheus.parent.glob(".*")), "a temporary file was left beside the metrics"


def test_report_command_renders_the_saved_report(checked: Checked, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A width of its own: rich wraps the lines at whatever width it finds where the suite runs (80 where none is).
    monkeypatch.setenv("COLUMNS", "200")
    saved = checked.folder / "state" / "report.json"
    out = tmp_path / "again.html"
    assert main(["report", str(saved), "--html", str(out)]) == 0
    assert out.read_text() == checked.html.read_text()
    assert main(["report", str(saved)]) == 0
    table = capsys.readouterr().out
    # The hosts' statuses as the saved report has them: a slow link measured once (PF621) warns on a loaded machine.
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(Counter(h["status"] for h in checked.report["hosts"]).items()))
    assert f"PASS  out3: 3 host(s) ({statuses})" in table and "bandwidth (gloo, 3 ranks" in table
    # No path: the last report check saved in state_dir; none there is bad input.
    assert main(["report", f"state_dir={checked.folder / 'state'}"]) == 0
    assert "PASS  out3: 3 host(s)" in capsys.readouterr().out
    missing = preflight("report", f"state_dir={tmp_path / 'none'}")
    assert missing.returncode == 2 and missing.stderr.startswith("preflight: error: no report at ") and "--report" not in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**checked.report, "status": "maybe"}))
    result = preflight("report", str(broken), "--html", str(tmp_path / "x.html"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and "not a valid report" in result.stderr
    assert not (tmp_path / "x.html").exists()


def test_an_output_that_is_a_folder_is_bad_input_before_anything_runs(checked: Checked, tmp_path: Path) -> None:
    # Before: report --html FOLDER wrote the page beside it and died renaming it over the folder, with a traceback; a
    # check did the same after its whole run.
    folder = tmp_path / "metrics.prom"
    folder.mkdir()
    saved = checked.folder / "state" / "report.json"
    cases = ((["report", str(saved), "--html", str(tmp_path)], "--html"), (["gate", "--prometheus", str(folder)], "--prometheus"))
    for argv, option in cases:
        result = preflight(*argv)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr.splitlines() == [f"preflight: error: {option} {argv[-1]}: is a folder; name the file to write in it"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.prom"] and not list(folder.iterdir())


def test_gate_writes_its_metrics(tmp_path: Path) -> None:
    """This machine's gate, once with /dev/shm's minimum above its size (PF203 fails), once as it is."""
    prom = tmp_path / "gate.prom"
    failed = preflight("gate", "--prometheus", str(prom), f"thresholds.dev_shm_min_bytes={1 << 50}")
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    (sample,) = families["preflight_exit_code"].samples
    assert sample.labels == {"command": "gate", "cluster": "local"} and sample.value == failed.returncode == 1
    statuses = {s.labels["code"]: s.value for s in families["preflight_finding_status"].samples}
    assert statuses["PF203"] == 3 and statuses["PF104"] == 0
    assert families["preflight_hosts"].samples[-1].labels["status"] == "fail" and families["preflight_hosts"].samples[-1].value == 1
    assert "preflight_collective_busbw_bytes_per_second" not in families  # the gate runs no collective
    passed = preflight("gate", "--prometheus", str(prom))
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert passed.returncode == families["preflight_exit_code"].samples[0].value == 0
    wrong = preflight("gate", "--prometheus", str(tmp_path / "gate.txt"))
    assert wrong.returncode == 2 and "must end in .prom" in wrong.stderr
