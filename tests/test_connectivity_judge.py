"""The connectivity judge alone, on the outputs mesh.py prints (their shape as the namespace runs in
tests/test_connectivity.py produce them), changing only the paths under test: who is blamed, and how it is worded."""

from __future__ import annotations

from typing import Any

from preflight.connectivity.judge import MeshRun, judge_mesh
from preflight.connectivity.plan import plan_mesh
from preflight.findings import Status
from preflight.spec import ConnectivityConfig

HOSTS = ["h1", "h2", "h3", "h4"]
ADDRESS = {h: f"198.18.0.{10 + i}" for i, h in enumerate(HOSTS)}
PORTS = {h: 40000 + i for i, h in enumerate(HOSTS)}


def healthy(host: str, mtu: int = 1500) -> dict[str, Any]:
    peers = [p for p in HOSTS if p != host]
    return {"host": host, "address": ADDRESS[host], "serving": {"result": "ok", "detail": ""} if host == "h1" else None,
            "registry": {"result": "ok", "detail": "", "ms": 0.3, "waited_s": 0.0}, "joined": HOSTS,
            "ports": {"tcp": PORTS[host], "udp": PORTS[host] + 100},
            "tcp": [{"peer": p, "address": ADDRESS[p], "port": PORTS[p], "result": "ok", "detail": "", "ms": 0.2} for p in peers],
            "loss": [{"peer": p, "sent": 50, "echoed": 50, "rtt_ms": 0.3} for p in peers],
            "mtu": [{"peer": p, "sizes": [mtu, 1280] if mtu == 1500 else [mtu, 8192, 4096, 1500, 1280],
                     "passed": [mtu, 1280] if mtu == 1500 else [1500, 1280], "local_refusals": {}} for p in peers],
            "error": None, "elapsed_s": 1.2}


def judged(outputs: dict[str, dict[str, Any]], problems: dict[str, str] | None = None) -> tuple[list[Any], Any]:
    run = MeshRun(plan=plan_mesh(HOSTS, ConnectivityConfig(), seed=1), master="h1", port=29500, mtu={h: 1500 for h in HOSTS},
                  outputs=outputs, problems=problems or {}, elapsed_s=2.0)  # type: ignore[arg-type]
    return judge_mesh(run, ConnectivityConfig())


def failing(findings: list[Any]) -> list[tuple[str, str, str]]:
    return [(f.code, f.host, f.message) for f in findings if f.status == Status.fail]


def test_healthy_mesh_passes_with_every_count() -> None:
    findings, section = judged({h: healthy(h) for h in HOSTS})
    assert failing(findings) == [] and section["status"] == "pass"
    assert (section["tcp_tested"], section["mtu_tested"], section["loss_tested"]) == (16, 12, 12)
    assert section["loss_max_percent"] == 0.0 and section["rtt_median_ms"] == 0.3


def test_one_broken_link_is_named_as_the_path_not_a_host() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    outputs["h2"]["tcp"][2].update(result="refused", detail="Connection refused")  # h2 -> h4 only
    findings, section = judged(outputs)
    ((code, host, message),) = failing(findings)
    assert (code, host) == ("PF610", "h2") and message.startswith(f"h2 -> h4:{PORTS['h4']} refused") and "REJECT" in message
    assert section["status"] == "fail" and len(section["tcp_failed"]) == 1


def test_a_source_that_reaches_no_one_is_blamed_once() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    for row in outputs["h3"]["tcp"]:
        row.update(result="no-route", detail="No route to host")
    ((code, host, message),) = failing(judged(outputs)[0])
    assert (code, host) == ("PF610", "h3") and message.startswith("h3 reaches none of its 3 peers over TCP (no-route")


def test_udp_blocked_everywhere_is_a_warning_and_no_mtu_verdict() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    for out in outputs.values():
        for row in out["loss"]:
            row["echoed"] = 0
        for row in out["mtu"]:
            row["passed"] = []
    findings, section = judged(outputs)
    assert failing(findings) == []
    (warning,) = [f for f in findings if f.status == Status.warn]
    assert warning.code == "PF612" and "UDP is blocked" in warning.message
    assert section["mtu_tested"] == 0 and section["loss_tested"] == 0 and section["status"] == "pass"


def test_a_host_that_could_not_run_it_makes_the_section_unknown() -> None:
    outputs = {h: healthy(h) for h in HOSTS if h != "h4"}
    findings, section = judged(outputs, {"h4": "the mesh test printed no result"})
    assert [(f.code, f.host, f.status) for f in findings if f.status != Status.passed] == [("PF609", "h4", Status.unknown)]
    assert section["status"] == "unknown"


def test_a_rendezvous_port_in_use_leaves_the_verdict_to_the_collective() -> None:
    outputs = {h: healthy(h) for h in HOSTS}
    outputs["h1"]["serving"] = {"result": "in-use", "detail": "Address already in use"}
    findings, section = judged(outputs)
    assert findings == [] and section["status"] == "skipped" and "in use" in section["message"]
