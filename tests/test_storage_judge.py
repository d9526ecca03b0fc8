"""The storage stage's judgement on the real output of preflight/storage/probe.py (tests/data/storage, see its README),
the report's storage section (schema 6) in JSON, the terminal and HTML, and the reaper's removal of the stage's files."""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
from conftest import skip_or_fail
from prometheus_client.parser import text_string_to_metric_families
from recorded import DATA
from rich.console import Console

from preflight import bundle
from preflight.catalogue import explain
from preflight.compose import load_spec
from preflight.findings import CLUSTER, Finding, Status
from preflight.prometheus import metrics_text
from preflight.report import REPORT_SCHEMA_VERSION, render
from preflight.report_html import report_html
from preflight.resources import load_schema
from preflight.spec import PreflightConfig, StoragePath
from preflight.storage.contracts import StorageSection
from preflight.storage.judge import StorageRun, judge_storage, size
from preflight.storage.probe import mount_of
from preflight.storage.wire import StorageProbeOutput
from preflight.transport import CommandResult
from preflight.transport.reap import REAPER, TAG_VARIABLE, read_cleanup

RECORDED = DATA / "storage"
PATHS = ["/data/ckpt", "/data/ro", "/data/tiny", "/data/private", "/data/missing", "/data/afile"]


def recorded(name: str) -> StorageProbeOutput:
    return cast(StorageProbeOutput, json.loads((RECORDED / f"{name}.json").read_text()))


def as_host(output: StorageProbeOutput, host: str) -> StorageProbeOutput:
    """A recording as another host's: only its name changes."""
    copied = copy.deepcopy(output)
    copied["host"] = host
    return copied


@pytest.fixture(scope="module")
def config() -> PreflightConfig:
    entries = ", ".join(f"{{path: {p}, shared: {str(p == '/data/ckpt').lower()}, write_bytes: 4194304}}" for p in PATHS)
    return load_spec([f"storage.paths=[{entries}]"]).config


def judged(config: PreflightConfig, run: StorageRun, paths: list[StoragePath] | None = None) -> tuple[list[Finding], Any]:
    return judge_storage(run, paths if paths is not None else config.storage.paths, config)


def by_code(findings: list[Finding], path: str) -> dict[tuple[str, str], Finding]:
    return {(f.code, f.host): f for f in findings if f.message.startswith(path) and f.status != Status.passed}


def two_hosts() -> StorageRun:
    """The recorded pair: h1 as root, h2 as nobody, in one folder /data/ckpt; h2 reads what h1 read (recorded)."""
    (read,) = recorded("read-h1")["markers"]
    return StorageRun(hosts=["h1", "h2"], written={"h1": recorded("write-root"), "h2": recorded("write-nobody")}, problems={},
                      seen={read["path"]: {"h1": read["seen"], "h2": list(read["seen"])}})


def test_each_recorded_fault_is_named_on_its_host(config: PreflightConfig) -> None:
    findings, sections = judged(config, two_hosts())
    assert by_code(findings, "/data/ckpt ") == {}
    assert ("PF906", CLUSTER) in {(f.code, f.host) for f in findings if f.status == Status.passed}
    read_only = by_code(findings, "/data/ro")
    assert set(read_only) == {("PF903", "h1"), ("PF903", "h2")}
    assert read_only[("PF903", "h1")].message == "/data/ro is on a read-only mount (ext4 /dev/vda)"
    full = by_code(findings, "/data/tiny")
    assert set(full) == {("PF904", "h1"), ("PF904", "h2")}
    assert full[("PF904", "h1")].message == "/data/tiny filled up writing 4MiB: write: No space left on device (ENOSPC)"
    denied = by_code(findings, "/data/private")
    assert set(denied) == {("PF902", "h2")}  # root writes anywhere on ext4; nobody is refused
    assert denied[("PF902", "h2")].message == ("/data/private is not writable as nobody (uid 65534): create: Permission denied (EACCES); "
                                               "the folder is root's, mode 0700")
    assert by_code(findings, "/data/missing")[("PF901", "h1")].message == "/data/missing is missing"
    assert by_code(findings, "/data/afile")[("PF901", "h2")].message == "/data/afile is not a folder"
    ckpt = sections[0]
    assert ckpt["groups"] == [["h1", "h2"]] and [h["sees"] for h in ckpt["hosts"]] == [["h1", "h2"], ["h1", "h2"]]
    assert [(h["user"], h["uid"], h["fstype"], h["read_uncached"]) for h in ckpt["hosts"]] == [
        ("root", 0, "ext4", "direct"), ("nobody", 65534, "ext4", "direct")]
    assert ckpt["write_spread"]["count"] == 2 and ckpt["write_spread"]["threshold_GBps"] is None  # two figures name no one


