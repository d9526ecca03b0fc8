"""emit-launch without a cluster: derivations from recorded reports and facts, every format checked by the program
that reads it (a real shell, torchrun's own argument parser, bash), and every refusal."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from recorded import DATA, h100_facts, variant

from preflight.checks import run_checks
from preflight.cli import main
from preflight.compose import Spec, load_spec
from preflight.contracts import REPORT_SCHEMA_VERSION
from preflight.emit import Refusal, build_document, derive, node_script, plan_launch, render
from preflight.findings import Finding, Status
from preflight.records import HostOutcome, HostRecord
from preflight.report import build_report
from preflight.resources import load_schema

CONF = DATA / "emit-conf"
RECORDED = DATA / "sandbox-emit3"
# The reports are stamped relative to the real clock: the CLI tests check their age against it.
NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
ETH9 = "cluster.hosts.2.interface=eth9"


def spec_of(*overrides: str, cluster: str = "emit3") -> Spec:
    return load_spec([f"cluster={cluster}", *overrides], str(CONF))


def recorded(name: str, spec: Spec, age_h: float = 1.0) -> dict[str, Any]:
    """A recorded report, re-stamped for the spec under test and made age_h hours before NOW."""
    report: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    report["config_digests"] = spec.group_digests()
    report["created_at"] = (NOW - dt.timedelta(hours=age_h)).isoformat(timespec="seconds")
    return report


def document_of(spec: Spec, report: dict[str, Any], *, force: bool = False) -> dict[str, Any]:
    plan = plan_launch(spec, report, now=NOW, force=force)
    return build_document(spec, report, Path("report.json"), plan, derive(spec, report, plan))


def saved(tmp_path: Path, report: dict[str, Any]) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


def test_launch_from_the_recorded_sandbox_report() -> None:
    spec = spec_of()
    document = document_of(spec, recorded("pass", spec))
    jsonschema.validate(document, load_schema("launch"))
    assert document["master"] == {"host": "h1", "addr": "198.19.0.11", "port": 29500}
    assert (document["nnodes"], document["nproc_per_node"], document["world_size"], document["backend"]) == (3, 1, 3, "gloo")
    assert document["rendezvous"]["endpoint"] == "198.19.0.11:29500"
    hosts = {h["name"]: h for h in document["hosts"]}
    expected = [("h1", "198.19.0.11", "eth0"), ("h2", "198.19.0.12", "ens5"), ("h3", "198.19.0.13", "eth0")]
    for rank, (name, address, ifname) in enumerate(expected):
        env = hosts[name]["env"]
        assert (hosts[name]["node_rank"], hosts[name]["local_addr"], hosts[name]["is_host"]) == (rank, address, rank == 0)
        assert env["GLOO_SOCKET_IFNAME"] == ifname and env["PET_LOCAL_ADDR"] == address
        assert env["NODE_RANK"] == str(rank) and env["PET_NNODES"] == "3" and env["MASTER_ADDR"] == "198.19.0.11"
        assert env["PET_RDZV_CONF"] == f"join_timeout=900,read_timeout=60,is_host={int(rank == 0)}"
        assert env["PREFLIGHT_BACKEND"] == "gloo" and env["PREFLIGHT_INIT_TIMEOUT_S"] == "600"
        assert not [k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_"))]  # a gloo job gets no NCCL settings
        assert "--local-addr" in hosts[name]["torchrun_args"]
    # One report, one launch: emitting twice gives the same rendezvous id.
    assert document_of(spec, recorded("pass", spec))["rendezvous"]["id"] == document["rendezvous"]["id"]


def gpu_report(spec: Spec, facts: list[dict[str, Any]]) -> dict[str, Any]:
    """A report for the gpu2 cluster over these facts, with the NCCL collective passed (no GPU here to run it)."""
    records = [HostRecord(host=host, facts=f) for host, f in zip(spec.config.cluster.hosts, facts, strict=True)]
    outcomes = [HostOutcome(host=r.host, record=r, problem=None) for r in records]
    findings = [f for f in run_checks(records, spec.config) if f.status != Status.fail]  # the checks are not under test
    collective = {"backend": "nccl", "status": "pass", "hosts": ["g1", "g2"], "master": "g1", "port": 29500, "nproc_per_node": 1,
                  "world_size": 2, "message": "", "verify": None, "sweep": [], "isolation": None}
    return build_report(spec, outcomes, findings, NOW - dt.timedelta(minutes=5), 1.0, {"collective": collective})


def with_address(address: str, ib: list[tuple[str, int, str]]) -> dict[str, Any]:
    """The H100 recording with an IPv4 on eth0 (it recorded none) and these InfiniBand ports."""

    def change(facts: dict[str, Any]) -> None:
        facts["net"]["interfaces"][0]["ipv4"] = [f"{address}/24"]
        facts["net"]["infiniband"] = [{"device": d, "port": p, "state": s, "phys_state": "LinkUp" if s == "ACTIVE" else "Polling",
                                       "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"} for d, p, s in ib]
    return variant(change)


def test_nccl_launch_from_the_h100_recording() -> None:
    spec = spec_of(cluster="gpu2")
    ib = [("mlx5_0", 1, "ACTIVE"), ("mlx5_1", 1, "DOWN"), ("mlx5_10", 1, "ACTIVE")]
    document = document_of(spec, gpu_report(spec, [with_address("198.18.4.1", ib), with_address("198.18.4.2", ib)]))
    jsonschema.validate(document, load_schema("launch"))
    # The host name resolves to 127.0.0.1 on the recorded host: the address comes from the interface instead.
    assert document["master"]["addr"] == "198.18.4.1" and document["backend"] == "nccl"
    env = document["hosts"][1]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_10:1"  # ACTIVE ports only, matched exactly
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["NCCL_DEBUG"] == "WARN"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"] == "/tmp/preflight_fr_rank_"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "600" and env["PET_NPROC_PER_NODE"] == "1"  # the recording has one GPU


def test_loopback_master_is_refused_across_hosts() -> None:
    """The H100 recording as it is: eth0 without IPv4, only 127.0.0.1 on lo. One host may rendezvous on loopback;
    two must not, or every host but the master hangs."""
    spec = spec_of(cluster="gpu2")
    with pytest.raises(Refusal, match=r"g1's address for the job is 127\.0\.0\.1, a loopback"):
        document_of(spec, gpu_report(spec, [h100_facts(), h100_facts()]))


def test_env_files_read_back_through_a_real_shell(tmp_path: Path) -> None:
    # A dump prefix with a space and a quote: the file must still give exactly the value.
    spec = spec_of(cluster="gpu2")
    document = document_of(spec, gpu_report(spec, [with_address("198.18.4.1", []), with_address("198.18.4.2", [])]))
    document["hosts"][0]["env"]["TORCH_FR_DUMP_TEMP_FILE"] = "/tmp/it's a dir/fr_"
    for output in render(document, "env", []):
        path = tmp_path / output.name
        path.write_text(output.text)
        shell = subprocess.run(["env", "-i", "bash", "--noprofile", "--norc", "-c", 'set -a; . "$1"; set +a; exec env -0', "_", str(path)],
                               capture_output=True, text=True, timeout=10, check=True)
        parsed = dict(item.split("=", 1) for item in shell.stdout.split("\0") if item)
        host = next(h for h in document["hosts"] if f"{h['name']}.env" == output.name)
        assert {k: parsed.get(k) for k in host["env"]} == host["env"]
    # Every value preflight derives needs no quoting, so Docker's --env-file (which keeps quotes) reads the same.
    clean = document_of(spec, gpu_report(spec, [with_address("198.18.4.1", []), with_address("198.18.4.2", [])]))
    assert all(shlex.quote(v) == v for h in clean["hosts"] for v in h["env"].values())


def test_torchrun_lines_parse_with_torchruns_own_parser() -> None:
    from torch.distributed.run import get_args_parser

    spec = spec_of("launch.script=train.py", "launch.script_args=['--lr=0.1','model.layers=[2,4]']")
    document = document_of(spec, recorded("pass", spec))
    (output,) = render(document, "torchrun", [])
    subprocess.run(["sh", "-n"], input=output.text, text=True, timeout=10, check=True)
    lines = output.text.splitlines()
    for host in document["hosts"]:
        argv = shlex.split(lines[lines.index(f"# {host['name']} (node {host['node_rank']})") + 1])
        start = argv.index("torchrun")
        assert argv[0] == "env" and dict(a.split("=", 1) for a in argv[1:start]) == \
            {k: v for k, v in host["env"].items() if not k.startswith("PET_")}
        args = get_args_parser().parse_args(argv[start + 1:])
        assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint) == ("3", "1", "c10d", "198.19.0.11:29500")
        assert (args.local_addr, args.rdzv_id, args.max_restarts) == (host["local_addr"], document["rendezvous"]["id"], 0)
        assert args.training_script == "train.py" and args.training_script_args == ["--lr=0.1", "model.layers=[2,4]"]


def test_slurm_script_is_valid_bash_and_refuses_a_node_not_checked(tmp_path: Path) -> None:
    spec = spec_of()
    document = document_of(spec, recorded("pass", spec))
    (output,) = render(document, "slurm", [])
    assert output.text.startswith("#!/bin/bash\n#SBATCH --job-name=emit3\n#SBATCH --nodes=3\n")
    script = tmp_path / output.name
    script.write_text(output.text)
    subprocess.run(["bash", "-n", str(script)], timeout=10, check=True)
    stranger = subprocess.run(["bash", "-c", node_script(document, "torchrun")], env={"SLURMD_NODENAME": "h9", "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=10, check=False)
    assert stranger.returncode == 1 and "node h9 is not in the checked launch" in stranger.stderr


def test_stale_report_is_refused_and_forcing_says_so() -> None:
    spec = spec_of()
    report = recorded("pass", spec, age_h=25)
    with pytest.raises(Refusal, match=r"the report is 25.0 h old \(launch.max_report_age_h=24\)"):
        plan_launch(spec, report, now=NOW, force=False)
    document = document_of(spec, report, force=True)
    assert document["forced"] and "25.0 h old" in document["forced_over"][0]
    assert all(h["env"]["PREFLIGHT_FORCED"] == "1" for h in document["hosts"])
    assert "# FORCED with --force over: the report is 25.0 h old" in render(document, "env", ["h1"])[0].text
    longer = spec_of("launch.max_report_age_h=48")
    plan_launch(longer, recorded("pass", longer, age_h=25), now=NOW, force=False)


def test_report_for_another_config_is_refused() -> None:
    report = recorded("pass", spec_of())
    with pytest.raises(Refusal, match=r"another config \(its training differs\)"):
        plan_launch(spec_of("training.init_timeout_s=300"), report, now=NOW, force=False)
    with pytest.raises(Refusal, match=r"another config \(its cluster, network differ\)"):
        plan_launch(spec_of("cluster.hosts.1.interface=eth7", "network.master_port=29600"), report, now=NOW, force=False)
    # How it was checked or emitted is not what the job is: other collective or launch settings are the same config.
    plan_launch(spec_of("collective.iters=50", "launch.nccl_debug=INFO"), report, now=NOW, force=False)


def test_failed_host_is_refused_unless_left_out() -> None:
    spec = spec_of(ETH9)
    report = recorded("fail-h3-eth9", spec)
    with pytest.raises(Refusal) as refused:
        plan_launch(spec, report, now=NOW, force=False)
    assert "1 host(s) failed (h3: PF303" in str(refused.value) and "launch.exclude_failed=true leaves them out" in str(refused.value)
    spec = spec_of(ETH9, "launch.exclude_failed=true")
    report = recorded("fail-h3-eth9", spec)
    document = document_of(spec, report)
    assert [h["name"] for h in document["hosts"]] == ["h1", "h2"] and document["nnodes"] == 2
    assert document["master"]["port"] == report["collective"]["isolation"]["confirmed"]["port"]
    assert document["excluded"][0]["host"] == "h3" and document["excluded"][0]["reason"].startswith("PF303")
    assert all(h["env"]["PET_NNODES"] == "2" for h in document["hosts"])


def test_failed_collective_without_a_confirmed_set_is_refused() -> None:
    spec = spec_of(ETH9, "launch.exclude_failed=true")
    report = recorded("fail-h3-eth9", spec)
    report["collective"]["isolation"]["confirmed"] = None
    with pytest.raises(Refusal, match=r"the collective did not pass \(fail: .*\).*cluster: PF60"):
        plan_launch(spec, report, now=NOW, force=False)


def test_report_without_a_collective_is_refused() -> None:
    spec = spec_of()
    report = recorded("pass", spec)
    report["collective"], report["playbook"] = None, "facts"
    with pytest.raises(Refusal, match=r"no collective \(playbook facts runs none\): run `preflight check` with playbook=full"):
        plan_launch(spec, report, now=NOW, force=False)


def unreached(report: dict[str, Any], *names: str) -> None:
    """The report as a check writes it for hosts its probe could not reach: no facts, status unknown, a PF001 each."""
    for host in report["hosts"]:
        if host["name"] in names:
            host.update(status="unknown", reason=f"not checked: cannot resolve {host['name']}", facts=None)
            report["findings"].append(Finding("PF001", Status.unknown, host["name"], host["reason"]).to_json())


def test_report_of_hosts_none_answered_says_so_and_not_that_the_playbook_runs_no_collective() -> None:
    """A full playbook whose probe reached no host ran no collective: the refusal says why, not "playbook full runs none"
    with the advice to run playbook=full."""
    spec = spec_of()
    report = recorded("pass", spec)
    report["collective"], report["status"], report["findings"] = None, "incomplete", []
    unreached(report, "h1", "h2", "h3")
    with pytest.raises(Refusal) as refused:
        plan_launch(spec, report, now=NOW, force=False)
    assert "no collective (no host could be probed, so none ran)" in str(refused.value)
    assert "runs none" not in str(refused.value) and "playbook=full" not in str(refused.value)
    # Leaving every host out launches nothing: the way out named is another master, not launch.exclude_failed.
    assert "the master h1 is one: make a healthy host cluster.master" in str(refused.value)
    assert "exclude_failed" not in str(refused.value)
    # Forced, it still cannot write a launch for hosts it has no facts of: it names them all, and the same way out.
    with pytest.raises(Refusal) as forced:
        document_of(spec, report, force=True)
    assert str(forced.value) == ("the report has no facts for h1, h2, h3: not checked, so no launch can be written for them "
                                 "(the master h1 is one: make a healthy host cluster.master)")


def test_forced_launch_over_a_host_never_checked_is_refused_and_leaving_it_out_is_the_way() -> None:
    spec = spec_of()
    report = recorded("pass", spec)
    unreached(report, "h3")
    with pytest.raises(Refusal) as forced:
        document_of(spec, report, force=True)
    assert str(forced.value) == ("the report has no facts for h3: not checked, so no launch can be written for it "
                                 "(launch.exclude_failed=true leaves them out)")
    document = document_of(spec_of("launch.exclude_failed=true"), report)
    assert [h["name"] for h in document["hosts"]] == ["h1", "h2"]


def test_failed_master_cannot_be_left_out() -> None:
    spec = spec_of("launch.exclude_failed=true")
    report = recorded("pass", spec)
    report["status"] = "fail"
    report["findings"].insert(0, Finding("PF203", Status.fail, "h1", "/dev/shm 64 MiB < 1 GiB").to_json())
    with pytest.raises(Refusal, match=r"the master h1 failed .*make a healthy host cluster\.master"):
        plan_launch(spec, report, now=NOW, force=True)


def without_torch_on_h3(spec: Spec, *, interface_mtu: dict[str, int] | None = None) -> dict[str, Any]:
    """The recorded report with h3's python lacking torch (the probe's facts of such a python), its findings judged
    again by the real checks; the collective passed on the hosts that have torch, as the stage runs it."""
    report = recorded("pass", spec)
    hosts = {h["name"]: h for h in report["hosts"]}
    hosts["h3"]["facts"]["torch"] = {"installed": False, "version": None, "cuda": None, "location": None, "nccl_version": None,
                                     "nccl_library": None}
    for name, mtu in (interface_mtu or {}).items():
        for iface in hosts[name]["facts"]["net"]["interfaces"]:
            iface["mtu"] = mtu if not iface["loopback"] else iface["mtu"]
    records = [HostRecord(host=h, facts=hosts[h.name]["facts"]) for h in spec.config.cluster.hosts]
    report["findings"] = [f.to_json() for f in run_checks(records, spec.config)] + \
        [f for f in report["findings"] if f["code"].startswith("PF6")]
    report["collective"]["hosts"] = ["h1", "h2"]
    report["status"] = "fail"
    return report


def test_a_difference_most_hosts_pin_on_one_is_that_hosts() -> None:
    """h1 and h2 have torch, h3 has none: the drift is h3's (PF501 on h3), so leaving h3 out leaves no drift behind."""
    spec = spec_of()
    report = without_torch_on_h3(spec)
    failing = {(f["code"], f["host"]) for f in report["findings"] if f["status"] == "fail"}
    assert failing == {("PF104", "h3"), ("PF501", "h3")}
    with pytest.raises(Refusal, match=r"1 host\(s\) failed \(h3: PF104 torch is not installed"):
        plan_launch(spec, report, now=NOW, force=False)
    spec = spec_of("launch.exclude_failed=true")
    document = document_of(spec, without_torch_on_h3(spec))
    assert [h["name"] for h in document["hosts"]] == ["h1", "h2"] and not document["forced"]
    assert [(e["host"], e["reason"].split(" for ")[0]) for e in document["excluded"]] == [("h3", "PF104 torch is not installed")]


