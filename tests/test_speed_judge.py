"""The speed judge's one rule on figures of the shapes real launches give, gloo and nccl alike: a suspect under
suspect_fraction of the median is measured again, fails under fail_fraction in every repeat, warns under
suspect_fraction in every repeat, and is noise otherwise; sending and receiving apart.

Each case runs the worker's own plan (worker.repeat_plan) over a model of the cluster: a link's rate is the lower of
its sender's sending and its receiver's receiving (and the link's own, where a path is slow), times a noise factor per
measurement. So what is tested is what a launch does: the ring, the plan the ranks would agree on, the repeats."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from preflight.collective.host.plans import excused, lay_out, neighbour_phases, pair_round_phases, repeat_plan, settled, unresolved
from preflight.collective.speed import Judgement, judge, judge_ratios
from preflight.collective.speed_report import findings, noise, pairwise_section, section
from preflight.collective.wire import LinkResult, ResultEvent
from preflight.findings import CLUSTER, Finding, Status, status_name, worst
from preflight.spec import Backend, BandwidthProfile, PreflightConfig, SpeedVerdicts

# The namespace cluster's gloo links (tests/test_speed.py's namespace tests, 4-6 hosts over two cores): 0.2-0.6 GB/s,
# the same link varying about 1.5x between phases; a 256^3 float32 matmul at 15-30 GFLOPS.
GLOO_GBPS = 0.4
GLOO_NOISE = [1.0, 0.82, 1.21, 0.93, 1.1, 0.76, 1.3, 0.88, 1.05, 0.97, 1.16, 0.85]
# nccl, recorded: busbw of 2-node all_reduce pairs of 8 x A100 nodes, from NVIDIA/nccl-tests#106 (2022-05-20): healthy
# pairs 86.81 and 88.36 GB/s; every pair with node se02gn644 49.28-49.36 GB/s, 0.56x, which NCCL's maintainer put down
# to that node ("node 644 has a problem and is slow").
NCCL_HEALTHY = [86.81, 88.36]
NCCL_SLOW_NODE = 49.30
Noise = Callable[[str, str, int, int], float]  # (src, dst, repeat, phase) -> factor


def _steady(src: str, dst: str, repeat: int, phase: int) -> float:
    return 1.0


def _cycled(src: str, dst: str, repeat: int, phase: int) -> float:
    """The namespace cluster's noise (about +-30%): a deterministic factor that differs from link to link and from
    measurement to measurement."""
    return GLOO_NOISE[(sum(map(ord, src + dst)) % 7 + 3 * repeat + phase) % len(GLOO_NOISE)]


def _quiet(src: str, dst: str, repeat: int, phase: int) -> float:
    """A network-bound fabric's noise (about +-5%, as NCCL_HEALTHY's two pairs differ by 2%)."""
    return 1.0 + (_cycled(src, dst, repeat, phase) - 1.0) / 6


def launch(hosts: list[str], rate: float, *, send: Mapping[str, float] | None = None, recv: Mapping[str, float] | None = None,
           link: Mapping[tuple[str, str], float] | None = None, noise_of: Noise = _steady, repeats: int = 3, suspect: float = 0.7,
           gflops: Mapping[str, list[float]] | None = None, import_s: Mapping[str, float] | None = None,
           throttled: Mapping[str, float] | None = None, rounds: list[list[tuple[str, str]]] | None = None,
           wait_of: Noise | None = None, starved_repeats: int = 3) -> list[ResultEvent]:
    """The results a launch would give: ring (and pair rounds), then the suspects' repeats as the worker plans them (and
    stops them: settled, then unresolved past repeats); each sample's CPU wait (its ranks' run_delay share) from wait_of
    (none by default)."""
    send, recv, link = send or {}, recv or {}, link or {}
    index = {h: i for i, h in enumerate(hosts)}

    def measure(src: str, dst: str, repeat: int, phase: int) -> float:
        capacity = min(rate * send.get(src, 1.0), rate * recv.get(dst, 1.0), link.get((src, dst), 1.0) * rate)
        return round(capacity * noise_of(src, dst, repeat, phase), 6)

    def waited(src: str, dst: str, repeat: int, phase: int) -> float:
        return wait_of(src, dst, repeat, phase) if wait_of else 0.0

    rows: dict[str, list[LinkResult]] = {h: [] for h in hosts}
    pair_rows: dict[str, list[LinkResult]] = {h: [] for h in hosts}
    measured: list[tuple[int, int, float]] = []
    ring = neighbour_phases(len(hosts))
    for phase, links in enumerate(ring, start=1):
        for a, b in links:
            gbps = measure(hosts[a], hosts[b], 0, phase)
            measured.append((a, b, gbps))
            rows[hosts[a]].append(_row(hosts[a], hosts[b], phase, 0, [], gbps, waited(hosts[a], hosts[b], 0, phase)))
    paired = [[(index[a], index[b]) for a, b in pairs] for pairs in rounds or []]
    for phase, links in enumerate(pair_round_phases(paired), start=1):
        for a, b in links:
            gbps = measure(hosts[a], hosts[b], 0, 100 + phase)
            measured.append((a, b, gbps))
            pair_rows[hosts[a]].append(_row(hosts[a], hosts[b], phase, 0, [], gbps))
    phase = len(ring)
    done: list[list[tuple[int, int, int, str, float, float | None]]] = []
    for repeat, planned in enumerate(repeat_plan(len(hosts), measured, suspect, repeats + starved_repeats), start=1):
        again: list[tuple[int, int, int, str, float]] = []
        # As the worker lays them: the round's ring in phases of its own, then the suspect links.
        for of in ("round", "link"):
            for laid in lay_out([(a, b) for a, b, tag in planned if tag == of]):
                phase += 1
                for a, b in laid:
                    again.append((a, b, phase, of, measure(hosts[a], hosts[b], repeat, phase)))
                    rows[hosts[a]].append(_row(hosts[a], hosts[b], phase, repeat, [of], again[-1][4],
                                               waited(hosts[a], hosts[b], repeat, phase)))
        # The worker's figure of a sample's wait is the larger end's (_row: send_wait, half of it received).
        done.append([(a, b, at, of, rate, waited(hosts[a], hosts[b], repeat, at)) for a, b, at, of, rate in again])
        if settled(measured, again, suspect, [[figure[:5] for figure in figures] for figures in done[:-1]]):  # as the worker stops
            break
        if repeat >= repeats and not unresolved(measured, done, suspect, SpeedVerdicts().starved_fraction, repeats):
            break
    gflops = gflops or {}
    results: list[Any] = []
    for rank, host in enumerate(hosts):
        slices = gflops.get(host, [24.0, 23.0, 25.0])
        compute = {"n": 256, "dtype": "float32", "iters": 100, "seconds": 0.3, "tflops": sum(slices) / len(slices) / 1000,
                   "throttled_s": (throttled or {}).get(host, 0.0) * 0.3, "slices_tflops": [g / 1000 for g in slices]}
        results.append({"event": "result", "rank": rank, "local_rank": 0, "world_size": len(hosts), "host": host, "hostname": host,
                        "gpu_uuid": None, "torch": "2.13.0", "nccl": None, "identity": None, "problems": [],
                        "verify": {"bytes": 4, "elements": 1, "wrong": 0, "wrong_by_source_rank": {}}, "sweep": [], "phases_s": {},
                        "import_s": (import_s or {}).get(host, 4.0), "compute": compute, "links": rows[host],
                        "pair_links": pair_rows[host]})
    return results


def _row(src: str, dst: str, phase: int, repeat: int, of: list[str], gbps: float, wait: float = 0.0) -> LinkResult:
    return {"src": src, "dst": dst, "local_rank": 0, "rail": 0, "phase": phase, "bytes": 1 << 20, "messages": 10, "seconds": 0.15,
            "GBps": gbps, "repeat": repeat, "of": of, "send_wait": wait, "recv_wait": wait / 2}


class _Record:
    """What the judge reads of a host's record: its name and its probe's seconds."""

    def __init__(self, name: str) -> None:
        self.host = type("Host", (), {"name": name})()
        self.facts = {"probe": {"elapsed_s": 0.2}}


def verdicts(results: list[ResultEvent], backend: Backend = Backend.gloo, *, pairwise: bool = False,
             profile: BandwidthProfile | None = None, config: PreflightConfig | None = None,
             history: list[Finding] | None = None) -> tuple[dict[str, list[tuple[str, str]]], Judgement, list[Finding]]:
    records: list[Any] = [_Record(r["host"]) for r in results]
    found = judge(config or PreflightConfig(), backend, records, results, profile)
    out = findings(found, backend, pairwise=pairwise, history=history or [])
    named: dict[str, list[tuple[str, str]]] = {}
    for f in out:
        if f.status != Status.passed:
            named.setdefault(f.code, []).append((f.status.value, f.host))
    return named, found, out


HOSTS4 = [f"h{k}" for k in range(1, 5)]
HOSTS6 = [f"h{k}" for k in range(1, 7)]
HOSTS32 = [f"h{k}" for k in range(1, 33)]  # the benchmark's size, which this 2-core machine cannot run as namespaces


def test_the_rule_fails_a_deficit_under_the_fail_line_in_every_repeat_and_calls_one_that_does_not_repeat_noise() -> None:
    s = SpeedVerdicts()
    assert judge_ratios(0.9, [], s).name == "ok"
    assert judge_ratios(0.4, [], s).name == "untested"
    assert judge_ratios(0.4, [0.45, 0.3, 0.49], s).name == "fail"
    assert judge_ratios(0.4, [0.45, 0.3, 0.55], s).name == "warn"  # one repeat over the fail line: slower, not failed
    assert judge_ratios(0.4, [0.45, 0.3, 0.75], s).name == "noise"  # one repeat at speed: the deficit did not hold
    assert judge_ratios(None, [], s).name == "ok"


# Recorded on the 2-core VM (2026-11-27, schedstat run_delay over each sample, as a share of it): healthy 6-host checks,
# the samples under 0.5x of their peers waited for a CPU 0.64-1.69 of their time (median 1.31; summed over a rank's
# threads); a host's tbf-limited links at 0.4-0.5x of their peers waited 0.01-0.30 (median 0.08 on 4 hosts, 0.13 on 6).
STARVED_WAITS = [1.33, 1.08, 1.14, 0.64]
SLOW_LINK_WAITS = [0.08, 0.30, 0.02, 0.13]


def test_a_slow_repeat_whose_ranks_waited_for_a_cpu_is_no_evidence_and_a_fast_one_still_counts() -> None:
    s = SpeedVerdicts()
    # A healthy host on a starved VM (recorded ratios 0.27, 0.43, 0.49): its repeats measured the wait, not its link.
    starved = judge_ratios(0.13, [0.27, 0.43, 0.49], s, STARVED_WAITS[:3])
    assert starved.name == "starved" and starved.starved == (1.33, 1.08, 1.14) and not starved.named
    # A tbf-limited link (recorded ratios 0.49-0.51 at 0.5x; 0.41 at 0.4x) waits little: it fails as before.
    assert judge_ratios(0.41, [0.41, 0.40, 0.41], s, SLOW_LINK_WAITS[:3]).name == "fail"
    assert judge_ratios(0.41, [0.41, 0.40, 0.41], s, [None, None, None]).name == "fail"  # unknown waits: the rule as before
    # One starved repeat, and the ranks could measure no third with its CPUs (starved_repeats spent): a fail still rests
    # on three repeats, so the starved one is judged with the two others, all under the fail line.
    mixed = judge_ratios(0.41, [0.41, 0.20, 0.41], s, [0.1, 1.2, 0.1])
    assert (mixed.name, mixed.repeats, mixed.starved, mixed.pooled) == ("fail", (0.41, 0.20, 0.41), (1.2,), True)
    # Two that count are not three: alone, they warn.
    assert judge_ratios(0.41, [0.41, 0.41], s, [0.1, 0.1]).name == "warn"
    # A repeat at speed counts however long it waited: a wait only ever slows a sample, so the deficit did not hold.
    assert judge_ratios(0.3, [0.3, 0.9, 0.3], s, [1.2, 1.2, 1.2]).name == "noise"
    assert judge_ratios(0.3, [0.3, 0.3, 0.3], s, [0.49, 0.49, 0.49]).name == "fail"  # under starved_fraction: evidence


def test_a_starved_deficit_is_as_severe_as_its_ratios_say_by_the_same_fractions() -> None:
    s = SpeedVerdicts()
    # Starved in every repeat, under fail_fraction in each (the recorded healthy-VM ratios above): the CPU is the cause,
    # and the deficit fails as a slow link's would.
    failed = judge_ratios(0.13, [0.27, 0.43, 0.49], s, STARVED_WAITS[:3])
    assert (failed.name, failed.severity, failed.contention) == ("starved", "fail", "fail")
    # One starved repeat at 0.55x: under suspect_fraction in every one, not under fail_fraction: a warning.
    warned = judge_ratios(0.4, [0.45, 0.55, 0.3], s, STARVED_WAITS[:3])
    assert (warned.name, warned.severity) == ("starved", "warn") and warned.repeats == (0.45, 0.55, 0.3)
    # A fast repeat, starved or not, still says noise; a starved repeat beside counted ones is left out as before.
    assert judge_ratios(0.3, [0.3, 0.3, 0.9], s, [1.2, 1.2, 1.2]).severity == "ok"
    assert judge_ratios(0.3, [0.3, 0.3, 0.9], s, [1.2, 1.2, 0.1]).name == "noise"
    # With fewer than `repeats` that count, the starved ones are judged too: a wait only slows a sample, so a starved one
    # at 0.6x says the link ran at 0.6x at least, over the fail line. Three that count leave a starved one out.
    mixed = judge_ratios(0.41, [0.41, 0.6, 0.41], s, [0.1, 1.2, 0.1])
    assert (mixed.name, mixed.severity, mixed.starved, mixed.pooled) == ("warn", "warn", (1.2,), True)
    three = judge_ratios(0.41, [0.41, 0.6, 0.41, 0.42], s, [0.1, 1.2, 0.1, 0.1])
    assert (three.name, three.repeats, three.starved, three.pooled) == ("fail", (0.41, 0.41, 0.42), (1.2,), False)
    assert (judge_ratios(0.45, [0.6, 0.2, 0.6], s, [0.1, 1.2, 0.1]).name) == "warn"  # the counted ones at 0.6x decide



def test_the_evidence_is_the_first_repeats_that_count_so_extra_repeats_never_clear_a_slow_host() -> None:
    s = SpeedVerdicts()
    # A 0.4x host measured beside a starved one: its 3 repeats count, all under 0.5x; the starved host's extra repeats
    # (starved_repeats) measure it again, once at 0.9x. Its evidence is its first 3 that count: it fails as with 3.
    beside = judge_ratios(0.41, [0.41, 0.40, 0.42, 0.9, 0.41, 0.41], s, [0.1] * 6)
    assert (beside.name, beside.repeats) == ("fail", (0.41, 0.40, 0.42))
    # A starved repeat is replaced by the next that counts, up to `repeats` of them.
    replaced = judge_ratios(0.41, [0.41, 0.2, 0.40, 0.42, 0.9], s, [0.1, 1.2, 0.1, 0.1, 0.1])
    assert (replaced.name, replaced.repeats, replaced.starved) == ("fail", (0.41, 0.40, 0.42), (1.2,))

def _starved_h4(src: str, dst: str, repeat: int, phase: int) -> float:
    """h4's ranks got a fraction of the shared cores for the whole launch: the recorded healthy-VM waits on its samples."""
    return STARVED_WAITS[(repeat + phase) % len(STARVED_WAITS)] if "h4" in (src, dst) else 0.07


