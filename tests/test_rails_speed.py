"""The bandwidth test rail by rail (#38, item 3) on a namespace cluster whose hosts have two rails, each rail a bridge
and a /24 of its own: local rank r of every host is bound to rail r (preflight/rail_env.py), the neighbour test's links
of rail r are judged against rail r's median, and a slow rail is named as (host, rail, interface)."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_cluster import Cluster
from test_emit_launch import DDP_SCRIPT, assert_trained_together, emit, run_on_hosts, torchrun_of
from test_rails import config as rails_config
from test_rails import recorded_ports, with_rails
from test_speed import FAST
from test_speed_band import FAST as BAND
from test_speed_band import LINK_MBIT
from test_speed_judge import HOSTS4, STARVED_WAITS, Noise, _cycled, _Record, launch

from preflight import rail_env
from preflight.collective.host.plans import rails_plan, repeat_plan
from preflight.collective.speed_rails import judge_rails, rails_section
from preflight.collective.speed_report import findings
from preflight.collective.wire import ResultEvent
from preflight.findings import Status
from preflight.launch import derive_launch
from preflight.records import HostRecord, Rail
from preflight.spec import Backend, PreflightConfig

# ---------------------------------------------------------------------------------------------------------------------
# each rank bound to its rail


@pytest.mark.parametrize(("local_rank", "size", "expected"), [
    (0, 2, {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_HCA": "=mlx5_0:1"}),
    (1, 2, {"GLOO_SOCKET_IFNAME": "eth2", "NCCL_IB_HCA": "=mlx5_1:1"}),
    (3, 4, {"GLOO_SOCKET_IFNAME": "eth2", "NCCL_IB_HCA": "=mlx5_1:1"}),  # 4 GPUs on 2 rails: ranks 2 and 3 on rail 1
])
def test_a_rank_takes_its_rails_entry_of_every_list(local_rank: int, size: int, expected: dict[str, str]) -> None:
    environ = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(size), "PREFLIGHT_RAIL_GLOO_SOCKET_IFNAME": "eth1,eth2",
               "PREFLIGHT_RAIL_NCCL_IB_HCA": "=mlx5_0:1,=mlx5_1:1", "GLOO_SOCKET_IFNAME": "eth0"}
    assert rail_env.rank_env(environ) == expected


@pytest.mark.parametrize(("environ", "why"), [
    ({}, "LOCAL_RANK and LOCAL_WORLD_SIZE must be whole numbers"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK 2 is not a rank of LOCAL_WORLD_SIZE 2"),
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "PREFLIGHT_RAIL_GLOO_SOCKET_IFNAME": "eth1,"}, "has an empty entry"),
])
def test_a_rank_without_a_usable_rail_is_refused(environ: dict[str, str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        rail_env.rank_env(environ)


def test_the_wrapper_execs_the_script_with_the_rank_s_rail(tmp_path: Any) -> None:
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(os.environ['GLOO_SOCKET_IFNAME'], sys.argv[1:])\n")
    env = {"PATH": "/usr/bin:/bin", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "PREFLIGHT_RAIL_GLOO_SOCKET_IFNAME": "eth1,eth2"}
    done = subprocess.run([sys.executable, rail_env.__file__, str(script), "--epochs", "1"], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (0, "eth2 ['--epochs', '1']\n"), done.stderr
    done = subprocess.run([sys.executable, rail_env.__file__], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and done.stderr.startswith("usage: rail_env.py SCRIPT")


def test_the_launch_starts_a_rank_per_rail_and_carries_each_rail_s_variables_in_rail_order(tmp_path: Path) -> None:
    cfg = rails_config("network.interfaces=[eth1,eth2]", "training.backend=gloo")
    records = [HostRecord(host=h, facts=with_rails(2, host=i)) for i, h in enumerate(cfg.cluster.hosts)]  # type: ignore[arg-type]
    launch = derive_launch(cfg, Backend.gloo, records, 29500, "r", join_timeout_s=30, read_timeout_s=30)
    assert (launch.nproc_per_node, launch.rails) == (2, 2)
    bound = {k: v for k, v in launch.hosts[0].env.items() if k.startswith("PREFLIGHT_RAIL_")}
    assert bound == {"PREFLIGHT_RAIL_GLOO_SOCKET_IFNAME": "eth1,eth2"}
    # On nccl a rank per GPU (here 4, spread over the rails), each rail's port where every rail has one.
    ports = recorded_ports(tmp_path, {"mlx5_0": "eth1", "mlx5_1": "eth2"})
    for record in records:
        record.facts["net"]["infiniband"] = copy.deepcopy(ports)
    launch = derive_launch(rails_config("network.interfaces=[eth1,eth2]", "training.nproc_per_node=4"), Backend.nccl, records, 29500,
                           "r", join_timeout_s=30, read_timeout_s=30)
    assert (launch.nproc_per_node, launch.rails) == (4, 2)
    env = launch.hosts[3].env
    assert (env["PREFLIGHT_RAIL_NCCL_SOCKET_IFNAME"], env["PREFLIGHT_RAIL_NCCL_IB_HCA"]) == ("eth1,eth2", "=mlx5_0:1,=mlx5_1:1")
    # One rail: no per-rank binding at all, as before rails.
    plain = rails_config("training.backend=gloo")
    one = [HostRecord(host=h, facts=with_rails(0, host=i)) for i, h in enumerate(plain.cluster.hosts)]  # type: ignore[arg-type]
    launch = derive_launch(plain, Backend.gloo, one, 29500, "r", join_timeout_s=30, read_timeout_s=30)
    assert (launch.nproc_per_node, launch.rails) == (1, 0) and not any(k.startswith("PREFLIGHT_RAIL_") for k in launch.hosts[0].env)


# ---------------------------------------------------------------------------------------------------------------------
# the repeats and the judge, rail by rail


def test_each_rail_s_suspects_are_found_against_its_own_median_and_measured_in_one_plan() -> None:
    healthy = [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0), (3, 0, 1.0)]
    # Rail 1's links run at a tenth of rail 0's: against one median both of rail 1's would be suspects, each alone none.
    assert rails_plan(4, {0: healthy, 1: [(a, b, r / 10) for a, b, r in healthy]}, 0.7, 3) == []
    slow = [(0, 1, 0.1), (1, 2, 0.1), (2, 3, 0.02), (3, 0, 0.1)]  # rail 1: host 2's sending
    assert rails_plan(4, {0: healthy, 1: slow}, 0.7, 3) == repeat_plan(4, slow, 0.7, 3)
    merged = rails_plan(4, {0: [(0, 1, 1.0), (1, 2, 0.2), (2, 3, 1.0), (3, 0, 1.0)], 1: slow}, 0.7, 2)
    assert len(merged) == 2 and all(len(set(links)) == len(links) for links in merged)
    assert (1, 2, "link") in merged[0] and (2, 0, "round") in merged[0]


def two_rails(slow_rail1: dict[str, float], wait_of: Noise | None = None) -> list[ResultEvent]:
    """A launch of 4 hosts x 2 rails as the worker reports it: rank r of each host on rail r, rail 1 at its own pace
    (a rail switch can differ from another), some of its hosts slow there alone (each sample's CPU wait on rail 1 from
    wait_of)."""
    out: list[Any] = []
    for rail, results in enumerate((launch(HOSTS4, 0.4, noise_of=_cycled),
                                    launch(HOSTS4, 0.3, send=slow_rail1, recv=slow_rail1, noise_of=_cycled, wait_of=wait_of))):
        for result in copy.deepcopy(results):
            result["rank"] += rail * len(HOSTS4)
            result["local_rank"] = rail
            for link in result["links"]:
                link["rail"], link["local_rank"] = rail, rail
            out.append(result)
    return out


RAILS = {h: [Rail(0, "eth1", "mlx5_0:1", "netdev"), Rail(1, "eth2", "mlx5_1:1", "netdev")] for h in HOSTS4}


def test_a_host_s_slow_rail_is_named_on_that_rail_with_its_other_rail_beside_it() -> None:
    results = two_rails({"h3": 0.25})
    records: list[Any] = [_Record(h) for h in HOSTS4]
    found, per_rail = judge_rails(PreflightConfig(), Backend.gloo, records, results, None, RAILS)
    assert [r.index for r in per_rail] == [0, 1] and found.slow_hosts() == ["h3"]
    named = [f for f in findings(found, Backend.gloo, pairwise=False, history=[], rails=per_rail) if f.status != Status.passed]
    assert [(f.code, f.status, f.host) for f in named] == [("PF620", Status.fail, "h3")], [f.message for f in named]
    message = named[0].message
    assert message.startswith("rail 1 (eth2 / mlx5_1:1): slow network: sends at ") and "against rail 1's median" in message
    assert "; its other rails: rail 0 (eth1 / mlx5_0:1) at " in message, message
    table = rails_section(per_rail, found.cpu_explains)
    assert [(r["rail"], r["slow_hosts"]) for r in table] == [(0, []), (1, ["h3"])]
    assert [h["interface"] for h in table[1]["hosts"]] == ["eth2"] * 4
    assert {h["host"]: h["verdict"] for h in table[1]["hosts"]}["h3"] == "slow network"


@pytest.mark.parametrize(("factor", "status"), [(0.25, Status.fail), (0.5, Status.warn)])
def test_a_host_slow_on_a_rail_only_while_starved_of_cpu_is_named_pf624_on_that_rail(factor: float, status: Status) -> None:
    from preflight.collective.render import _rail_html
    from preflight.collective.speed_report import section

    def starved(src: str, dst: str, repeat: int, phase: int) -> float:
        return STARVED_WAITS[(repeat + phase) % len(STARVED_WAITS)] if "h3" in (src, dst) else 0.07

    records: list[Any] = [_Record(h) for h in HOSTS4]
    found, per_rail = judge_rails(PreflightConfig(), Backend.gloo, records, two_rails({"h3": factor}, starved), None, RAILS)
    assert found.slow_hosts() == [] and per_rail[1].found.starved_hosts() == ["h3"] and per_rail[0].found.starved_hosts() == []
    named = [f for f in findings(found, Backend.gloo, pairwise=False, history=[], rails=per_rail) if f.status != Status.passed]
    assert [(f.code, f.status, f.host) for f in named] == [("PF624", status, "h3")], [f.message for f in named]
    # Which of its ways stays starved through the extra repeats (starved_repeats) is the noise's: at 0.5x a way can measure
    # at speed once among six, and is then noise.
    ways = [way for way, verdicts in (("sending", found.sending), ("receiving", found.receiving)) if verdicts["h3"].name == "starved"]
    assert ways, (found.sending["h3"], found.receiving["h3"])
    assert named[0].message.startswith(f"rail 1 (eth2 / mlx5_1:1): CPU contention, not a slow link: its {ways[0]} was under "
                                       f"{0.5 if status == Status.fail else 0.7}x of its peers"), named[0].message
    # The host's own row takes its worst rail: starved on rail 1, over rail 0 at speed.
    assert found.contention("h3") == status.value
    table = rails_section(per_rail, found.cpu_explains)
    assert {h["host"]: h["verdict"] for h in table[1]["hosts"]} == {"h1": "ok", "h2": "ok", "h3": "cpu contention", "h4": "ok"}
    assert {h["verdict"] for h in table[0]["hosts"]} == {"ok"} and table[1]["slow_hosts"] == []
    speed = section(found, Backend.gloo)
    speed["rails"] = table
    (page,) = [part for part in _rail_html(speed) if "<table" in part]
    assert f"eth2: cpu contention ({ways[0]} starved" in page and page.count("cpu contention") == 1, page


def test_the_terminal_shows_each_host_on_each_rail_and_names_the_slow_rail() -> None:
    from rich.console import Console

    from preflight.collective.render import _rail_parts
    from preflight.collective.speed_report import section

    records: list[Any] = [_Record(h) for h in HOSTS4]
    found, per_rail = judge_rails(PreflightConfig(), Backend.gloo, records, two_rails({"h3": 0.25}), None, RAILS)
    speed = section(found, Backend.gloo)
    speed["rails"] = rails_section(per_rail, found.cpu_explains)
    console = Console(record=True, width=140)
    for part in _rail_parts(speed):
        console.print(part)
    shown = console.export_text()
    assert "speed per rail" in shown and "rail 0 GB/s" in shown and "rail 1 GB/s" in shown, shown
    (h3,) = [line for line in shown.splitlines() if line.strip().startswith("h3")]
    assert "eth1" in h3 and "eth2" in h3 and h3.rstrip().endswith("rail 1 (eth2) slow network"), shown
    assert not any(line.rstrip().endswith("slow network") for line in shown.splitlines() if not line.strip().startswith("h3"))


def test_the_html_page_shows_each_host_on_each_rail_and_marks_the_slow_rail_only() -> None:
    from test_history import report_of
    from test_history import section as collective_section

    from preflight.collective.speed_report import section
    from preflight.report_html import report_html

    records: list[Any] = [_Record(h) for h in HOSTS4]
    found, per_rail = judge_rails(PreflightConfig(), Backend.gloo, records, two_rails({"h3": 0.25}), None, RAILS)
    collective = collective_section()
    collective["speed"] = section(found, Backend.gloo)
    collective["speed"]["rails"] = rails_section(per_rail, found.cpu_explains)
    collective["speed"]["rails"][1]["hosts"][0]["interface"] = "eth2<b>"  # text from a report file reaches the page escaped
    page = report_html(report_of(collective, 0))
    assert '<h3 id="rails">Speed per rail</h3>' in page and "<b>" not in page[page.index('id="rails"'):]
    rails = page[page.index('<table class="rails">'):]
    rails = rails[:rails.index("</table>")]
    head = re.findall(r"<th>([^<]*)</th>", rails)
    assert head == ["host", "rail 0 GB/s", "rail 0 of median", "rail 0 status", "rail 1 GB/s", "rail 1 of median", "rail 1 status"]
    rows = {cells[0]: cells[1:] for row in re.findall(r"<tr>(.*?)</tr>", rails)[1:]
            for cells in [re.findall(r"<td[^>]*>([^<]*)</td>", row)]}
    assert list(rows) == HOSTS4 and rows["h1"][5] == "eth2&lt;b&gt;: ok", rows
    by_rail = {rail.index: {h["host"]: h for h in table["hosts"]} for rail, table in zip(per_rail, collective["speed"]["rails"])}
    for host, cells in rows.items():
        for rail in (0, 1):
            figure, share, status = cells[3 * rail:3 * rail + 3]
            assert share == f"{by_rail[rail][host]['ratio']:.2f}x" and float(figure) > 0, (host, cells)
            assert status.endswith(": ok") == ((host, rail) != ("h3", 1)), (host, rail, status)
    assert rows["h3"][5] == "eth2: slow network (sending fail, receiving fail)"
    assert float(rows["h3"][4].removesuffix("x")) < 0.5 <= min(float(c[1].removesuffix("x")) for c in rows.values())
    # Only the slow rail's cells are marked: its figure, its share of the median and its status.
    marked = re.findall(r'<td class="(?:num )?odd">([^<]*)</td>', rails)
    assert marked == rows["h3"][3:], marked


def test_healthy_rails_at_different_paces_name_nobody() -> None:
    records: list[Any] = [_Record(h) for h in HOSTS4]
    found, per_rail = judge_rails(PreflightConfig(), Backend.gloo, records, two_rails({}), None, RAILS)
    assert found.slow_hosts() == [] and all(r.found.slow_hosts() == [] for r in per_rail)
    assert [f for f in findings(found, Backend.gloo, pairwise=False, history=[], rails=per_rail) if f.status != Status.passed] == []


@pytest.fixture(scope="module")
def rails4(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return Cluster(sandbox_factory(4, rails=2), tmp_path_factory.mktemp("railspeed"), "railspeed")


def default_check(cluster: Cluster, what: str, overrides: Sequence[str] = FAST) -> dict[str, Any]:
    began = time.monotonic()
    report, _, _ = cluster.check(*overrides, playbook="full", timeout=300)
    speed = report["collective"]["speed"]
    rails = [(r["rail"], r["median_GBps"], [(h["host"], h["ratio"], h["verdict"]) for h in r["hosts"]]) for r in speed.get("rails", [])]
    print(f"\n{what}: default check {time.monotonic() - began:.1f} s, {report['status']}; {speed['message']}; rails {rails}")
    return report


def named(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(f["code"], f["status"], f["host"], f["message"]) for f in report["findings"]
            if f["code"] in ("PF607", "PF608", "PF620", "PF621") and f["status"] in ("warn", "fail")]


@pytest.fixture(scope="module")
def healthy(rails4: Cluster) -> tuple[dict[str, Any], Path]:
    """The healthy cluster's default check, and a copy of its report (the fault tests' checks replace the state's)."""
    report = default_check(rails4, "healthy 4 hosts x 2 rails")
    kept = rails4.folder / "healthy-report.json"
    shutil.copy(rails4.folder / "state" / "report.json", kept)
    return report, kept