def test_a_host_that_reads_only_its_own_marker_is_on_another_filesystem(config: PreflightConfig) -> None:
    run = StorageRun(hosts=["h1", "h2", "h3"], written={"h1": recorded("write-root"), "h2": as_host(recorded("write-root"), "h2"),
                                                        "h3": recorded("write-nobody")}, problems={},
                     seen={"/data/ckpt": {"h1": ["h1", "h3"], "h2": ["h2"], "h3": ["h1", "h3"]}})
    run.written["h2"]["paths"][0]["source"] = "/dev/nvme0n1p1"  # h2's own disk, where h1 and h3 share /dev/vda
    findings, sections = judged(config, run)
    (finding,) = [f for f in findings if f.code == "PF906" and f.status == Status.fail]
    assert finding.host == "h2"
    assert finding.message == ("/data/ckpt on h2 is another filesystem (ext4 /dev/nvme0n1p1) than on h1, h3 (ext4 /dev/vda): "
                               "h2 reads the files of h2, and they of h1, h3")
    assert sections[0]["groups"] == [["h1", "h3"], ["h2"]]


def test_a_tmpfs_where_a_shared_path_is_expected(config: PreflightConfig) -> None:
    alone = StorageRun(hosts=["h1"], written={"h1": recorded("write-root")}, problems={}, seen={"/data/ckpt": {"h1": ["h1"]}})
    alone.written["h1"]["paths"][0].update(fstype="overlay", source="overlay")  # a container's own root
    (finding,) = [f for f in judged(config, alone)[0] if f.code == "PF907"]
    assert (finding.status, finding.host) == (Status.warn, "h1")
    assert "is overlay overlay, a filesystem of this host alone" in finding.message and "one host cannot show" in finding.message
    assert "tmpfs or overlay" in explain("PF907")


def test_shared_but_mounted_from_different_sources_warns(config: PreflightConfig) -> None:
    run = two_hosts()
    run.written["h2"]["paths"][0]["source"] = "nfs1.example:/export/ckpt"
    run.written["h1"]["paths"][0]["source"] = "10.0.0.5:/export/ckpt"
    (finding,) = [f for f in judged(config, run)[0] if f.code == "PF908"]
    assert finding.status == Status.warn and finding.host == CLUSTER
    assert "h1: ext4 10.0.0.5:/export/ckpt; h2: ext4 nfs1.example:/export/ckpt" in finding.message


def test_free_space_and_inodes_against_their_minimums(config: PreflightConfig) -> None:
    run = two_hosts()
    run.written["h1"]["paths"][0]["free_inodes"] = 12
    entry = StoragePath(path="/data/ckpt", shared=True, min_free_bytes=100 << 40, write_bytes=4 << 20)
    findings = by_code(judged(config, run, [entry])[0], "/data/ckpt")
    assert findings[("PF905", "h1")].message == "/data/ckpt has 12 free inodes of 16777216"
    assert findings[("PF904", "h2")].message.startswith("/data/ckpt has 78.0GiB free of 252.0GiB, less than the 100TiB asked")
    assert size(8 << 20) == "8MiB" and size(1536) == "1.5KiB" and size(None) == "unknown"


def test_a_path_behind_a_closed_folder_cannot_be_reached_as_the_user(config: PreflightConfig) -> None:
    run = two_hosts()
    report = run.written["h2"]["paths"][0]
    # As storage/probe.py fills it when stat is refused.
    report.update(exists=False, is_dir=False, error="stat: Permission denied", fstype=None, test=None, marker=False)
    (finding,) = by_code(judged(config, run, [config.storage.paths[0]])[0], "/data/ckpt").values()
    assert (finding.code, finding.host) == ("PF902", "h2")
    assert finding.message == "/data/ckpt cannot be reached as nobody (uid 65534): stat: Permission denied"