def test_a_host_starved_of_cpu_and_under_the_fail_line_in_every_repeat_fails_pf624_not_pf620() -> None:
    from test_history import report_of
    from test_history import section as collective_section

    from preflight.collective.render import speed_verdicts

    # Its links at a third of its peers' in every repeat: a job runs at that pace, whatever takes the CPU. Its CPUs stay
    # held, so it stays starved through the starved_repeats too: 6 repeats, all starved.
    named, found, out = verdicts(launch(HOSTS6, GLOO_GBPS, send={"h4": 0.3}, recv={"h4": 0.3}, noise_of=_cycled,
                                        wait_of=_starved_h4))
    assert named == {"PF624": [("fail", "h4")]}
    assert found.sending["h4"].name == found.receiving["h4"].name == "starved" and found.contention("h4") == "fail"
    assert found.slow_hosts() == [] and found.starved_hosts() == ["h4"]
    (finding,) = [f for f in out if f.code == "PF624"]
    assert status_name(worst([f.status for f in out if f.host == "h4"])) == "fail"  # the report's host entry: left out
    assert finding.message.startswith("CPU contention, not a slow link: its sending was under 0.5x of its peers in each of 6 "
                                      "repeat(s) (0.29x, 0.34x, 0.34x, 0.25x, 0.34x, 0.33x)"), finding.message
    assert "waited for a CPU for 64%-133% of the sample's time" in finding.message, finding.message
    assert finding.message.endswith("a job on this host runs at that pace while the contention lasts")
    assert "other processes compete for this host's CPUs" in finding.remedy
    assert "h4 sending" in noise(found)["message"] and "starved" in noise(found)["message"]
    speed = section(found, Backend.gloo)
    rows = {h["host"]: h for h in speed["hosts"]}
    assert (rows["h4"]["verdict"], rows["h4"]["sending"]) == ("cpu contention", "starved")
    assert {h["verdict"] for name, h in rows.items() if name != "h4"} == {"ok"}
    assert speed_verdicts(speed)["h4"] == ["cpu contention (sending and receiving)"]  # the terminal's and the page's words
    collective = collective_section()
    collective["speed"] = speed
    report_of(collective, 0)  # validated against report.schema.json


