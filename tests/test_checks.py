"""Checks on the real H100 recording and on variants of it that change only the field under test."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from recorded import h100_facts, variant

from preflight.checks import run_checks
from preflight.checks.cross import same_everywhere
from preflight.compose import load_spec
from preflight.findings import CLUSTER, Finding, Status
from preflight.records import HostRecord
from preflight.resources import load_schema
from preflight.spec import PreflightConfig
from preflight.stage_list import all_codes


def config(*overrides: str) -> PreflightConfig:
    return load_spec(list(overrides)).config


def check_one(facts: dict[str, Any], *overrides: str) -> list[Finding]:
    cfg = config(*overrides)
    host = cfg.cluster.hosts[0]
    return run_checks([HostRecord(host=host, facts=facts)], cfg)  # type: ignore[arg-type]


def by_code(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def status_of(findings: list[Finding], code: str) -> Status:
    (only,) = {f.status for f in by_code(findings, code)}
    return only


def test_recording_converts_to_valid_facts() -> None:
    jsonschema.validate(h100_facts(), load_schema("facts"))


def test_recorded_h100_passes_every_check() -> None:
    findings = check_one(h100_facts())
    # The recording has no kernel log: that is said (a warning), not failed.
    assert [(f.code, f.status) for f in findings if f.status != Status.passed] == [("PF803", Status.warn)]
    assert {f.code for f in findings} == {
        "PF100", "PF101", "PF102", "PF103", "PF104", "PF105", "PF106", "PF107", "PF108",
        "PF201", "PF203", "PF204", "PF207", "PF301", "PF401", "PF402", "PF404", "PF803",
        "PF860", "PF861", "PF862", "PF864", "PF869", "PF870",  # facts schema 3: nothing to judge for PF865, PF868
    }


def test_recorded_h100_reports_the_two_nccls() -> None:
    (finding,) = by_code(check_one(h100_facts()), "PF108")
    assert "torch loads NCCL 2.28.9" in finding.message and "libnccl is 2.28.3" in finding.message


def _set_driver(version: str):
    return lambda f: f["gpu"].__setitem__("driver_version", version)


@pytest.mark.parametrize("driver, source", [
    ("545.23.08", "https://github.com/Lightning-AI/pytorch-lightning/issues/19425"),
    ("545.29.06", "https://github.com/Lightning-AI/pytorch-lightning/issues/19269"),
    ("545.29.02", "https://github.com/Lightning-AI/pytorch-lightning/issues/19269"),
])
def test_denylisted_545_driver_fails(driver: str, source: str) -> None:
    findings = check_one(variant(_set_driver(driver)))
    (deny,) = by_code(findings, "PF102")
    assert deny.status == Status.fail
    assert driver in deny.message and "P2P" in deny.message and source in deny.message
    assert status_of(findings, "PF101") == Status.passed  # 545 satisfies >=535.104: only the denylist catches it


def test_every_shipped_denylist_entry_names_its_source() -> None:
    """A version on the list refuses every cluster that runs it: each entry says where the breakage is documented."""
    for pins in ("current", "any"):
        entries = config(f"pins={pins}").pins.denylist
        assert all(entry.source.startswith("https://") for entry in entries), [e.specifier for e in entries if not e.source]


def test_driver_below_pin_fails() -> None:
    findings = check_one(variant(_set_driver("530.30.02")))
    assert status_of(findings, "PF101") == Status.fail
    assert status_of(findings, "PF102") == Status.passed


def test_uncorrected_ecc_since_boot_fails() -> None:
    findings = check_one(variant(lambda f: f["gpu"]["devices"][0].update(ecc_uncorrected_volatile=3, ecc_uncorrected_aggregate=3)))
    (ecc,) = by_code(findings, "PF401")
    assert ecc.status == Status.fail and "3 uncorrected" in ecc.message


def test_lifetime_ecc_only_warns() -> None:
    findings = check_one(variant(lambda f: f["gpu"]["devices"][0].update(ecc_uncorrected_aggregate=2)))
    assert status_of(findings, "PF401") == Status.warn


def test_docker_default_dev_shm_fails() -> None:
    findings = check_one(variant(lambda f: f["resources"].update(dev_shm_bytes=64 << 20)))
    (shm,) = by_code(findings, "PF203")
    assert shm.status == Status.fail
    assert shm.message == "/dev/shm 64MiB < 1GiB"


def test_pending_row_remap_fails() -> None:
    findings = check_one(variant(lambda f: f["gpu"]["devices"][0].update(remapped_rows_pending=True)))
    assert status_of(findings, "PF402") == Status.fail


def test_failed_row_remap_fails() -> None:
    findings = check_one(variant(lambda f: f["gpu"]["devices"][0].update(remapped_rows_failed=True)))
    assert status_of(findings, "PF403") == Status.fail


def test_missing_interface_fails_and_lists_the_real_ones() -> None:
    findings = check_one(h100_facts(), "network.socket_ifname=ens5")
    (iface,) = by_code(findings, "PF303")
    assert iface.status == Status.fail
    assert "ens5 does not exist" in iface.message and "eth0" in iface.message


def test_interface_down_fails() -> None:
    findings = check_one(h100_facts(), "network.socket_ifname=ifb0")
    (iface,) = by_code(findings, "PF303")
    assert iface.status == Status.fail and "down" in iface.message


def test_interface_without_ipv4_fails() -> None:
    # The recording holds no address for eth0, which is exactly this case.
    (iface,) = by_code(check_one(h100_facts(), "network.socket_ifname=eth0"), "PF303")
    assert iface.status == Status.fail and "no IPv4" in iface.message


def test_the_loopback_as_socket_interface_fails_only_where_another_host_must_reach_it() -> None:
    # GLOO_SOCKET_IFNAME=lo across two hosts advertises 127.0.0.1 to the peer: a rendezvous bound to loopback in
    # another form. On one host it is where every rank is.
    (alone,) = by_code(check_one(h100_facts(), "network.socket_ifname=lo"), "PF303")
    assert alone.status == Status.passed
    named = by_code(check_cluster({}, "network.socket_ifname=lo"), "PF303")
    assert [f.status for f in named] == [Status.fail] * 4
    assert "interface lo is the loopback (127.0.0.1/8)" in named[0].message


def _with_eth0_address(facts: dict[str, Any]) -> None:
    next(i for i in facts["net"]["interfaces"] if i["name"] == "eth0")["ipv4"] = ["198.18.0.2/24"]


def test_interface_with_ipv4_passes_and_mtu_is_compared() -> None:
    findings = check_one(variant(_with_eth0_address), "network.socket_ifname=eth0", "network.mtu=9000")
    assert status_of(findings, "PF303") == Status.passed
    (mtu,) = by_code(findings, "PF304")
    assert mtu.status == Status.warn and "MTU 1400, expected 9000" in mtu.message


def _resolving_to(*addresses: str):
    """eth0 holds 198.18.0.2/24 and the hostname resolves to addresses."""
    def change(facts: dict[str, Any]) -> None:
        _with_eth0_address(facts)
        facts["host"]["resolves_to"] = list(addresses)
    return change


def test_a_hostname_that_resolves_to_no_address_of_the_host_warns_on_a_cluster() -> None:
    # A stale /etc/hosts entry (the image's, or another host's address): gloo cannot bind it and falls back to loopback.
    findings = check_cluster({1: _resolving_to("198.18.0.3")}, "cluster.hosts.0.address=198.18.0.3")
    (stale,) = by_code(findings, "PF309")
    assert (stale.status, stale.host) == (Status.warn, "node02")
    assert stale.message == ("hostname 'vm' resolves to 198.18.0.3 (node01's), an address of no interface of this "
                             "host: gloo cannot bind it and falls back to 127.0.0.1, where no other host reaches it")
    assert "GLOO_SOCKET_IFNAME" in stale.remedy
    assert [f.host for f in by_code(findings, "PF301")] == ["node01", "node03", "node04"]


def test_a_hostname_on_its_own_address_or_that_the_facts_cannot_judge_is_no_stale_name() -> None:
    for change in (_resolving_to("198.18.0.2"),  # its own address
                   _resolving_to("fd00::7"),  # IPv6: the probe reports IPv4 addresses only
                   lambda f: f["host"].update(resolves_to=["198.18.0.3"])):  # no address beyond loopback reported
        findings = check_cluster({1: change})
        assert not by_code(findings, "PF309")
        assert [f.status for f in by_code(findings, "PF301") if f.host == "node02"] == [Status.passed]
    # With GLOO_SOCKET_IFNAME in the host's environment gloo binds the interface and never looks the name up.
    def with_ifname(facts: dict[str, Any]) -> None:
        _resolving_to("198.18.0.3")(facts)
        facts["nccl"]["env"]["GLOO_SOCKET_IFNAME"] = "eth0"
    (named,) = by_code(check_cluster({1: with_ifname}), "PF309")
    assert named.status == Status.passed and named.message.endswith("(harmless: GLOO_SOCKET_IFNAME=eth0)")
    # On one host gloo has no peer to miss it: said, not warned.
    (alone,) = by_code(check_one(variant(_resolving_to("198.18.0.3"))), "PF309")
    assert alone.status == Status.passed and alone.message.endswith("(harmless on one host)")


def test_torch_cuda_newer_than_driver_fails() -> None:
    findings = check_one(variant(lambda f: f["gpu"].update(cuda_driver_version="12.4")))
    (skew,) = by_code(findings, "PF106")
    assert skew.status == Status.fail and "CUDA 13.0" in skew.message and "12.4" in skew.message


def test_torch_cuda_newer_minor_only_warns() -> None:
    findings = check_one(variant(lambda f: f["torch"].update(cuda="13.1")))
    assert status_of(findings, "PF106") == Status.warn


def test_cpu_torch_on_gpu_cluster_fails() -> None:
    findings = check_one(variant(lambda f: f["torch"].update(cuda=None, version="2.11.0+cpu")))
    assert status_of(findings, "PF105") == Status.fail


def test_missing_torch_fails() -> None:
    findings = check_one(variant(lambda f: f["torch"].update(installed=False, version=None, cuda=None, location=None)))
    assert status_of(findings, "PF104") == Status.fail


def _no_driver(facts: dict[str, Any]) -> None:
    facts["gpu"] = {"source": "none", "error": "nvidia-smi not found", "driver_version": None,
                    "cuda_driver_version": None, "devices": []}


def test_no_driver_fails_a_gpu_cluster() -> None:
    findings = check_one(variant(_no_driver), "training.backend=nccl")
    (driver,) = by_code(findings, "PF100")
    assert driver.status == Status.fail and "nvidia-smi not found" in driver.message
    # The missing driver is the root cause: no GPU pin findings pile up behind it.
    assert not by_code(findings, "PF101") and not by_code(findings, "PF106")


def test_a_driver_upgraded_without_a_reboot_is_named_through_nvidia_smi_too() -> None:
    # No nvidia-ml-py on the host: the probe's nvidia-smi path carries nvidia-smi's own line (libnvidia-ml's
    # nvmlErrorString, tests/data/messages/nvidia-driver-libraries.yaml).
    def mismatched(facts: dict[str, Any]) -> None:
        _no_driver(facts)
        facts["gpu"]["error"] = ("pynvml is not installed; nvidia-smi: Failed to initialize NVML: Driver/library version "
                                 "mismatch")
    (driver,) = by_code(check_one(variant(mismatched), "training.backend=nccl"), "PF100")
    assert driver.status == Status.fail and driver.message.startswith("the NVIDIA kernel module is another driver version")
    assert "PF731" in driver.remedy
    # The default backend, auto: the module loads only where there is an NVIDIA GPU, so this is a GPU host whose GPUs
    # cannot be used, not a CPU cluster that passes on gloo.
    (auto,) = by_code(check_one(variant(mismatched)), "PF100")
    assert (auto.status, auto.message) == (driver.status, driver.message)


def test_no_driver_passes_a_gloo_cluster() -> None:
    findings = check_one(variant(_no_driver))  # backend auto: no GPU found, so gloo
    assert [f for f in findings if f.status != Status.passed] == []
    assert status_of(findings, "PF100") == Status.passed


def test_expected_gpu_count() -> None:
    findings = check_one(h100_facts(), "cluster.hosts.0.gpus=8")
    (count,) = by_code(findings, "PF201")
    assert count.status == Status.fail and count.message == "1 GPU(s) found, 8 expected"


def test_more_ranks_per_host_than_gpus_fails_before_any_launch() -> None:
    # Seen on a one-GPU H100 host (2026-11-27): training.nproc_per_node=2 made rank 1 fail in init with "CUDA error:
    # invalid device ordinal", reported as PF601/PF606 with "run nccl-tests; check dmesg for Xid errors".
    (too_many,) = by_code(check_one(h100_facts(), "training.nproc_per_node=2"), "PF207")
    assert too_many.status == Status.fail
    assert too_many.message == "2 rank(s) per host (training.nproc_per_node) but 1 GPU(s): NCCL needs a GPU for each rank"
    (one,) = by_code(check_one(h100_facts(), "training.nproc_per_node=1"), "PF207")
    assert (one.status, one.message) == (Status.passed, "1 rank(s) per host on 1 GPU(s)")
    # gloo ranks use no GPU: two of them on this host are what cluster=local runs without one.
    assert by_code(check_one(h100_facts(), "training.nproc_per_node=2", "training.backend=gloo"), "PF207") == []


def test_memory_in_use_fails_and_processes_warn() -> None:
    def busy(facts: dict[str, Any]) -> None:
        facts["gpu"]["devices"][0].update(memory_used_bytes=40 << 30,
                                          processes=[{"pid": 404, "name": "python3", "used_memory_bytes": 40 << 30}])
    findings = check_one(variant(busy))
    assert status_of(findings, "PF204") == Status.fail
    (procs,) = by_code(findings, "PF205")
    assert procs.status == Status.warn and "404 (python3)" in procs.message


def test_narrow_pcie_link_warns_but_idle_generation_does_not() -> None:
    narrow = check_one(variant(lambda f: f["gpu"]["devices"][0].update(pcie_width_current=8)))
    assert status_of(narrow, "PF404") == Status.warn
    idle = check_one(variant(lambda f: f["gpu"]["devices"][0].update(pcie_gen_current=1)))
    assert status_of(idle, "PF404") == Status.passed


def test_persistence_off_warns() -> None:
    findings = check_one(variant(lambda f: f["gpu"]["devices"][0].update(persistence_mode=False)))
    assert status_of(findings, "PF405") == Status.warn


def test_memlock_limited_with_infiniband_warns() -> None:
    def ib(facts: dict[str, Any]) -> None:
        facts["resources"]["memlock"] = 65536
        facts["net"]["infiniband"] = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                                       "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}]
    findings = check_one(variant(ib), "network.ib_hca=[mlx5_0,mlx5_1]")
    assert status_of(findings, "PF202") == Status.warn
    hcas = by_code(findings, "PF305")
    assert [(f.status, f.message.split()[0]) for f in hcas] == [(Status.passed, "mlx5_0"), (Status.fail, "mlx5_1")]


@pytest.mark.parametrize(("limit", "overrides", "status"), [
    (1024, (), Status.warn),  # systemd's default soft limit
    (4095, (), Status.warn),
    (4096, (), Status.passed),
    ("unlimited", (), Status.passed),
    (None, (), Status.warn),  # unreadable: said, and no more than a low limit
    (1024, ("thresholds.nofile_min=0",), Status.passed),  # the check turned off
])
def test_the_open_file_limit_warns_under_its_threshold(limit: int | str | None, overrides: tuple[str, ...], status: Status) -> None:
    (finding,) = by_code(check_one(variant(lambda f: f["resources"].update(nofile=limit)), *overrides), "PF208")
    assert finding.status == status, finding
    if status == Status.warn and limit is not None:
        assert finding.message.startswith(f"open-file limit {limit}, under 4096") and "ulimit -n" in finding.remedy


def test_facts_probed_before_the_open_file_limit_was_read_give_no_verdict_on_it() -> None:
    assert by_code(check_one(h100_facts()), "PF208") == []  # the recording has no nofile


def _ports(first: int, last: int, in_use: int = 0, reserved: int = 0) -> dict[str, int]:
    return {"first": first, "last": last, "reserved": reserved, "in_use": in_use}


EIGHT = ("training.nproc_per_node=8",)  # 8 NCCL ranks on the recorded host (torch 2.11): 2 + 8 x (1 + 1) = 18 ports
AGENT = "each with its store connection and 1 gloo listener(s) per group, and torchrun's agent"


@pytest.mark.parametrize(("ports", "torch", "overrides", "status", "message"), [
    (_ports(32768, 60999), None, EIGHT, Status.passed,
     f"local ports 32768-60999: 28232 free of 28232, at least 18 for 8 rank(s) here, {AGENT}"),
    (_ports(40000, 40017), None, EIGHT, Status.passed, "local ports 40000-40017: 18 free of 18, at least 18"),
    (_ports(40000, 40017, in_use=1), None, EIGHT, Status.warn, f"local ports 40000-40017: 17 free of 18, under 18: 8 rank(s) here, "
     f"{AGENT}, 1 gloo group(s) (thresholds.local_ports_gloo_groups)"),  # NCCL: only a gloo group it makes needs them
    (_ports(40000, 40099, reserved=90), None, EIGHT, Status.warn, "local ports 40000-40099: 10 free of 10 (90 reserved), under 18"),
    (_ports(40000, 40019), None, (*EIGHT, "thresholds.local_ports_gloo_groups=2"), Status.warn, "local ports 40000-40019: 20 free "
     "of 20, under 26"),  # two groups: 2 + 8 x (1 + 2)
    # torch 2.0's gloo binds a listener per peer: 2 + 8 x (1 + 7)
    (_ports(32768, 60999), "2.0.1+cu118", EIGHT, Status.passed, "local ports 32768-60999: 28232 free of 28232, at least 66"),
    (_ports(40000, 40059), "2.0.1+cu118", EIGHT, Status.warn, "local ports 40000-40059: 60 free of 60, under 66: 8 rank(s) here, "
     "each with its store connection and 7 gloo listener(s) per group (torch before 2.1: one per peer)"),
    # gloo on one host, 2 ranks (2 + 2 x 2); the range held by connections in TIME_WAIT fails it.
    (_ports(40000, 40005), None, ("training.backend=gloo",), Status.passed, "local ports 40000-40005: 6 free of 6, at least 6"),
    (_ports(40000, 40005, in_use=1), None, ("training.backend=gloo",), Status.fail, "local ports 40000-40005: 5 free of 6, under 6"),
    (_ports(40000, 40001, in_use=2), None, ("thresholds.local_ports_gloo_groups=0",), None, ""),  # the check turned off
    (None, None, (), Status.warn, "the local port range could not be read"),
])
def test_a_host_with_too_few_free_local_ports_for_its_ranks_listeners(ports: dict[str, int] | None, torch: str | None,
                                                                       overrides: tuple[str, ...], status: Status | None,
                                                                       message: str) -> None:
    def change(f: dict[str, Any]) -> None:
        f["resources"].update(local_ports=ports)
        if torch:
            f["torch"]["version"] = torch
    facts = variant(change)
    jsonschema.Draft202012Validator(load_schema("facts")).validate(facts)
    found = by_code(check_one(facts, *overrides), "PF310")
    if status is None:
        assert found == []
        return
    (finding,) = found
    assert finding.status == status and finding.message.startswith(message), finding
    if status != Status.passed and ports is not None:
        assert "ip_local_port_range" in finding.remedy and "bind: Address already in use" in finding.message


def test_facts_probed_before_the_local_ports_were_read_give_no_verdict_on_them() -> None:
    assert by_code(check_one(h100_facts()), "PF310") == []  # the recording has no local_ports


def _tmp(free: int, total: int = 50 << 30, free_inodes: int = 1 << 20, total_inodes: int = 3 << 20) -> dict[str, Any]:
    return {"path": "/tmp", "free_bytes": free, "total_bytes": total, "free_inodes": free_inodes, "total_inodes": total_inodes}


@pytest.mark.parametrize(("tmp", "overrides", "status", "message"), [
    (_tmp(20 << 30), (), Status.passed, "/tmp: 20GiB free of 50GiB"),
    (_tmp(1 << 30), (), Status.passed, "/tmp: 1GiB free of 50GiB"),  # the threshold itself has room
    (_tmp((1 << 30) - 1), (), Status.fail, "/tmp: 1024.0MiB free of 50GiB, under 1GiB (thresholds.tmp_min_free_bytes)"),
    (_tmp(0), (), Status.fail, "/tmp: 0B free of 50GiB, under 1GiB (thresholds.tmp_min_free_bytes)"),  # full
    (_tmp(512 << 20), ("thresholds.tmp_min_free_bytes=268435456",), Status.passed, "/tmp: 512MiB free of 50GiB"),
    (_tmp(0), ("thresholds.tmp_min_free_bytes=0",), Status.passed, "/tmp: 0B free of 50GiB"),  # the space test off
    (_tmp(20 << 30, free_inodes=1023), (), Status.fail, "/tmp: 1023 free inodes of 3145728"),
    (_tmp(20 << 30, free_inodes=1023), ("thresholds.tmp_min_free_bytes=0",), Status.fail, "/tmp: 1023 free inodes of 3145728"),
    (_tmp(0, total=0, free_inodes=0, total_inodes=0), (), Status.passed, "/tmp: a filesystem with no size to judge"),  # ramfs
    (None, (), Status.fail, "no temporary folder this user may write in ($TMPDIR, /tmp, /var/tmp, /usr/tmp)"),
])
def test_a_temporary_folder_without_room_fails(tmp: dict[str, Any] | None, overrides: tuple[str, ...], status: Status,
                                              message: str) -> None:
    facts = variant(lambda f: f["resources"].update(tmp=tmp))
    jsonschema.Draft202012Validator(load_schema("facts")).validate(facts)
    (finding,) = by_code(check_one(facts, *overrides), "PF209")
    assert (finding.status, finding.message) == (status, message), finding
    if status == Status.fail:
        assert "TMPDIR" in finding.remedy, finding


def test_facts_probed_before_the_temporary_folder_was_read_give_no_verdict_on_it() -> None:
    assert by_code(check_one(h100_facts()), "PF209") == []  # the recording has no tmp


def test_skip_checks_drops_codes() -> None:
    findings = check_one(variant(lambda f: f["resources"].update(dev_shm_bytes=64 << 20)), "playbook.skip_checks=[PF203]")
    assert not by_code(findings, "PF203")


# Cross-host: four hosts of cluster=prod, all the recorded H100 unless a test changes one.

def check_cluster(changes: dict[int, Any], *overrides: str) -> list[Finding]:
    cfg = config("cluster=prod", "cluster.hosts.0.gpus=1", "cluster.hosts.1.gpus=1",
                 "cluster.hosts.2.gpus=1", "cluster.hosts.3.gpus=1", *overrides)
    records = []
    for i, host in enumerate(cfg.cluster.hosts):
        facts = variant(changes[i]) if i in changes else h100_facts()
        records.append(HostRecord(host=host, facts=facts, clock_offset_s=(0.0, 0.05)))  # type: ignore[arg-type]
    return run_checks(records, cfg)


def test_identical_hosts_pass_cross_checks() -> None:
    findings = check_cluster({})
    cross = [f for f in findings if f.host == CLUSTER]
    assert {f.code for f in cross} == {"PF501", "PF502", "PF504", "PF505", "PF826", "PF863", "PF866", "PF867"}
    assert all(f.status == Status.passed for f in cross)


def test_version_drift_fails_the_odd_host() -> None:
    """Three hosts of four agree: the fourth is the fault, failed itself, so that emit-launch can leave it out."""
    findings = check_cluster({2: lambda f: f["torch"].update(version="2.10.0+cu130")})
    (drift,) = [f for f in by_code(findings, "PF501") if f.status == Status.fail]
    assert drift.host == "node03" and drift.message == "torch differs: node03 has 2.10.0+cu130; the other 3 have 2.11.0+cu130"


def test_gpu_count_drift() -> None:
    findings = check_cluster({1: lambda f: f["gpu"]["devices"].append(dict(f["gpu"]["devices"][0], index=1))})
    (drift,) = [f for f in by_code(findings, "PF502") if f.status == Status.fail]
    assert "node02 has 2" in drift.message


def test_mtu_drift() -> None:
    def jumbo(facts: dict[str, Any]) -> None:
        next(i for i in facts["net"]["interfaces"] if i["name"] == "eth0")["mtu"] = 9000
    findings = check_cluster({3: jumbo}, "network.socket_ifname=eth0")
    (drift,) = by_code(findings, "PF503")
    assert (drift.status, drift.host) == (Status.fail, "node04") and "node04 has 9000" in drift.message


def addressed(mac: str, *ipv4: str) -> Any:
    """The recorded host with its eth0 given a MAC and addresses (the recording's eth0 has none)."""
    def change(facts: dict[str, Any]) -> None:
        next(i for i in facts["net"]["interfaces"] if i["name"] == "eth0").update(mac=mac, ipv4=list(ipv4))
    return change


def test_one_machine_listed_twice_fails_each_later_listing() -> None:
    own = {i: addressed(f"02:fc:00:00:00:0{i + 1}", f"10.1.0.1{i + 1}/24") for i in range(4)}
    (each,) = by_code(check_cluster(own), "PF506")
    assert (each.host, each.status) == (CLUSTER, Status.passed)
    assert each.message == "4 hosts, each its own machine (no interface of one is another's)"
    # node04's address is one node02 also holds: its interface is node02's, MAC and addresses
    twice = {**own, 1: addressed("02:fc:00:00:00:02", "10.1.0.12/24", "10.1.0.99/24"),
             3: addressed("02:fc:00:00:00:02", "10.1.0.12/24", "10.1.0.99/24")}
    (repeat,) = by_code(check_cluster(twice), "PF506")
    assert (repeat.host, repeat.status) == ("node04", Status.fail)
    assert repeat.message == ("node04 (node04.cluster.internal) is the machine node02 is: both answer with eth0 02:fc:00:00:00:02 "
                              "(10.1.0.12/24, 10.1.0.99/24)")
    # one MAC with other addresses (a MAC cloned with a VM image), or one address behind other MACs: not one machine
    for other in (addressed("02:fc:00:00:00:02", "10.1.0.14/24"), addressed("02:fc:00:00:00:09", "10.1.0.12/24")):
        assert [f.status for f in by_code(check_cluster({**own, 3: other}), "PF506")] == [Status.passed]


def drift_of(mtus: dict[str, int]) -> list[tuple[str, Status, str]]:
    return [(f.host, f.status, f.message) for f in same_everywhere("PF503", "socket interface MTU", mtus, "set one MTU")]


def test_a_drift_a_majority_pins_fails_each_odd_host() -> None:
    assert drift_of({"a": 1500, "b": 1500, "c": 1200, "d": 1500}) == [
        ("c", Status.fail, "socket interface MTU differs: c has 1200; the other 3 have 1500")]
    assert drift_of({"a": 1500, "b": 9000, "c": 1500, "d": 1500, "e": 1000}) == [
        ("b", Status.fail, "socket interface MTU differs: b has 9000; 3 of the 5 hosts have 1500"),
        ("e", Status.fail, "socket interface MTU differs: e has 1000; 3 of the 5 hosts have 1500")]


@pytest.mark.parametrize("mtus", [{"a": 1500, "b": 1400}, {"a": 1500, "b": 1500, "c": 9000, "d": 9000},
                                  {"a": 1500, "b": 1500, "c": 9000, "d": 1400}])
def test_a_drift_without_a_majority_stays_on_the_cluster(mtus: dict[str, int]) -> None:
    """Two hosts, an even split, or no value most hosts share: nothing says which side is the fault."""
    ((host, status, message),) = drift_of(mtus)
    assert (host, status) == (CLUSTER, Status.fail) and message.startswith("socket interface MTU differs: ")


def test_no_drift_passes_on_the_cluster() -> None:
    assert drift_of(dict.fromkeys("abc", 1500)) == [(CLUSTER, Status.passed, "socket interface MTU: 1500 on all 3 hosts")]


def test_nccl_env_drift_warns() -> None:
    findings = check_cluster({0: lambda f: f["nccl"]["env"].update(NCCL_IB_DISABLE="1")})
    (drift,) = by_code(findings, "PF504")
    assert drift.status == Status.warn and "NCCL_IB_DISABLE: node01=1" in drift.message


def test_clock_skew_beyond_round_trip_warns() -> None:
    cfg = config("cluster=prod")
    records = [HostRecord(host=h, facts=h100_facts(), clock_offset_s=(0.0, 0.1)) for h in cfg.cluster.hosts]  # type: ignore[arg-type]
    records[1] = HostRecord(host=records[1].host, facts=records[1].facts, clock_offset_s=(5.0, 5.1))
    (skew,) = by_code(run_checks(records, cfg), "PF505")
    assert skew.status == Status.warn and "node02 +5.0s" in skew.message
    # A wide round trip that could explain the offset is not skew.
    records[1] = HostRecord(host=records[1].host, facts=records[1].facts, clock_offset_s=(-0.5, 5.0))
    (skew,) = by_code(run_checks(records, cfg), "PF505")
    assert skew.status == Status.passed


def test_every_emitted_code_is_declared() -> None:
    """Run a spread of variants and make sure no check emits a code it did not register."""
    emitted: set[str] = set()
    for findings in (
        check_one(h100_facts()), check_one(variant(_no_driver), "training.backend=nccl"),
        check_cluster({2: lambda f: f["torch"].update(version="2.10.0")}, "network.socket_ifname=eth0", "network.mtu=1500"),
    ):
        emitted |= {f.code for f in findings}
    assert emitted <= all_codes()


def _cpus(cpus: int | None, quota: float | None):  # type: ignore[no-untyped-def]
    return lambda f: f["resources"].update(cpus=cpus, cpu_quota=quota)


def test_a_host_held_to_a_fraction_of_a_cpu_by_its_quota_fails_and_no_other() -> None:
    """8 ranks a host: node02's container limited to 4 CPUs is under one per rank and under half what the median host
    gets (31: 32, 32, 30 and 4); node03's limit of 30 is above both floors; node01 and node04 have no quota."""
    findings = check_cluster({0: _cpus(32, None), 1: _cpus(32, 4.0), 2: _cpus(32, 30.0), 3: _cpus(32, None)},
                             "training.nproc_per_node=8")
    failed = [f for f in by_code(findings, "PF206") if f.status == Status.fail]
    assert [f.host for f in failed] == ["node02"]
    assert "allows 4 CPU(s): less than one CPU for each of its 8 rank(s) and under 0.5 of the 31 CPU(s)" in failed[0].message
    (summary,) = [f for f in by_code(findings, "PF206") if f.host == CLUSTER]
    assert summary.status == Status.passed and "4 host(s), 2 under a quota" in summary.message


def test_a_quota_only_the_relative_floor_catches_and_hosts_that_differ_in_cores_alone() -> None:
    """10 CPUs of quota for 8 ranks clear the per-rank floor but not half the median host's 24 (32, 32, 16 and 10); a
    host with 16 cores and no quota is a smaller machine, not a throttled one: PF206 judges quotas only. With the
    fraction at 0, only the per-rank floor, which 10 CPUs clear."""
    changes = {0: _cpus(32, None), 1: _cpus(32, 10.0), 2: _cpus(16, None), 3: _cpus(32, None)}
    failed = [f.host for f in by_code(check_cluster(changes, "training.nproc_per_node=8"), "PF206") if f.status == Status.fail]
    assert failed == ["node02"]
    relaxed = check_cluster(changes, "training.nproc_per_node=8", "thresholds.cpu_quota_min_fraction=0")
    assert not [f for f in by_code(relaxed, "PF206") if f.status == Status.fail]


def test_facts_without_cpu_figures_give_no_cpu_quota_finding() -> None:
    """Facts recorded before the probe read CPUs and quotas (the H100 recording) are judged as before."""
    assert not by_code(check_cluster({}), "PF206")