@pytest.mark.sandbox
def test_two_rail_hosts_pass_with_one_rank_per_rail_each_rail_judged_on_its_own(healthy: tuple[dict[str, Any], Path]) -> None:
    """No host is failed. As on one rail (test_speed's healthy cluster), a host slow in every repeat on this loaded 2-core
    machine, now with two ranks per host, may warn: never fail."""
    report, _ = healthy
    collective = report["collective"]
    assert collective["status"] == "pass" and collective["nproc_per_node"] == 2, collective["message"]
    assert report["exit_code"] == 0 and {h["status"] for h in report["hosts"]} <= {"pass", "warn"}, named(report)
    assert all(status == "warn" for _, status, _, _ in named(report)), named(report)
    rails = collective["speed"]["rails"]
    assert [r["rail"] for r in rails] == [0, 1]
    for r in rails:
        assert [(h["host"], h["interface"]) for h in r["hosts"]] == [(f"h{k}", f"eth{r['rail'] + 1}") for k in range(1, 5)]
        assert r["median_GBps"]
    # Every link of the ring on both rails: rank r sent on rail r only.
    assert {(link["src"], link["dst"]) for link in collective["speed"]["links"]} >= {("h1", "h2"), ("h2", "h3"), ("h3", "h4"), ("h4", "h1")}