def test_a_host_starved_of_cpu_and_under_the_suspect_line_only_warns_pf624() -> None:
    named, found, out = verdicts(launch(HOSTS6, GLOO_GBPS, send={"h4": 0.6}, recv={"h4": 0.6}, noise_of=_quiet,
                                        wait_of=_starved_h4))
    assert named == {"PF624": [("warn", "h4")]} and found.contention("h4") == "warn"
    (finding,) = [f for f in out if f.code == "PF624"]
    assert finding.message.startswith("CPU contention, not a slow link: its sending was under 0.7x of its peers in each of 6 "
                                      "repeat(s) (0.60x, 0.61x, 0.61x, 0.58x, 0.61x, 0.61x)"), finding.message
    assert "pace" not in finding.message


def test_a_starved_host_fast_in_one_repeat_is_noise() -> None:
    # At 0.6x with the namespace cluster's noise, h4's sending ran at 0.83x in a repeat: the deficit did not hold.
    named, found, _ = verdicts(launch(HOSTS6, GLOO_GBPS, send={"h4": 0.6}, recv={"h4": 0.6}, noise_of=_cycled, wait_of=_starved_h4))
    assert named == {} and found.sending["h4"].name == "noise" and found.receiving["h4"].name == "ok"


def test_a_slow_host_starved_in_one_repeat_is_judged_on_the_others() -> None:
    def once(src: str, dst: str, repeat: int, phase: int) -> float:
        return 1.2 if "h4" in (src, dst) and repeat == 2 else 0.07

    # The ranks measure it a fourth time, so that three repeats count.
    named, found, out = verdicts(launch(HOSTS6, GLOO_GBPS, send={"h4": 0.3}, recv={"h4": 0.3}, noise_of=_quiet, wait_of=once))
    assert named == {"PF620": [("fail", "h4")]}
    assert len(found.sending["h4"].repeats) == 3 and found.sending["h4"].starved == (1.2,) and not found.sending["h4"].pooled
    (finding,) = [f for f in out if f.code == "PF620"]
    assert "under 0.5x in each of 3 repeats; 1 more starved of CPU, left out" in finding.message, finding.message


def test_a_slow_link_with_low_cpu_waits_is_still_failed() -> None:
    def waits(src: str, dst: str, repeat: int, phase: int) -> float:
        return SLOW_LINK_WAITS[(repeat + phase) % len(SLOW_LINK_WAITS)] if "h3" in (src, dst) else 0.7

    named, _, out = verdicts(launch(HOSTS6, GLOO_GBPS, send={"h3": 0.4}, recv={"h3": 0.4}, noise_of=_quiet, wait_of=waits))
    assert named == {"PF620": [("fail", "h3")]}
    (finding,) = [f for f in out if f.code == "PF620"]
    assert "under 0.5x in each of 3 repeats" in finding.message and "starved" not in finding.message


