"""The connectivity test per rail (#38 item 2), its judge on the mesh's outputs alone: each rail is judged on its own
paths (rail r of every host to its peers' rail r), a fault is named as its host and rail, and the section's rails are
rendered. Its namespace tests, on hosts with 2 and 4 rails, are in tests/test_rails.py beside the facts checks'."""

from __future__ import annotations

import copy
from typing import Any

from test_connectivity_judge import HOSTS, healthy

from preflight.connectivity.judge import MeshRun, RailEnd, judge_mesh
from preflight.connectivity.plan import plan_mesh
from preflight.connectivity.render import html, text
from preflight.findings import CLUSTER, Status
from preflight.spec import ConnectivityConfig

PORT = 29500


# ---------------------------------------------------------------------------------------------------------------------
# the judge alone, on the mesh's outputs


def railed(outputs: dict[str, dict[str, Any]], rails: int) -> dict[str, dict[str, Any]]:
    """The one-network outputs copied onto each of rails rails, as mesh.py prints them for hosts with rails."""
    for out in outputs.values():
        out["listening"] = [{**out["listening"][0], "rail": r} for r in range(rails)]
        for key in ("tcp", "loss", "mtu"):
            out[key] = [{**copy.deepcopy(row), "rail": r} for r in range(rails) for row in out[key]]
    return outputs


def judged(outputs: dict[str, dict[str, Any]], rails: int) -> tuple[list[Any], Any]:
    ends = {h: {r: RailEnd(f"rail {r} (eth{r + 1})", f"eth{r + 1}", 1500) for r in range(rails)} for h in HOSTS}
    run = MeshRun(plan=plan_mesh(HOSTS, ConnectivityConfig(), seed=1), master="h1", port=PORT, mtu={h: 1500 for h in HOSTS},
                  outputs=outputs, problems={}, elapsed_s=2.0, rails=ends)  # type: ignore[arg-type]
    return judge_mesh(run, ConnectivityConfig())


def test_each_rail_is_judged_alone_and_a_fault_names_its_host_and_rail() -> None:
    findings, section = judged(railed({h: healthy(h) for h in HOSTS}, 2), 2)
    assert not [f for f in findings if f.status != Status.passed] and section["status"] == "pass"
    assert (section["tcp_tested"], section["mtu_tested"], section["loss_tested"]) == (4 + 2 * 12, 2 * 12, 2 * 12)
    assert "and 24 TCP paths open on 2 rails" in section["message"]
    assert [(r["rail"], r["status"], r["tcp_tested"], r["hosts"]) for r in section["rails"]] == \
        [(0, "pass", 12, HOSTS), (1, "pass", 12, HOSTS)]
    assert {f.message for f in findings if f.code == "PF610"} == \
        {f"rail {r}: all 12 TCP paths between hosts open (every pair)" for r in (0, 1)}
    outputs = railed({h: healthy(h) for h in HOSTS}, 2)
    for source in ("h1", "h2", "h4"):  # h3's rail 1 answers no one; its rail 0 does
        next(r for r in outputs[source]["tcp"] if r["peer"] == "h3" and r["rail"] == 1).update(result="filtered", detail="no answer")
    findings, section = judged(outputs, 2)
    ((code, host, message),) = [(f.code, f.host, f.message) for f in findings if f.status == Status.fail]
    assert (code, host) == ("PF610", "h3") and message.startswith("h3 rail 1 (eth2)'s mesh port 40002 answers no host: filtered")
    assert [(p["rail"], p["source"], p["destination"]) for p in section["tcp_failed"]] == [(1, s, "h3") for s in ("h1", "h2", "h4")]
    assert [(r["status"], r["named"], r["tcp_failed"]) for r in section["rails"]] == [("pass", [], 0), ("fail", ["h3"], 3)]


def test_the_rails_are_rendered_in_the_terminal_and_on_the_page() -> None:
    import io

    from rich.console import Console

    outputs = railed({h: healthy(h) for h in HOSTS}, 2)
    for source in ("h1", "h3", "h4"):  # h2's rail 1 receives 1400 B at most
        row = next(r for r in outputs[source]["mtu"] if r["peer"] == "h2" and r["rail"] == 1)
        row.update(sizes=[*row["sizes"], 1400], passed=[1280, 64, 1400])
    findings, section = judged(outputs, 2)
    ((code, host, message),) = [(f.code, f.host, f.message) for f in findings if f.status == Status.fail]
    assert (code, host) == ("PF611", "h2") and message.startswith("h2 rail 1 (eth2) receives at most 1400 B")
    console = Console(file=io.StringIO(), width=200, record=True)
    for part in text(section):
        console.print(part)
    shown = console.export_text()
    assert "connectivity per rail" in shown and "eth2" in shown and "3/12" in shown and "h2" in shown
    page = html(section)
    assert 'class="rails"' in page and "<td>1</td>" in page and "<td>3/12</td>" in page and "<td>h2</td>" in page


def test_a_cluster_without_rails_has_no_rails_in_its_section() -> None:
    findings, section = judge_mesh(MeshRun(plan=plan_mesh(HOSTS, ConnectivityConfig(), seed=1), master="h1", port=PORT,
                                           mtu={h: 1500 for h in HOSTS}, outputs={h: healthy(h) for h in HOSTS},  # type: ignore[misc]
                                           problems={}, elapsed_s=1.0), ConnectivityConfig())
    assert "rails" not in section and all("rail" not in f.message for f in findings)
    assert all(f.host == CLUSTER for f in findings)