@pytest.mark.sandbox
def test_one_host_s_rail_1_at_about_half_its_rail_s_speed_is_failed_there_and_nothing_else(rails4: Cluster) -> None:
    """The band users meet on one rail (an HCA trained at half width): every host's rails held to the band test's LINK
    by tbf, so that the links set each rail's pace and not this machine's two cores (tests/test_speed_band.py), and
    h3's rail 1 to 0.4x of it both ways (its "about half", a fifth under the fail line). h3 is failed on rail 1 alone:
    no other host is failed or named slow on either rail, and h3's rail 0 is not slow."""
    sandbox = rails4.sandbox
    try:
        for host in sandbox.hosts:
            for rail in (0, 1):
                sandbox.rate_limit(host.name, rate=f"{LINK_MBIT}mbit", burst="256kbit", rail=rail)
        sandbox.rate_limit("h3", rate=f"{round(LINK_MBIT * 0.4)}mbit", burst="256kbit", rail=1)
        report = default_check(rails4, f"rails at {LINK_MBIT} Mbit/s, h3 rail 1 at 0.4x", BAND)
    finally:
        for host in sandbox.hosts:
            sandbox.heal(host.name)
    found = named(report)
    assert [(code, status, host) for code, status, host, _ in found if status == "fail"] == [("PF620", "fail", "h3")], found
    (message,) = [m for _, status, _, m in found if status == "fail"]
    assert message.startswith("rail 1 (eth2): slow network: sends at ") and "receives at" in message, message
    assert "under 0.5x in each of 3 repeats" in message and "its other rails: rail 0 (eth1) at" in message, message
    assert "against rail 1's median" in message, message
    assert {h["name"] for h in report["hosts"] if h["status"] == "fail"} == {"h3"}
    rails = {r["rail"]: r for r in report["collective"]["speed"]["rails"]}
    assert (rails[0]["slow_hosts"], rails[1]["slow_hosts"]) == ([], ["h3"]), rails
    assert [h["host"] for h in rails[1]["hosts"] if h["sending"] == "fail" or h["receiving"] == "fail"] == ["h3"], rails[1]
    assert not [h for h in rails[0]["hosts"] if "fail" in (h["sending"], h["receiving"])], rails[0]
    rails4.assert_nothing_left()