@pytest.mark.parametrize("hosts", [HOSTS4, HOSTS6, HOSTS32])
def test_a_healthy_noisy_cluster_names_nobody_and_says_what_it_could_resolve(hosts: list[str]) -> None:
    named, found, out = verdicts(launch(hosts, GLOO_GBPS, noise_of=_cycled))
    assert named == {}
    summary = noise(found)
    assert summary["healthy_low"] is not None and 0.6 < summary["healthy_low"] <= 1.0 and summary["healthy_high"] is not None
    assert "under 0.5x of its peers in each of 3 repeat(s) fails" in summary["message"]
    (passed,) = out
    assert passed.code == "PF620" and "healthy figures here ran" in passed.message


@pytest.mark.parametrize("hosts", [HOSTS4, HOSTS6, HOSTS32])
@pytest.mark.parametrize(("factor", "noise_of"), [(0.45, _quiet), (0.25, _cycled)])
def test_a_host_at_half_or_a_quarter_of_its_peers_both_ways_fails_and_no_other_is_named(hosts: list[str], factor: float,
                                                                                       noise_of: Noise) -> None:
    """0.45x on a fabric whose noise is +-5%; 0.25x under the namespace cluster's +-30%. (0.45x under +-30% noise lands
    above the fail line in some repeat: a warning, as the rule says.)"""
    slow = hosts[2]
    named, found, out = verdicts(launch(hosts, GLOO_GBPS, send={slow: factor}, recv={slow: factor}, noise_of=noise_of))
    assert named == {"PF620": [("fail", slow)]}
    assert found.sending[slow].name == found.receiving[slow].name == "fail"
    (finding,) = [f for f in out if f.code == "PF620"]
    assert finding.message.startswith("slow network: sends at ") and ", receives at " in finding.message
    assert "under 0.5x in each of 3 repeats" in finding.message
    # Its ring neighbours were suspects (each shared a slow link with it) and were cleared by their own repeats.
    assert all(found.network(h) in ("ok", "noise") for h in hosts if h != slow)


@pytest.mark.parametrize("hosts", [HOSTS4, HOSTS6, HOSTS32])
def test_a_host_that_only_sends_slowly_is_named_with_both_figures_and_its_receiver_is_never_blamed(hosts: list[str]) -> None:
    slow = hosts[1]
    named, found, out = verdicts(launch(hosts, GLOO_GBPS, send={slow: 0.25}, noise_of=_cycled))
    assert named == {"PF620": [("fail", slow)]}
    assert found.sending[slow].name == "fail" and found.receiving[slow].name == "ok"
    receiver = hosts[2]  # the ring neighbour that received from it
    assert found.receiving[receiver].name == "noise"  # a suspect first, then fast with other senders
    (finding,) = [f for f in out if f.code == "PF620"]
    sends, receives = (float(re.search(rf"{way} at ([0-9.]+) GB/s", finding.message).group(1)) for way in ("sends", "receives"))  # type: ignore[union-attr]
    assert sends < 0.15 < 0.3 < receives, finding.message  # a quarter of 0.4 GB/s, and at speed


# Two bad NICs in one cluster: before each way slow throughout was left out of the yardsticks (plans.steadily_slow),
# a host sending at 0.25x two ring places before one receiving at 0.25x met it in one phase of a repeat, each figure the
# other's only phase mate, so both came out at 1.0x there and neither was named; on 4 hosts the round's median was theirs.
@pytest.mark.parametrize(("hosts", "send", "recv", "noise_of"), [
    (HOSTS6, {"h2": 0.25}, {"h4": 0.25}, _quiet),
    (HOSTS6, {"h2": 0.25}, {"h4": 0.25}, _cycled),
    (HOSTS6, {"h2": 0.45}, {"h4": 0.45}, _quiet),
    (HOSTS4, {"h2": 0.25}, {"h4": 0.25}, _quiet),
    (HOSTS4, {"h3": 0.25}, {"h3": 0.25, "h4": 0.25}, _quiet),
    (HOSTS6, {"h2": 0.25, "h5": 0.25}, {"h2": 0.25, "h5": 0.25}, _cycled),
    (HOSTS32, {"h3": 0.25}, {"h20": 0.25}, _cycled),
], ids=["6 hosts, sends and receives 0.25x", "the same under +-30% noise", "the same at 0.45x", "4 hosts",
        "4 hosts, one both ways and one receiving", "6 hosts, two both ways", "32 hosts"])
def test_two_slow_hosts_in_one_cluster_are_both_failed_and_no_other_is_named(hosts: list[str], send: dict[str, float],
                                                                            recv: dict[str, float], noise_of: Noise) -> None:
    named, found, _ = verdicts(launch(hosts, GLOO_GBPS, send=send, recv=recv, noise_of=noise_of))
    assert named == {"PF620": [("fail", h) for h in sorted({*send, *recv}, key=hosts.index)]}
    assert all(found.sending[h].name == "fail" for h in send) and all(found.receiving[h].name == "fail" for h in recv)


def test_a_way_slow_in_every_repeat_is_steady_and_one_slow_in_some_is_not() -> None:
    from preflight.collective.host.plans import steadily_slow

    # 4 hosts' ring: h2 (1) sends at 0.25x, h4 (3) receives at 0.25x; h3 (2), between them, is a suspect both ways.
    measured = [(0, 1, 0.4), (1, 2, 0.1), (2, 3, 0.1), (3, 0, 0.4)]
    first = [(0, 2, 3, "round", 0.4), (1, 3, 3, "round", 0.1), (2, 0, 4, "round", 0.4), (3, 1, 4, "round", 0.4),
             (1, 2, 5, "link", 0.1), (2, 3, 6, "link", 0.1)]
    second = [(0, 3, 7, "round", 0.1), (2, 1, 7, "round", 0.4), (1, 0, 8, "round", 0.1), (3, 2, 8, "round", 0.4),
              (1, 2, 9, "link", 0.1), (2, 3, 10, "link", 0.1)]
    assert steadily_slow(measured, [first, second], 0.7) == ({1}, {3})
    # h3's own figures were fast with other partners: slow only beside the two, it is not steady either way.
    assert steadily_slow(measured, [first], 0.7) == ({1}, {3})
    # A way fast once is not steady: h2's send to h1 at speed in the second repeat.
    faster = [(a, b, p, of, 0.4 if (a, b) == (1, 0) else rate) for a, b, p, of, rate in second]
    assert steadily_slow(measured, [first, faster], 0.7) == (set(), {3})


