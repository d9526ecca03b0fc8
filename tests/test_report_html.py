"""The HTML page's parts that one healthy run does not show, rendered from typed reports (no browser): a slow host's
bar and pair, the history comparison below its median, the odd value among hosts' facts (the real H100 recording,
one field changed), and the line that replaces a one-rank sweep. The browser test is tests/test_report_outputs.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from recorded import h100_facts, variant
from test_history import keep_runs, report_of, section

from preflight.collective.baseline import compare_with_history
from preflight.compose import load_spec
from preflight.report_html import report_html
from preflight.svg_plot import nice_ticks, size_label


@pytest.fixture
def config(tmp_path: Path) -> Any:
    return load_spec(["cluster.name=lab", f"state_dir={tmp_path / 'state'}"]).config


def _bars(page: str) -> list[tuple[str, str]]:
    """(class, label) of every bar, in page order."""
    return re.findall(r'<rect class="(bar[^"]*)" data-label="([^"]+)"', page)


def test_slow_host_and_pair_and_the_history_are_marked(config: Any) -> None:
    keep_runs(config, 3)
    current = section(all_reduce=0.5)
    current["per_host"][0]["hosts"][2].update(busbw_GBps=0.1, outlier=True)
    current["pairwise"]["hosts"][2].update(best_GBps=0.02, verdict="slow")  # type: ignore[index]
    _, current["baseline"] = compare_with_history(config, current)
    page = report_html(report_of(current, 30))
    assert _bars(page) == [("bar", "h1"), ("bar", "h2"), ("bar outlier", "h3"),  # the sweep's per-host figures
                           ("bar", "h1"), ("bar", "h2"), ("bar outlier", "h3")]  # each host's best pair
    assert page.count('data-marker="median"') == 2 and page.count('data-marker="outlier below"') == 2
    baseline = page[page.index('id="baseline"'):]
    below = re.findall(r'<td class="num odd">([^<]+)</td>', baseline)
    assert below and all(change.startswith("-") for change in below)
    assert "<h3>Pairwise</h3>" in page


def test_the_odd_value_among_hosts_is_marked_on_its_host_only() -> None:
    recorded = h100_facts()
    other = variant(lambda f: f["torch"].update(version="2.10.0+cu128"))
    hosts = [{"name": f"gpu{k}", "address": f"10.0.0.{k}", "status": "pass", "reason": None, "facts": facts}
             for k, facts in enumerate([recorded, recorded, other, recorded], start=1)]
    report = report_of(section(), 0)
    report["hosts"] = hosts  # type: ignore[typeddict-item]
    page = report_html(report)
    assert re.findall(r'<td class="odd">([^<]*)</td>', page) == ["2.10.0+cu128"]
    head = re.search(r'<table class="facts"><thead><tr>(.*?)</tr>', page)
    assert head and re.findall(r"<th>([^<]*)</th>", head.group(1)) == ["", "gpu3", "gpu1", "gpu2", "gpu4"]  # odd host first
    assert "H100" in page and "2.11" in recorded["torch"]["version"]


def test_one_rank_gets_a_line_not_a_plot_of_zeros() -> None:
    one = section(hosts=["h1"])
    one["world_size"] = 1
    for row in one["sweep"]:
        row.update(busbw_min_GBps=0.0, busbw_mean_GBps=0.0)
    page = report_html(report_of(one, 0))
    assert 'id="no-bandwidth"' in page and 'class="point"' not in page


def test_axis_helpers() -> None:
    assert nice_ticks(0.52) == pytest.approx([0.0, 0.2, 0.4, 0.6])
    assert nice_ticks(7.0) == [0, 2, 4, 6, 8]
    assert [size_label(2 ** k) for k in (10, 16, 20, 26, 30)] == ["1K", "64K", "1M", "64M", "1G"]