def test_a_slow_host_is_named_by_the_bandwidth_rule(config: PreflightConfig) -> None:
    hosts = [f"h{k}" for k in range(1, 6)]
    run = StorageRun(hosts=hosts, written={h: as_host(recorded("write-root"), h) for h in hosts}, problems={},
                     seen={"/data/ckpt": {h: hosts for h in hosts}})
    for k, host in enumerate(hosts):  # the recorded timings, a little apart, and h4 reading at a twentieth of the speed
        test = run.written[host]["paths"][0]["test"]
        assert test is not None
        test["write_s"], test["read_s"] = 0.004 * (1 + k / 10), 0.006 * (1 + k / 10) * (20 if host == "h4" else 1)
    findings, sections = judged(config, run, [config.storage.paths[0]])
    (slow,) = [f for f in findings if f.code == "PF909"]
    assert (slow.host, slow.status) == ("h4", Status.warn)
    assert slow.message.endswith(" read 0.027 GB/s against the median 0.583 GB/s of 5 hosts")
    assert sections[0]["read_spread"]["count"] == 5 and sections[0]["write_spread"]["threshold_GBps"] is not None


def test_a_host_without_an_answer_is_unknown(config: PreflightConfig) -> None:
    run = StorageRun(hosts=["h1", "h2"], written={"h1": recorded("write-root")}, problems={"h2": "timed out after 30 s"})
    findings, sections = judged(config, run, [config.storage.paths[1]])
    (unknown,) = [f for f in findings if f.status == Status.unknown]
    assert unknown.code == "PF910" and unknown.host == "h2" and "timed out after 30 s" in unknown.message
    assert sections[0]["hosts"][1]["status"] == "unknown" and sections[0]["hosts"][1]["fstype"] is None


def test_a_host_whose_read_round_did_not_answer_is_unknown_and_not_grouped(config: PreflightConfig) -> None:
    run = two_hosts()
    del run.seen["/data/ckpt"]["h2"]
    run.unread = {"h2": "timed out after 30 s"}
    findings, sections = judged(config, run, [config.storage.paths[0]])
    (unknown,) = [f for f in findings if f.status == Status.unknown]
    assert (unknown.code, unknown.host) == ("PF910", "h2")
    assert unknown.message == "/data/ckpt: no answer from the read round: timed out after 30 s"
    assert sections[0]["groups"] == [["h1"]]
    # h1 read h2's file: one filesystem, shown from one side.
    (shared,) = [f.message for f in findings if f.code == "PF906"]
    assert shared == "/data/ckpt is one filesystem: 1 host(s) read the files of all 2 that wrote one"


def test_a_host_whose_file_the_others_cannot_read_is_apart_even_unheard(config: PreflightConfig) -> None:
    run = StorageRun(hosts=["h1", "h2", "h3"], written={h: as_host(recorded("write-root"), h) for h in ("h1", "h2", "h3")}, problems={},
                     seen={"/data/ckpt": {"h1": ["h1", "h2"], "h2": ["h1", "h2"]}}, unread={"h3": "timed out after 30 s"})
    findings, _ = judged(config, run, [config.storage.paths[0]])
    apart = [f for f in findings if f.code == "PF906" and f.status == Status.fail]
    assert [(f.host, f.message) for f in apart] == [("h3", "/data/ckpt on h3 is another filesystem (ext4 /dev/vda) than on h1, h2 "
                                                           "(ext4 /dev/vda): they cannot read its file (they read those of h1, h2)")]
    assert {(f.code, f.host) for f in findings if f.status == Status.unknown} == {("PF910", "h3")}


def test_mount_of_takes_the_longest_mount_point_and_the_last_stacked() -> None:
    mountinfo = ("22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
                 "30 22 0:40 / /ckpt rw - nfs4 fs1:/export rw\n"
                 "31 30 0:41 / /ckpt rw - tmpfs tmpfs rw\n"
                 "32 22 0:42 / /ckpt\\040two ro - xfs /dev/sdb ro\n")
    assert mount_of("/ckpt/run1", mountinfo) == ("tmpfs", "tmpfs", "/ckpt")
    assert mount_of("/ckpt two/x", mountinfo) == ("xfs", "/dev/sdb", "/ckpt two")
    assert mount_of("/ckpt2", mountinfo) == ("ext4", "/dev/vda", "/")