def test_a_host_at_0_6_of_its_peers_in_every_repeat_warns() -> None:
    named, _, _ = verdicts(launch(HOSTS6, GLOO_GBPS, send={"h4": 0.6}, recv={"h4": 0.6}))
    assert named == {"PF620": [("warn", "h4")]}


def test_a_host_slow_once_and_fast_in_its_repeats_is_noise_and_the_report_says_so() -> None:
    def once(src: str, dst: str, repeat: int, phase: int) -> float:
        return 0.3 if repeat == 0 and "h5" in (src, dst) else 1.0

    named, found, _ = verdicts(launch(HOSTS6, GLOO_GBPS, noise_of=once))
    assert named == {}
    assert found.sending["h5"].name == "noise" and found.receiving["h5"].name == "noise"
    assert "h5 sending" in noise(found)["cleared"] and "slow once, not in their repeats (noise)" in noise(found)["message"]


@pytest.mark.parametrize(("factor", "noise_of", "status"), [(0.3, _cycled, "fail"), (0.64, _quiet, "warn")])
def test_a_slow_link_between_hosts_fast_with_other_partners_is_named_on_the_link(factor: float, noise_of: Noise, status: str) -> None:
    """0.64x: NVIDIA/nccl#325, a fabric routing collision (nodes 1-2 at 25 GB/s, 1-3 at 39 GB/s; both fast with a fourth),
    on a fabric's +-5% noise."""
    named, found, out = verdicts(launch(HOSTS6, GLOO_GBPS, link={("h2", "h3"): factor}, noise_of=noise_of))
    assert named == {"PF621": [(status, CLUSTER)]}
    assert found.slow_links() == [("h2", "h3")] and found.network("h2") in ("ok", "noise") and found.network("h3") in ("ok", "noise")
    assert "the link h2 -> h3 is slow" in next(f.message for f in out if f.code == "PF621")


def test_with_two_hosts_a_slow_link_is_named_on_the_link_since_no_end_has_another_partner() -> None:
    named, _, out = verdicts(launch(["h1", "h2"], GLOO_GBPS, send={"h2": 0.3}))
    assert named == {"PF621": [("fail", CLUSTER)]}
    assert "had no other partner to measure with" in next(f.message for f in out if f.code == "PF621")


def test_in_the_pairwise_playbook_the_same_judgement_is_reported_as_pf607_and_its_section() -> None:
    rounds = [[("h1", "h2"), ("h3", "h4")], [("h1", "h3"), ("h2", "h4")], [("h1", "h4"), ("h2", "h3")]]
    results = launch(HOSTS4, GLOO_GBPS, send={"h4": 0.3}, recv={"h4": 0.3}, rounds=rounds, noise_of=_cycled)
    named, found, _ = verdicts(results, pairwise=True)
    assert named == {"PF607": [("fail", "h4")]}
    paired = pairwise_section(found, rounds, 1 << 20)
    assert paired["status"] == "fail" and paired["slow_hosts"] == ["h4"] and len(paired["pairs"]) == 6
    assert {h["host"]: h["verdict"] for h in paired["hosts"]} == {"h1": "ok", "h2": "ok", "h3": "ok", "h4": "slow"}


def test_on_gloo_a_host_whose_quota_held_it_back_has_its_slow_links_put_down_to_its_cpu() -> None:
    results = launch(HOSTS4, GLOO_GBPS, send={"h2": 0.05}, recv={"h2": 0.05}, gflops={"h2": [4.0, 3.5, 5.0]}, throttled={"h2": 0.6})
    named, found, out = verdicts(results)
    assert named == {"PF622": [("fail", "h2")]} and found.slow_hosts() == []
    message = next(f.message for f in out if f.code == "PF622")
    assert "quota held it back for 60%" in message and "this is its CPU, not its network" in message
    # On nccl the CPU moves no byte: the network and the compute are each named.
    named, _, _ = verdicts(results, Backend.nccl)
    assert named == {"PF620": [("fail", "h2")], "PF622": [("fail", "h2")]}
    # Its ranks waited for a CPU in every repeat too (a quota throttles runnable ranks): PF622 names that CPU with its
    # evidence, and no PF624 adds other processes as the cause.
    starved = launch(HOSTS4, GLOO_GBPS, send={"h2": 0.05}, recv={"h2": 0.05}, gflops={"h2": [4.0, 3.5, 5.0]}, throttled={"h2": 0.6},
                     wait_of=lambda src, dst, repeat, phase: 0.9 if "h2" in (src, dst) else 0.07)
    named, found, out = verdicts(starved)
    assert named == {"PF622": [("fail", "h2")]} and found.sending["h2"].name == "starved" and found.starved_hosts() == []
    assert "its links are slow too (sends at " in next(f.message for f in out if f.code == "PF622")
    assert {h["host"]: h["verdict"] for h in section(found, Backend.gloo)["hosts"]}["h2"] == "slow compute"


def test_a_slow_torch_import_alone_never_removes_a_slow_network_finding() -> None:
    results = launch(HOSTS6, GLOO_GBPS, send={"h3": 0.25}, recv={"h3": 0.25}, import_s={"h3": 30.0}, noise_of=_cycled)
    named, _, _ = verdicts(results)
    assert named == {"PF620": [("fail", "h3")], "PF623": [("warn", "h3")]}


def test_a_compute_deficit_must_hold_in_every_slice() -> None:
    # One slice at a third (a moment of another process's load): noise. Every slice under half: a failure.
    assert verdicts(launch(HOSTS6, GLOO_GBPS, gflops={"h5": [8.0, 24.0, 25.0]}))[0] == {}
    assert verdicts(launch(HOSTS6, GLOO_GBPS, gflops={"h5": [8.0, 9.0, 10.0]}))[0] == {"PF622": [("fail", "h5")]}
    assert verdicts(launch(HOSTS6, GLOO_GBPS, gflops={"h5": [14.0, 15.0, 15.0]}))[0] == {"PF622": [("warn", "h5")]}


def test_a_compute_slice_s_cpu_wait_is_said_and_judged_as_its_pace() -> None:
    """Each slice carries the share its rank waited for a CPU. A quota holds a runnable rank as another process does, so a
    wait is said beside the deficit, in the finding and the report, and the slice still counts: h5 fails whether it waited
    or not, and its slowest rank's slice is the one reported, with that rank's wait."""
    waited = launch(HOSTS6, GLOO_GBPS, gflops={"h5": [8.0, 9.0, 10.0]})
    for result in waited:
        result["compute"]["slices_waited"] = [0.85, 0.9, 0.88] if result["host"] == "h5" else [0.02, 0.01, 0.03]  # type: ignore[index]
    faster = dict(next(r for r in waited if r["host"] == "h5"), rank=len(waited))
    faster["compute"] = dict(faster["compute"], slices_tflops=[0.02, 0.02, 0.02], slices_waited=[0.0, 0.0, 0.0])  # type: ignore[arg-type]
    named, found, out = verdicts([*waited, faster])  # type: ignore[list-item]
    assert named == {"PF622": [("fail", "h5")]}, named
    assert "its slowest rank waited for a CPU for 85%-90% of each slice" in next(f.message for f in out if f.code == "PF622")
    rows = {row["host"]: row for row in section(found, Backend.gloo)["compute"]}
    assert rows["h5"]["slices_waited"] == [0.85, 0.9, 0.88] and rows["h1"]["slices_waited"] == [0.02, 0.01, 0.03]
    # A worker that measured no wait (an older host, no schedstat): None, and the message says nothing of it.
    unknown = launch(HOSTS6, GLOO_GBPS, gflops={"h5": [8.0, 9.0, 10.0]})
    named, found, out = verdicts(unknown)
    assert named == {"PF622": [("fail", "h5")]} and "waited for a CPU" not in next(f.message for f in out if f.code == "PF622")
    assert section(found, Backend.gloo)["compute"][0]["slices_waited"] == [None, None, None]