def test_a_difference_without_a_majority_only_left_out_hosts_make_refuses_nothing() -> None:
    """MTU 1500, 9000 and 4000 on the three hosts: no majority, so the drift is the cluster's. h2 and h3 fail besides
    and are left out; judged again on h1 alone, nothing differs."""
    spec = spec_of("launch.exclude_failed=true")
    report = without_torch_on_h3(spec, interface_mtu={"h2": 9000, "h3": 4000})
    (drift,) = [f for f in report["findings"] if f["code"] == "PF503"]
    assert (drift["status"], drift["host"]) == ("fail", "*")
    report["findings"].insert(0, Finding("PF203", Status.fail, "h2", "/dev/shm 64 MiB < 1 GiB").to_json())
    document = document_of(spec, report)
    assert [h["name"] for h in document["hosts"]] == ["h1"] and not document["forced"]
    assert [e["host"] for e in document["excluded"]] == ["h2", "h3"]


def test_a_difference_among_the_kept_hosts_still_refuses() -> None:
    """MTU 1500, 9000 and 4000: no majority; with h3 left out, h1 and h2 still differ."""
    spec = spec_of("launch.exclude_failed=true")
    report = without_torch_on_h3(spec, interface_mtu={"h2": 9000, "h3": 4000})
    with pytest.raises(Refusal, match=r"cluster: PF503 socket interface MTU differs: h2 has 9000; the other 1 have 1500 "
                                      r"\(on the 2 hosts kept\)"):
        plan_launch(spec, report, now=NOW, force=False)