@pytest.mark.sandbox
def test_the_emitted_per_rail_launch_trains_ddp_with_each_rank_on_its_rail(rails4: Cluster, healthy: tuple[dict[str, Any], Path],
                                                                           tmp_path: Path) -> None:
    """emit-launch from the healthy check: each host's env file carries its rails in rank order, the script runs through
    the rail_env.py it wrote beside them, and the line the env file says to run trains a real DDP job (gloo) with local
    rank r's gloo bound to rail r on every host."""
    report, kept = healthy
    out = tmp_path / "launch"
    settings = [f"launch.rail_wrapper={out / 'rail_env.py'}", f"launch.script={DDP_SCRIPT}"]
    result = emit(rails4, "--report", str(kept), "--out", str(out), *settings)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["h1.env", "h2.env", "h3.env", "h4.env", "rail_env.py"]
    # On rails the json format is two files too: the document and the wrapper it names.
    result = emit(rails4, "--report", str(kept), "--format", "json", "--out", str(tmp_path / "json"), *settings)
    assert result.returncode == 0 and sorted(p.name for p in (tmp_path / "json").iterdir()) == ["launch.json", "rail_env.py"]
    document = json.loads((tmp_path / "json" / "launch.json").read_text())
    assert document["nproc_per_node"] == 2 and document["world_size"] == 8
    assert document["script"] == [str(out / "rail_env.py"), str(DDP_SCRIPT)]
    assert {h["env"]["PREFLIGHT_RAIL_GLOO_SOCKET_IFNAME"] for h in document["hosts"]} == {"eth1,eth2"}
    commands = {}
    for host in rails4.sandbox.hosts:
        env_file = out / f"{host.name}.env"
        (use,) = [line for line in env_file.read_text().splitlines() if line.startswith("# use: ")]
        line = use.removeprefix("# use: ").replace("torchrun ", f"{torchrun_of(rails4)} ", 1)
        commands[host.name] = line.replace("THIS_FILE", shlex.quote(str(env_file)))
    # Local rank r's gloo on rail r's interface (eth1 is rail 0), whatever the host.
    assert_trained_together(rails4, run_on_hosts(rails4, commands), document, lambda line: f"eth{line['local_rank'] + 1}")
    assert report["collective"]["status"] == "pass"