def test_on_gloo_a_compute_deficit_that_repeated_explains_its_host_s_slow_links() -> None:
    results = launch(HOSTS6, GLOO_GBPS, send={"h2": 0.3}, recv={"h2": 0.3}, gflops={"h2": [8.0, 9.0, 10.0]})
    named, found, _ = verdicts(results)
    assert named == {"PF622": [("fail", "h2")]} and found.cpu_explains == ["h2"]


@pytest.mark.parametrize("hosts", [HOSTS4, HOSTS6])
def test_nccl_recorded_figures_a_0_5x_hca_fails_and_the_node_at_0_56x_of_nccl_tests_106_warns(hosts: list[str]) -> None:
    """The same rule on nccl: GB/s of a real 8 x A100 fabric. A host whose HCA runs at half rate fails; the node of
    NVIDIA/nccl-tests#106, at 49.3 of 87.6 GB/s (0.56x), is slower in every repeat but above the fail line: a warning."""
    middle = sum(NCCL_HEALTHY) / 2

    def recorded(src: str, dst: str, repeat: int, phase: int) -> float:
        return NCCL_HEALTHY[(phase + repeat) % 2] / middle

    named, _, _ = verdicts(launch(hosts, middle, send={"h2": 0.45}, recv={"h2": 0.45}, noise_of=recorded), Backend.nccl)
    assert named == {"PF620": [("fail", "h2")]}
    ratio = NCCL_SLOW_NODE / middle
    named, _, _ = verdicts(launch(hosts, middle, send={"h2": ratio}, recv={"h2": ratio}, noise_of=recorded), Backend.nccl)
    assert named == {"PF620": [("warn", "h2")]}


def test_the_thresholds_are_the_configured_ones_per_backend() -> None:
    config = PreflightConfig()
    config.collective.speed.nccl.fail_fraction = 0.6
    results = launch(HOSTS6, 87.6, send={"h2": 0.56}, recv={"h2": 0.56})
    assert verdicts(results, Backend.nccl, config=config)[0] == {"PF620": [("fail", "h2")]}
    assert verdicts(results, Backend.gloo, config=config)[0] == {"PF620": [("warn", "h2")]}


def test_the_history_s_pf613_on_a_host_named_here_is_left_to_the_judgement() -> None:
    results = launch(HOSTS6, GLOO_GBPS, send={"h2": 0.3}, recv={"h2": 0.3})
    history = [Finding("PF613", Status.warn, "h2", "40% below"), Finding("PF613", Status.warn, "h5", "20% below")]
    named, _, _ = verdicts(results, history=history)
    assert named == {"PF620": [("fail", "h2")], "PF613": [("warn", "h5")]}


def test_the_section_carries_each_direction_the_settings_and_the_noise() -> None:
    results = launch(HOSTS4, GLOO_GBPS, send={"h2": 0.25}, noise_of=_cycled)
    _, found, _ = verdicts(results)
    speed = section(found, Backend.gloo)
    row = {h["host"]: h for h in speed["hosts"]}["h2"]
    assert row["sending"] == "fail" and row["receiving"] == "ok" and row["verdict"] == "slow network"
    assert row["send_GBps"] is not None and row["send_GBps"] < 0.15 and row["recv_GBps"] is not None and row["recv_GBps"] > 0.3
    assert speed["settings"] == {"suspect_fraction": 0.7, "fail_fraction": 0.5, "repeats": 3, "starved_repeats": 3}
    assert {link["source"] for link in speed["links"]} == {"ring", "repeat"} and speed["noise"]["message"]
    assert speed["bytes"] == 1 << 20


def test_the_repeat_plan_is_a_shifted_ring_per_repeat_with_every_suspect_link_measured_again() -> None:
    ring = [(a, b) for phase in neighbour_phases(6) for a, b in phase]
    measured = [(a, b, 0.1 if a == 2 else 0.4) for a, b in ring]  # host 2 sends slowly to host 3
    plan = repeat_plan(6, measured, 0.7, 3)
    assert len(plan) == 3
    for shift, links in zip((2, 3, 4), plan, strict=True):
        rounds = [(a, b) for a, b, of in links if of == "round"]
        assert rounds == [(i, (i + shift) % 6) for i in range(6)]  # every host sends to and receives from new partners
        assert [(a, b) for a, b, of in links if of == "link"] == [(2, 3)]  # the suspect link itself, each time
    assert repeat_plan(6, [(a, b, 0.4) for a, b in ring], 0.7, 3) == []  # no suspect: no repeat
    # Every host slow alike (a uniformly slow fabric) has no suspect: the peers' median is slow too.
    assert repeat_plan(6, [(a, b, 0.005) for a, b in ring], 0.7, 3) == []
    # Three hosts meet both partners in turn; two hosts can only measure their link again.
    assert [[(a, b) for a, b, _ in links] for links in repeat_plan(3, [(0, 1, 0.1), (1, 2, 0.4), (2, 0, 0.4)], 0.7, 2)] == \
        [[(0, 2), (1, 0), (2, 1), (0, 1)], [(0, 1), (1, 2), (2, 0)]]
    assert [[(a, b) for a, b, _ in links] for links in repeat_plan(2, [(0, 1, 0.1), (1, 0, 0.4)], 0.7, 1)] == [[(0, 1), (1, 0)]]


def test_the_repeats_stop_once_a_repeat_leaves_no_suspect_slow() -> None:
    """A suspect back at speed once is noise whatever later repeats say: a cluster whose suspects were a moment's noise
    pays for one repeat; a slow host is measured in all three."""
    def once(src: str, dst: str, repeat: int, phase: int) -> float:
        return 0.3 if repeat == 0 and "h5" in (src, dst) else 1.0

    noisy = launch(HOSTS6, GLOO_GBPS, noise_of=once)
    assert {link["repeat"] for r in noisy for link in r["links"]} == {0, 1}
    slow = launch(HOSTS6, GLOO_GBPS, send={"h2": 0.3}, recv={"h2": 0.3})
    assert {link["repeat"] for r in slow for link in r["links"]} == {0, 1, 2, 3}
    ring = [(a, b, 0.4) for phase in neighbour_phases(4) for a, b in phase]
    assert settled(ring, [], 0.7)  # nothing measured again: nothing left