def with_denylisted_driver(spec: Spec) -> dict[str, Any]:
    report = recorded("pass", spec)
    report["status"] = "fail"
    report["findings"].insert(0, Finding("PF102", Status.fail, "h2", "NVIDIA driver 545.23.08 is denylisted (==545.23.08): P2P hang",
                                         "move the driver off 545.23.08", {"NCCL_P2P_DISABLE": "1"}).to_json())
    return report


def test_workaround_only_when_allowed_and_only_on_its_host() -> None:
    spec = spec_of()
    with pytest.raises(Refusal, match=r"h2: PF102 .* \(launch.allow_workarounds=true would set NCCL_P2P_DISABLE=1\)"):
        plan_launch(spec, with_denylisted_driver(spec), now=NOW, force=False)
    spec = spec_of("launch.allow_workarounds=true")
    document = document_of(spec, with_denylisted_driver(spec))
    hosts = {h["name"]: h for h in document["hosts"]}
    assert hosts["h2"]["env"]["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_DISABLE" not in hosts["h1"]["env"]
    text = render(document, "env", ["h2"])[0].text
    assert "# workaround for PF102 (NVIDIA driver 545.23.08 is denylisted" in text and "NCCL_P2P_DISABLE=1" in text


def test_denylisted_driver_finding_carries_the_workaround() -> None:
    spec = load_spec(["cluster=local", "training.backend=nccl"])

    def driver_545(facts: dict[str, Any]) -> None:
        facts["gpu"]["driver_version"] = "545.23.08"
    record = HostRecord(host=spec.config.cluster.hosts[0], facts=variant(driver_545))
    (finding,) = [f for f in run_checks([record], spec.config) if f.code == "PF102"]
    assert finding.status == Status.fail and finding.workaround == {"NCCL_P2P_DISABLE": "1"}


def test_cli_writes_files_atomically_and_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_of()
    path = saved(tmp_path, recorded("pass", spec, age_h=0))
    base = ["emit-launch", "--config-dir", str(CONF), "cluster=emit3", "--report", str(path)]
    assert main([*base, "--out", str(tmp_path / "out")]) == 0
    written = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in written] == ["h1.env", "h2.env", "h3.env"]  # nothing half-written or temporary beside them
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in written)
    capsys.readouterr()
    assert main([*base, "--format", "json"]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), load_schema("launch"))
    assert main([*base, "--host", "h2"]) == 0
    assert "GLOO_SOCKET_IFNAME=ens5" in capsys.readouterr().out


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: "{not json", "cannot read the report"),
    (lambda r: json.dumps({**r, "schema": 1}), f"is not a preflight report of schema {REPORT_SCHEMA_VERSION} (found 1)"),
    (lambda r: json.dumps({**r, "status": "great"}), "is not a valid report: status"),
    # Dates emit-launch compares with now: each was a traceback before the schema's date-time format was checked.
    (lambda r: json.dumps({**r, "created_at": "yesterday"}), "is not a valid report: created_at: 'yesterday' is not a 'date-time'"),
    (lambda r: json.dumps({**r, "created_at": "2026-11-23T10:00:00"}), "is not a valid report: created_at"),  # no offset
    (lambda r: json.dumps({**r, "created_at": "2026-13-23T10:00:00+00:00"}), "is not a valid report: created_at"),
])
def test_unreadable_reports_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, message: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(change(recorded("pass", spec_of())))
    assert main(["emit-launch", "--config-dir", str(CONF), "cluster=emit3", "--report", str(path)]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_missing_report_and_unknown_host_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emit-launch", "--config-dir", str(CONF), "cluster=emit3", "--report", str(tmp_path / "none.json")]) == 2
    assert "run `preflight check` first" in capsys.readouterr().err
    path = saved(tmp_path, recorded("pass", spec_of()))
    assert main(["emit-launch", "--config-dir", str(CONF), "cluster=emit3", "--report", str(path), "--host", "h9"]) == 2
    assert "h9 not in the launch" in capsys.readouterr().err
    assert main(["emit-launch", "--format", "yaml"]) == 2


def test_refusal_is_exit_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = saved(tmp_path, recorded("fail-h3-eth9", spec_of(ETH9)))
    assert main(["emit-launch", "--config-dir", str(CONF), "cluster=emit3", ETH9, "--report", str(path)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("preflight: error: ") and error.count("\n") == 1 and "h3" in error


def test_recorded_reports_still_match_the_report_schema() -> None:
    for name in ("pass", "fail-h3-eth9"):
        jsonschema.validate(json.loads((RECORDED / f"{name}.json").read_text()), load_schema("report"))