def test_the_storage_section_in_a_schema_6_report(config: PreflightConfig) -> None:
    findings, sections = judged(config, two_hosts())
    storage: StorageSection = {"timeout_s": 30.0, "elapsed_s": 0.4, "paths": sections}
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA_VERSION, "preflight_version": "0", "created_at": "2026-11-25T17:00:00+00:00", "elapsed_s": 1.0,
        "cluster": "prod", "playbook": "storage", "spec_digest": "0" * 64, "config_digests": {}, "status": "fail", "exit_code": 1,
        "hosts": [], "findings": [f.to_json() for f in findings], "collective": None, "connectivity": None, "dcgm": None,
        "storage": storage}
    assert REPORT_SCHEMA_VERSION == 8
    jsonschema.validate(report, load_schema("report"))
    broken = copy.deepcopy(report)
    broken["storage"]["paths"][0]["hosts"][0]["write_MBps"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, load_schema("report"))
    out = io.StringIO()
    Console(file=out, width=200).print(render(report))  # type: ignore[arg-type]
    text = out.getvalue()
    assert "storage /data/ckpt (shared, 4MiB per host)" in text and "storage /data/ro (4MiB per host)" in text
    assert "ext4 /dev/vda" in text and "78.0GiB" in text and "write: median over 2 hosts" in text
    page = report_html(report)  # type: ignore[arg-type]
    assert '<h2 id="storage">Storage</h2>' in page and "<h3>/data/ckpt</h3>" in page and "hosts by whose files they read: h1, h2" in page
    assert "Permission denied (EACCES)" in page
    metrics = {(m.name, tuple(sorted(sample.labels.items()))): sample.value
               for m in text_string_to_metric_families(metrics_text(report, "check")) for sample in m.samples}  # type: ignore[arg-type]
    labels = (("cluster", "prod"), ("command", "check"), ("host", "h2"), ("path", "/data/ckpt"))
    assert metrics[("preflight_storage_free_bytes", labels)] == sections[0]["hosts"][1]["free_bytes"]
    assert metrics[("preflight_storage_write_bytes_per_second", labels)] == pytest.approx(4194304 / 0.00354, rel=1e-3)
    assert ("preflight_storage_read_bytes_per_second", (*labels[:3], ("path", "/data/ro"))) not in metrics  # read-only: no figure


def test_a_filesystem_without_o_direct_is_read_after_fadvise_and_not_judged_full(config: PreflightConfig, tmp_path: Path) -> None:
    """A real ramfs, mounted in a mount namespace of the test's own: it refuses O_DIRECT and counts no blocks."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a ramfs mount needs root and unshare")
    probe = {"host": "h1", "round": "write", "nonce": "n", "hosts": ["h1"], "deadline_s": 15,
             "paths": [{"path": "/mnt/ram", "shared": False, "write_bytes": 1 << 20}]}
    script_file = tmp_path / "storage.py"
    script_file.write_text(bundle.text(bundle.STORAGE), encoding="utf-8")  # the bundle hosts get
    script = 'd=$(mktemp -d) && mount -t ramfs ramfs "$d" && exec python3 - "$(echo "$1" | sed "s#/mnt/ram#$d#")" < "$2"'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", json.dumps(probe),
                           str(script_file)], capture_output=True, text=True, timeout=60, check=True)
    output = cast(StorageProbeOutput, json.loads(done.stdout))
    (report,) = output["paths"]
    assert (report["fstype"], report["total_bytes"]) == ("ramfs", 0)
    assert report["test"] is not None and report["test"]["ok"] and report["test"]["uncached"] == "fadvise"
    output["host"] = "h1"
    entry = StoragePath(path=report["path"], shared=False, min_free_bytes=1 << 30, write_bytes=1 << 20)
    findings, _ = judged(config, StorageRun(hosts=["h1"], written={"h1": output}, problems={}), [entry])
    assert [(f.code, f.status) for f in findings] == [("PF902", Status.passed)]


def test_the_reaper_removes_the_runs_files_in_the_folders_given(tmp_path: Path) -> None:
    for name in (".preflight-run1-ab-h1.marker", ".preflight-run1-ab-h2.probe", ".preflight-run2-cd-h1.marker", "checkpoint.pt"):
        (tmp_path / name).write_text("x")
    result = subprocess.run(["sh", "-c", REAPER, "sh", "run1", TAG_VARIABLE, str(tmp_path), str(tmp_path / "absent")],
                            capture_output=True, text=True, timeout=30, check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".preflight-run2-cd-h1.marker", "checkpoint.pt"]
    assert "files 2" in result.stdout.splitlines()
    assert read_cleanup(CommandResult("h1", True, 0, result.stdout)).files == 2