def test_a_moment_that_slows_a_whole_phase_names_nobody() -> None:
    """On a shared machine a loaded moment slows every link of a phase alike (seen: two links of one phase at 0.14x and
    0.17x of their round's median, the phases before and after at speed, in a healthy 6-host check). A repeat's figure is
    judged beside its phase's as well as its round's, so the moment is no host's deficit."""
    slow_phases: set[int] = set()

    def moments(src: str, dst: str, repeat: int, phase: int) -> float:
        if repeat == 0:
            return 0.3 if "h3" in (src, dst) else 1.0  # h3 a suspect both ways in the ring, by noise
        if src == "h3" or dst == "h3":
            slow_phases.add(phase)  # every phase h3 is measured in happens to be a loaded moment
        return 0.3 if phase in slow_phases else 1.0

    named, found, _ = verdicts(launch(HOSTS6, GLOO_GBPS, noise_of=moments))
    assert named == {} and found.network("h3") == "noise", (found.sending["h3"], found.receiving["h3"])


def _repeat_of(shift: int, slow: float, wait: float | None, phase: int, count: int = 6, host: int = 3, rate: float = GLOO_GBPS,
               links: tuple[tuple[int, int], ...] = ()) -> list[tuple[int, int, int, str, float, float | None]]:
    """One repeat as the worker gathers it (src, dst, phase, tag, GB/s, CPU wait): a shifted ring, then the suspect links
    not in it (as repeat_plan lays them, a phase after), host's links at slow times the rest's, their waits wait, the
    rest's the recorded healthy 0.07."""
    ring = [(i, (i + shift) % count) for i in range(count)]
    return [(a, b, phase + (of == "link"), of, rate * (slow if host in (a, b) else 1.0), wait if host in (a, b) else 0.07)
            for of, pairs in (("round", ring), ("link", [link for link in links if link not in ring])) for a, b in pairs]


def test_a_suspect_is_unresolved_until_repeats_of_its_figures_count() -> None:
    """The worker measures a suspect again past `repeats` while it was never at speed and fewer than `repeats` (3) of its
    figures count (plans.unresolved): a starved sample is no evidence either way. Host 3's ring links at 0.3x of the
    recorded gloo rate; its repeats' waits the recorded healthy-VM starved ones (STARVED_WAITS) or a tbf-limited link's
    (SLOW_LINK_WAITS)."""
    ring = [(a, b, GLOO_GBPS * (0.3 if 3 in (a, b) else 1.0)) for phase in neighbour_phases(6) for a, b in phase]
    links = ((2, 3), (3, 4))  # the ring's links of host 3, suspects too
    starved = [_repeat_of(shift, 0.3, STARVED_WAITS[k], 10 + 2 * k, links=links) for k, shift in enumerate((2, 3, 4))]
    counted = [_repeat_of(shift, 0.3, SLOW_LINK_WAITS[k], 16 + 2 * k, links=links) for k, shift in enumerate((5, 1, 2))]
    assert unresolved(ring, starved, 0.7, 0.5, 3)  # starved in all three: no evidence yet
    assert unresolved(ring, starved[:1], 0.7, 0.5, 3)
    # One, then two slow repeats whose ranks had their CPUs: not yet three; the third settles it.
    assert unresolved(ring, [*starved, *counted[:1]], 0.7, 0.5, 3) and unresolved(ring, [*starved, *counted[:2]], 0.7, 0.5, 3)
    assert not unresolved(ring, [*starved, *counted], 0.7, 0.5, 3)
    assert not unresolved(ring, [*starved, *counted[:1]], 0.7, 0.5, 1)  # as many as the settings' repeats ask
    # One at speed settles it, starved or not: the deficit did not hold.
    assert not unresolved(ring, [*starved, _repeat_of(5, 1.0, STARVED_WAITS[0], 16, links=links)], 0.7, 0.5, 3)
    for wait in (None, 0.49):  # a wait unknown, or under starved_fraction: each counts
        assert not unresolved(ring, [_repeat_of(s, 0.3, wait, 10 + 2 * s, links=links) for s in (2, 3, 4)], 0.7, 0.5, 3)
    # Nothing slow in the ring: no suspect, nothing to resolve (nor with no repeat at all).
    healthy = [(a, b, GLOO_GBPS) for phase in neighbour_phases(6) for a, b in phase]
    assert not unresolved(healthy, [_repeat_of(2, 1.0, 0.07, 10)], 0.7, 0.5, 3) and not unresolved(healthy, [], 0.7, 0.5, 3)
    # A slow link's suspect (host 2 -> 3 only), starved the first time it was measured again, is unresolved too.
    link_ring = [(a, b, GLOO_GBPS * (0.3 if (a, b) == (2, 3) else 1.0)) for phase in neighbour_phases(6) for a, b in phase]
    again = [[(2, 3, 11 + 2 * k, "link", GLOO_GBPS * 0.3, wait), *_repeat_of(2 + k, 1.0, 0.07, 10 + 2 * k)]
             for k, wait in enumerate((STARVED_WAITS[1], *SLOW_LINK_WAITS[1:4]))]
    assert unresolved(link_ring, again[:1], 0.7, 0.5, 3) and unresolved(link_ring, again[:3], 0.7, 0.5, 3)
    assert not unresolved(link_ring, again, 0.7, 0.5, 3)


def test_a_figure_that_the_partner_s_own_slowness_explains_is_not_the_host_s_evidence() -> None:
    """Host 2 (4 hosts) is slow both ways; host 1 sends to it in the ring and in every repeat whose shift comes back to
    it. Its figure to host 2 is host 2's receiving, not its own sending: left out of host 1's evidence (plans.excused),
    so host 1 is measured again until three of its own figures count. Seen in a whole-suite run's agent-mode check:
    a healthy host failed on one repeat, its only figure that counted, sent to the slow host."""
    ring = [(a, b, GLOO_GBPS * (0.05 if 2 in (a, b) else 1.0)) for phase in neighbour_phases(4) for a, b in phase]
    # Host 1's sends to hosts 3 and 0 starved, its send to host 2 (shift 1) counted and slow.
    waits = {(1, 3): STARVED_WAITS[0], (1, 0): STARVED_WAITS[1]}
    done = [[(a, b, 10 + shift, "round", GLOO_GBPS * (0.05 if 2 in (a, b) else 0.2 if (a, b) in waits else 1.0),
              waits.get((a, b), 0.07)) for a, b in ((i, (i + shift) % 4) for i in range(4))] for shift in (2, 3, 1)]
    assert unresolved(ring, done, 0.7, 0.5, 3)
    figures = [(a, b, rate / GLOO_GBPS, wait) for repeat in done for a, b, _, _, rate, wait in repeat]
    for_sender, for_receiver = excused(figures, {1, 2}, {2, 3}, 0.7, 0.5)
    # Host 2 receives slowly from hosts 0 and 3, no suspects themselves: every figure into it is its own, not its sender's.
    assert [f[:2] for f, out in zip(figures, for_sender) if out] == [(0, 2), (3, 2), (1, 2)]
    # Its sending is slow to hosts 0 and 1 alike; host 1's own other sends were starved, no evidence that it sends slowly.
    assert [f[:2] for f, out in zip(figures, for_receiver) if out] == [(2, 0), (2, 1), (2, 3)]


