"""The storage stage on the namespace cluster, with real mounts: one cluster of five hosts and four folders of this
machine, each folder with its own fault on another host, checked in one run; then the same run interrupted.

- ``shared``, a plain folder every host sees (the namespaces share this machine's ext4), except h2, which has its own
  tmpfs mounted over it: a host on another filesystem where the path is shared (PF907);
- ``data``, bound read-only on h3 (PF903);
- ``scratch``, a 1 MiB tmpfs of h4's own, which the test's 4 MiB fill (PF904);
- ``private``, root's with mode 0700: every host logs in as root except h3, whose own /etc/passwd has a training user
  ``trainer`` (uid 4242) that the cluster config logs in as (PF902, as trainer);
- every path read at a tenth of the others' speed or less on h5, whose processes a block I/O cgroup (cgroup v1 blkio)
  limits to 16 MiB/s on this machine's disk (the read is O_DIRECT, so it reaches the disk): a slow host (PF909). A
  throttled disk rather than a throttled CPU: a CPU quota slows the host's python and probe as much as its I/O, and an
  8 MiB write is a few milliseconds of CPU, which a quota may or may not cut into.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import preflight_exe, skip_or_fail
from test_cluster import Cluster

from preflight.errors import EnvironmentProblem, InputError
from preflight.sandbox import HostMount, HostQuirks
from preflight.sandbox.layout import validate

pytestmark = pytest.mark.sandbox

SLOW_BPS = 16 << 20
WRITE = 4 << 20  # each host's test file: 4 MiB, four times the tiny tmpfs


@pytest.fixture(scope="module")
def folders() -> Iterator[Path]:
    # Under /tmp, not pytest's own folder (mode 0700): the training user must reach the folders.
    base = Path(tempfile.mkdtemp(prefix="preflight-storage-test-", dir="/tmp"))
    base.chmod(0o755)
    for name in ("shared", "data", "scratch"):
        (base / name).mkdir(mode=0o1777)
        (base / name).chmod(0o1777)
    (base / "private").mkdir(mode=0o700)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(sandbox_factory: Any, folders: Path, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    quirks = {
        2: HostQuirks(mounts=(HostMount(str(folders / "shared"), "tmpfs"),)),
        3: HostQuirks(user="trainer", python="/usr/bin/python3", mounts=(HostMount(str(folders / "data"), "read-only"),)),
        4: HostQuirks(mounts=(HostMount(str(folders / "scratch"), "tmpfs", size_bytes=1 << 20),)),
    }
    sandbox = sandbox_factory(5, quirks=quirks)
    try:
        sandbox.throttle_io("h5", str(folders), SLOW_BPS)
    except EnvironmentProblem as e:
        skip_or_fail(str(e))
    return Cluster(sandbox, tmp_path_factory.mktemp("storage5"), "store5")


def paths_override(folders: Path) -> str:
    entries = [f"{{path: {folders / 'shared'}, shared: true, write_bytes: {WRITE}}}"]
    entries += [f"{{path: {folders / name}, write_bytes: {WRITE}}}" for name in ("data", "scratch", "private")]
    return f"storage.paths=[{', '.join(entries)}]"


def findings(report: dict[str, Any], code: str) -> dict[str, dict[str, Any]]:
    """The host -> finding of one code that did not pass, one per host expected."""
    found: dict[str, dict[str, Any]] = {}
    for f in report["findings"]:
        if f["code"] == code and f["status"] != "pass":
            assert f["host"] not in found, (code, f, found)
            found[f["host"]] = f
    return found


def test_every_fault_is_named_with_its_host_and_cause(cluster: Cluster, folders: Path) -> None:
    report, _elapsed, _ = cluster.check(paths_override(folders), "ssh.command_timeout_s=30", playbook="storage", timeout=180)
    assert report["status"] == "fail" and report["schema"] == 8
    by_path = {p["path"]: p for p in report["storage"]["paths"]}
    shared, data, scratch, private = (by_path[str(folders / n)] for n in ("shared", "data", "scratch", "private"))

    not_shared = findings(report, "PF907")
    assert list(not_shared) == ["h2"] and not_shared["h2"]["status"] == "fail", report["findings"]
    assert "tmpfs" in not_shared["h2"]["message"] and "reads the files of h2, and they of h1, h3, h4, h5" in not_shared["h2"]["message"]
    assert shared["groups"] == [["h1", "h3", "h4", "h5"], ["h2"]]
    assert {h["host"]: h["sees"] for h in shared["hosts"]}["h1"] == ["h1", "h3", "h4", "h5"]

    read_only = findings(report, "PF903")
    assert list(read_only) == ["h3"] and str(folders / "data") in read_only["h3"]["message"]

    full = findings(report, "PF904")
    assert list(full) == ["h4"] and "filled up writing 4MiB" in full["h4"]["message"] and "ENOSPC" in full["h4"]["message"]

    denied = findings(report, "PF902")
    assert list(denied) == ["h3"]
    assert denied["h3"]["message"].startswith(f"{folders / 'private'} is not writable as trainer (uid 4242): create: Permission denied")
    assert "the folder is root's, mode 0700" in denied["h3"]["message"]

    # The paths h5 is named slow on, by its write or its read: both reach the throttled disk (the write is fsynced, the
    # read O_DIRECT), but every host shares this machine's one disk, which the other work unit loads too, so on a given
    # path h5 may not stand out from a host the load stalled. It must stand out on one; a healthy host may stall once, so
    # only h5 is asserted.
    slow = {f["message"].split(" is slow", 1)[0] for f in report["findings"] if f["code"] == "PF909" and f["host"] == "h5"}
    assert slow and slow <= {str(folders / n) for n in ("shared", "data", "scratch", "private")}, report["findings"]
    hosts = {h["host"]: h for h in data["hosts"]}
    assert hosts["h1"]["fstype"] == "ext4" and hosts["h1"]["read_uncached"] == "direct" and hosts["h3"]["read_only"] is True
    assert hosts["h3"]["user"] == "trainer" and hosts["h3"]["uid"] == 4242 and hosts["h1"]["user"] == "root"
    statuses = {h["host"]: h["status"] for h in private["hosts"]}
    assert statuses.pop("h3") == "fail" and statuses.pop("h5") == "warn" and set(statuses.values()) <= {"pass", "warn"}
    assert {h["host"]: h["fstype"] for h in scratch["hosts"]}["h4"] == "tmpfs"
    # Nothing of the test is left in any folder, on any host's view of it.
    for name in ("shared", "data", "scratch", "private"):
        assert os.listdir(folders / name) == []
        for host in ("h2", "h4"):
            listing = cluster.sandbox.run_in(host, ["ls", "-A", str(folders / name)])
            assert listing.returncode == 0 and listing.stdout == "", (host, name, listing)
    cluster.assert_nothing_left()


def test_sigint_during_the_storage_test_leaves_no_file_on_any_host(cluster: Cluster, folders: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = subprocess.Popen([preflight_exe(), "check", "--config-dir", str(cluster.folder / "conf"), f"cluster={cluster.name}",
                            "playbook=storage", f"state_dir={state}", "ssh.command_timeout_s=30", paths_override(folders)],
                           cwd=cluster.folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # h5 reads and writes at 16 MiB/s: the healthy hosts' markers wait for it in the shared folder for seconds.
    give_up = time.monotonic() + 90
    while not any(name.endswith(".marker") for name in os.listdir(folders / "shared")):
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < give_up, "no marker in the shared folder within 90 s"
        time.sleep(0.01)
    run.send_signal(signal.SIGINT)
    _out, err = run.communicate(timeout=30)
    assert run.returncode == 130, err
    assert "interrupted by SIGINT during storage (the storage test of 4 path(s) on 5 hosts); cleaned up all 5 hosts" in err
    assert re.search(r"removed \d+ storage test files?\)", err), err
    assert not state.exists() or not any(p.is_file() for p in state.rglob("*"))
    for name in ("shared", "data", "scratch", "private"):
        for host in ("h1", "h2", "h4"):  # this machine's view, and h2's and h4's own tmpfs
            listing = cluster.sandbox.run_in(host, ["ls", "-A", str(folders / name)])
            assert listing.returncode == 0 and listing.stdout == "", (host, name, listing)
    cluster.assert_nothing_left()


@pytest.mark.parametrize(("quirks", "message"), [
    (HostQuirks(user="root"), "user 'root' of host 1 must be a lowercase user name other than root"),
    (HostQuirks(user="Bad;name"), "user 'Bad;name' of host 1 must be a lowercase user name other than root"),
    (HostQuirks(mounts=(HostMount("relative", "tmpfs"),)), "must be tmpfs or read-only on a folder, not 'relative'"),
    (HostQuirks(mounts=(HostMount("/no/such/folder", "read-only"),)), "must be tmpfs or read-only on a folder, not '/no/such/folder'"),
    (HostQuirks(mounts=(HostMount("/tmp", "tmpfs", size_bytes=100),)), "the tmpfs of host 1 at /tmp must be at least 4096 bytes"),
])
def test_bad_storage_quirks_are_input_errors(quirks: HostQuirks, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        validate(2, "pt", 256, {1: quirks}, "h")