def test_each_rail_s_suspects_are_resolved_against_its_own_figures() -> None:
    """On rails the worker asks each rail (unresolved on its own figures, against its own median): rail 1 slower
    throughout (a 0.25 GB/s fabric) with host 3 starved on it, rail 0 healthy and its host 3 at speed."""
    rails = {0: [(a, b, GLOO_GBPS) for phase in neighbour_phases(4) for a, b in phase],
             1: [(a, b, 0.25 * (0.3 if 3 in (a, b) else 1.0)) for phase in neighbour_phases(4) for a, b in phase]}
    links = ((2, 3), (3, 0))  # rail 1's ring links of host 3, suspects too
    done = {0: [_repeat_of(2, 1.0, 0.07, 10, count=4)], 1: [_repeat_of(2, 0.3, STARVED_WAITS[0], 10, count=4, rate=0.25, links=links)]}
    assert [unresolved(rails[r], done[r], 0.7, 0.5, 3) for r in (0, 1)] == [False, True]
    # Judged against rail 0's faster median, rail 1's every link would be a suspect; against its own, only host 3's.
    done[1] += [_repeat_of(shift, 0.3, SLOW_LINK_WAITS[k], 12 + 2 * k, count=4, rate=0.25, links=links)
                for k, shift in enumerate((3, 1, 2))]
    assert not unresolved(rails[1], done[1], 0.7, 0.5, 3)


def test_a_suspect_starved_in_the_repeats_is_judged_on_the_repeat_that_counts() -> None:
    s = SpeedVerdicts()
    # Three starved repeats and a fourth (one of starved_repeats) that counts: at speed, noise; slow with its CPUs, and
    # the starved ones under the fail line too, a failure on all four (fewer than `repeats` counted).
    assert judge_ratios(0.3, [0.3, 0.3, 0.3, 0.9], s, [*STARVED_WAITS[:3], 0.07]).name == "noise"
    failed = judge_ratios(0.3, [0.3, 0.3, 0.3, 0.4], s, [*STARVED_WAITS[:3], SLOW_LINK_WAITS[0]])
    assert (failed.name, failed.repeats, failed.starved, failed.pooled) == ("fail", (0.3, 0.3, 0.3, 0.4), tuple(STARVED_WAITS[:3]), True)


def _starved_at_first(src: str, dst: str, repeat: int, phase: int) -> float:
    """h4's ranks wait for a CPU through the ring and the first three repeats (another host's job took the cores), then get them."""
    return STARVED_WAITS[(repeat + phase) % len(STARVED_WAITS)] if "h4" in (src, dst) and repeat <= 3 else 0.07


def test_a_passing_contention_clears_in_the_extra_repeats_and_a_slow_link_under_it_still_fails() -> None:
    # A healthy h4, slowed to 0.3x while starved: the fourth repeat (the first of starved_repeats) finds it at speed.
    def slowed(src: str, dst: str, repeat: int, phase: int) -> float:
        return 0.3 if "h4" in (src, dst) and repeat <= 3 else 1.0

    healthy = launch(HOSTS6, GLOO_GBPS, noise_of=slowed, wait_of=_starved_at_first)
    assert {link["repeat"] for r in healthy for link in r["links"]} == {0, 1, 2, 3, 4}
    named, found, _ = verdicts(healthy)
    assert named == {} and found.sending["h4"].name == "noise" and found.starved_hosts() == []
    # Without the extra repeats the same samples named it PF624: the contention was all there was to see.
    assert verdicts(launch(HOSTS6, GLOO_GBPS, noise_of=slowed, wait_of=_starved_at_first, starved_repeats=0))[0] == \
        {"PF624": [("fail", "h4")]}
    # A host at 0.3x of its peers, starved at first: the fourth to sixth repeats measure its link with its CPUs, and it
    # fails on those three.
    slow = launch(HOSTS6, GLOO_GBPS, send={"h4": 0.3}, recv={"h4": 0.3}, noise_of=_quiet, wait_of=_starved_at_first)
    named, found, out = verdicts(slow)
    assert named == {"PF620": [("fail", "h4")]} and len(found.sending["h4"].repeats) == 3
    (finding,) = [f for f in out if f.code == "PF620"]
    assert "under 0.5x in each of 3 repeats; 3 more starved of CPU, left out" in finding.message, finding.message


def test_a_healthy_host_is_never_failed_on_its_sends_to_the_slow_host_while_its_other_sends_were_starved() -> None:
    """Seen in a whole-suite run's agent-mode check (4 hosts, h3 limited to 20 Mbit/s both ways): h2, which sends to h3
    in the ring, failed PF620 on one repeat. Its sends to h4 and h1 ran at 0.70x and 0.16x while its ranks waited for a
    CPU (left out); its send to h3, where the shifts came back, ran at 0.0095x with its CPUs, and was all that counted.
    That figure is h3's receiving (plans.excused), and h2 is measured again until three of its own figures count: here
    the contention passes, and they are at speed. (The model's first starved send runs at 0.5x of the others: its ratio
    to its round's median, which h2's own slow sample is part of, comes out under 0.7x as that run's did.)"""
    def noise_of(src: str, dst: str, repeat: int, phase: int) -> float:
        return {1: 0.5, 2: 0.16}.get(repeat, 1.0) if src == "h2" and dst != "h3" else 1.0

    def wait_of(src: str, dst: str, repeat: int, phase: int) -> float:
        return STARVED_WAITS[repeat] if src == "h2" and dst != "h3" and repeat in (1, 2) else 0.07

    results = launch(HOSTS4, GLOO_GBPS, send={"h3": 0.02}, recv={"h3": 0.02}, noise_of=noise_of, wait_of=wait_of)
    assert max(link["repeat"] for r in results for link in r["links"]) > 3  # measured again past the three repeats
    named, found, out = verdicts(results)
    assert named == {"PF620": [("fail", "h3")]}, named
    assert found.sending["h2"].name == "noise" and found.sending["h2"].excused == ("h3",)
    (finding,) = [f for f in out if f.code == "PF620"]
    assert "under 0.5x in each of 3 repeats" in finding.message, finding.message
