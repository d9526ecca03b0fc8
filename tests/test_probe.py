"""The probe, run for real on this machine the way the transport runs it, and its pure conversions.

Every expectation is read independently of the probe (socket, os, /sys, the `ip` command, torch's own metadata), so a
probe that reads the wrong thing fails here. The NVML and nvidia-smi paths need a GPU; on this machine only their pure
conversions are tested, and the GPU-marked test checks the real thing on a GPU host.
"""

from __future__ import annotations

import ast
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from conftest import SandboxFactory, skip_or_fail
from recorded import H100, h100_facts

from preflight import bundle

probe = bundle.load(bundle.FACTS)  # the facts probe as hosts get it, loaded as a module

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "preflight" / "schemas" / "facts.schema.json").read_text())
SOURCE = bundle.text(bundle.FACTS)


def run_probe(*python_args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
              python: str = sys.executable, within: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """Run the probe as the transport does (`python -` with the script on stdin), under the command within if any
    (`ip netns exec NAME`): its facts and its stderr."""
    done = subprocess.run([*within, python, *python_args, "-"], input=SOURCE, capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.endswith("\n"), "exactly one line of JSON"
    facts = json.loads(done.stdout)
    jsonschema.Draft202012Validator(SCHEMA).validate(facts)
    return facts, done.stderr


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    """This machine's facts, probed once through stdin."""
    return run_probe()[0]


def has_nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver, judged without the probe."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


# ---------------------------------------------------------------------------------------------------------------------
# The schema itself


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_schema_accepts_the_real_h100_recording() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from recorded import h100_facts
    finally:
        sys.path.pop(0)
    jsonschema.Draft202012Validator(SCHEMA).validate(h100_facts())


@pytest.mark.parametrize("path, bad", [
    (("gpu", "source"), "cuda"),
    (("resources", "memlock"), "infinite"),
    (("resources", "memlock"), -1),
    (("probe", "schema"), 1),  # facts of schema 1 lack the kernel log, fabric and topology
    (("torch", "version"), 2.11),
    (("host", "resolves_to"), None),
])
def test_schema_rejects_what_facts_py_forbids(facts: dict[str, Any], path: tuple[str, str], bad: object) -> None:
    broken = json.loads(json.dumps(facts))
    broken[path[0]][path[1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(broken)


def test_schema_rejects_unknown_keys(facts: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(facts))
    broken["net"]["interfaces"][0]["ipv6"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(broken)


# ---------------------------------------------------------------------------------------------------------------------
# Running the probe


def test_runs_as_a_file_too(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(SOURCE, encoding="utf-8")
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(done.stdout))


def test_host(facts: dict[str, Any]) -> None:
    host = facts["host"]
    assert host["hostname"] == socket.gethostname()
    assert host["fqdn"] == socket.getfqdn(socket.gethostname())
    try:
        expected = list(dict.fromkeys(i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, 0, socket.SOCK_STREAM)))
    except socket.gaierror:
        expected = []
    assert host["resolves_to"] == expected
    assert (host["resolve_error"] is None) == bool(expected)
    assert host["kernel"] == platform.release()
    assert host["python"] == platform.python_version()
    assert host["python_executable"] == sys.executable
    if os.path.exists("/etc/os-release"):
        assert host["os"] == platform.freedesktop_os_release()["PRETTY_NAME"]


def test_resources(facts: dict[str, Any]) -> None:
    shm = os.statvfs("/dev/shm")
    assert facts["resources"]["dev_shm_bytes"] == shm.f_blocks * shm.f_frsize
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    assert facts["resources"]["memlock"] == ("unlimited" if soft == resource.RLIM_INFINITY else soft)
    assert facts["resources"]["cpus"] == len(os.sched_getaffinity(0))


def test_the_open_file_limit_is_the_soft_one_the_session_gives() -> None:
    """The probe started as a session with systemd's default soft limit would start it (prlimit, the hard one kept)."""
    facts, _ = run_probe(within=["prlimit", "--nofile=1024:", "--"])
    assert facts["resources"]["nofile"] == 1024
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert run_probe()[0]["resources"]["nofile"] == ("unlimited" if soft == resource.RLIM_INFINITY else soft)


def test_the_temporary_folder_is_the_one_tempfile_gives_with_its_free_space(tmp_path: Path) -> None:
    """Real filesystems: TMPDIR on a 1 MiB tmpfs of 64 inodes, filled, is read with nothing free; on a read-only one it is
    passed over for /tmp, as tempfile passes it over; and with /tmp and /var/tmp read-only in a mount namespace of the
    probe's own, and no /usr/tmp, there is none (the job's tempfile would raise "No usable temporary directory")."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        skip_or_fail("needs root to mount a tmpfs, and unshare")
    small, read_only = tmp_path / "small", tmp_path / "read-only"
    small.mkdir()
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64", "tmpfs", str(small)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)], check=True, timeout=30)
        try:
            with open(small / "fill", "wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
                for _ in range(2048):
                    f.write(b"x" * 4096)
            full = run_probe(env={**os.environ, "TMPDIR": str(small)})[0]["resources"]["tmp"]
            assert full["path"] == str(small) and full["free_bytes"] == 0 and full["total_bytes"] == 1 << 20, full
            assert 0 < full["free_inodes"] < full["total_inodes"] == 64, full
            passed_over = run_probe(env={**os.environ, "TMPDIR": str(read_only)})[0]["resources"]["tmp"]
            assert passed_over["path"] == "/tmp" and passed_over["total_bytes"] == os.statvfs("/tmp").f_blocks * os.statvfs("/tmp").f_frsize
        finally:
            subprocess.run(["umount", str(read_only)], check=True, timeout=30)
    finally:
        subprocess.run(["umount", str(small)], check=True, timeout=30)
    assert not Path("/usr/tmp").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    none = "for d in /tmp /var/tmp; do mount --bind $d $d && mount -o remount,bind,ro $d || exit 9; done; exec \"$@\""
    facts, _ = run_probe(env=env, within=["unshare", "--mount", "--propagation", "private", "sh", "-c", none, "sh"])
    assert facts["resources"]["tmp"] is None


def test_the_cpu_quota_is_the_smallest_from_the_group_up_on_v1_and_v2(tmp_path: Path) -> None:
    """cgroup v1: the group's own 1.5 CPUs, under a parent held to 0.25 (a parent's quota throttles its children), under a
    root with none (-1). v2: "max" at the group and 50000 of 100000 above it. A container whose /proc/self/cgroup names a
    path its /sys lacks reads its own root. No quota anywhere: None."""
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    for folder, quota in ((v1, -1), (v1 / "kubepods", 25_000), (v1 / "kubepods" / "pod1", 150_000)):
        folder.mkdir(parents=True)
        (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("12:memory:/kubepods/pod1\n4:cpu,cpuacct:/kubepods/pod1\n0::/kubepods/pod1\n")
    assert probe.cgroup_cpu_quota(str(cgroup), str(tmp_path / "v1")) == 0.25
    (v1 / "kubepods" / "cpu.cfs_quota_us").write_text("-1\n")
    assert probe.cgroup_cpu_quota(str(cgroup), str(tmp_path / "v1")) == 1.5
    v2 = tmp_path / "v2"
    (v2 / "user.slice" / "job").mkdir(parents=True)
    (v2 / "user.slice" / "job" / "cpu.max").write_text("max 100000\n")
    (v2 / "user.slice" / "cpu.max").write_text("50000 100000\n")
    cgroup.write_text("0::/user.slice/job\n")
    assert probe.cgroup_cpu_quota(str(cgroup), str(v2)) == 0.5
    cgroup.write_text("0::/docker/abc123\n")  # the container's own cgroup is mounted as its /sys/fs/cgroup
    (v2 / "cpu.max").write_text("200000 100000\n")
    assert probe.cgroup_cpu_quota(str(cgroup), str(v2)) == 2.0
    (v2 / "cpu.max").write_text("max 100000\n")
    assert probe.cgroup_cpu_quota(str(cgroup), str(v2)) is None
    assert probe.cgroup_cpu_quota(str(tmp_path / "absent"), str(v2)) is None


# The probe's network facts are compared inside a namespace of this module's own, whose devices it builds: in the root
# namespace other tests (and their sessions) add and remove bridges and veths while the probe and the comparison read.
OWN_NET_ADDRESSES = {"lo": {"127.0.0.1/8"}, "pfa": {"198.18.255.1/30", "198.18.255.9/29"}, "pfb": {"198.18.255.2/30"}}


@dataclass(frozen=True)
class OwnNet:
    """The namespace, and the probe's facts read inside it."""

    namespace: str
    facts: dict[str, Any]

    def run(self, *argv: str) -> str:
        """A command's output, run inside the namespace (its own /sys too: `ip netns exec` mounts one)."""
        return subprocess.run(["ip", "netns", "exec", self.namespace, *argv], capture_output=True, text=True, timeout=30,
                              check=True).stdout


@pytest.fixture(scope="module")
def own_net(sandbox_factory: SandboxFactory) -> OwnNet:
    """lo, and a veth pair: pfa up with two addresses and MTU 1400, pfb down with one; nothing else. The namespace is
    named as a sandbox host of a prefix the factory reserves, so that the factory removes it at the end, and the next
    session in this slot removes it after a killed run."""
    prefix, _ = sandbox_factory.reserve()
    namespace = f"{prefix}-h1"
    subprocess.run(["ip", "netns", "add", namespace], check=True, timeout=30)
    inside = ["ip", "-n", namespace]
    for command in (["link", "set", "lo", "up"], ["link", "add", "pfa", "mtu", "1400", "type", "veth", "peer", "name", "pfb"],
                    *(["addr", "add", address, "dev", name] for name in ("pfa", "pfb") for address in sorted(OWN_NET_ADDRESSES[name])),
                    ["link", "set", "pfa", "up"]):
        subprocess.run([*inside, *command], check=True, timeout=30)
    return OwnNet(namespace, run_probe(within=["ip", "netns", "exec", namespace])[0])


def test_interfaces_match_sysfs(own_net: OwnNet) -> None:
    interfaces = {i["name"]: i for i in own_net.facts["net"]["interfaces"]}
    listing = own_net.run("sh", "-c", "for d in /sys/class/net/*; do echo ${d##*/} $(cat $d/mtu) $(cat $d/operstate); done")
    sysfs = {name: (int(mtu), state) for name, mtu, state in (line.split() for line in listing.splitlines())}
    assert sorted(interfaces) == sorted(sysfs) == ["lo", "pfa", "pfb"]
    assert {name: (i["mtu"], i["operstate"]) for name, i in interfaces.items()} == sysfs
    assert (sysfs["pfa"][0], sysfs["pfb"][0]) == (1400, 1500)  # the probe read each device, not one for all
    assert sysfs["pfb"][1] == "down" and sysfs["pfa"][1] != "down"
    assert all(i["speed_mbps"] is None or i["speed_mbps"] >= 0 for i in interfaces.values())
    assert [name for name, i in interfaces.items() if i["loopback"]] == ["lo"]


def test_ipv4_addresses_match_the_ip_command(own_net: OwnNet) -> None:
    expected: dict[str, set[str]] = {}
    for line in own_net.run("ip", "-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        expected.setdefault(fields[1], set()).add(fields[fields.index("inet") + 1])
    found = {i["name"]: set(i["ipv4"]) for i in own_net.facts["net"]["interfaces"] if i["ipv4"]}
    assert found == expected == OWN_NET_ADDRESSES


def test_infiniband_matches_sysfs(facts: dict[str, Any]) -> None:
    ports = sorted(glob.glob("/sys/class/infiniband/*/ports/*"))
    assert [(p["device"], p["port"]) for p in facts["net"]["infiniband"]] == sorted(
        (Path(p).parent.parent.name, int(Path(p).name)) for p in ports
    )


def test_gpu_without_a_driver_is_a_fact_not_a_crash(facts: dict[str, Any]) -> None:
    gpu = facts["gpu"]
    if has_nvidia_driver():
        assert gpu["source"] in ("nvml", "nvidia-smi"), gpu  # test_gpu_devices_match_nvidia_smi compares the rest
        return
    assert gpu["source"] == "none"
    assert gpu["error"] and "\n" not in gpu["error"]
    assert gpu["devices"] == [] and gpu["driver_version"] is None and gpu["cuda_driver_version"] is None


@pytest.mark.gpu
def test_gpu_devices_match_nvidia_smi(facts: dict[str, Any]) -> None:
    if shutil.which("nvidia-smi") is None:
        skip_or_fail("no nvidia-smi here", gpu=True)
    listing = subprocess.run(["nvidia-smi", "--query-gpu=uuid,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    rows = [line.split(", ") for line in listing.splitlines() if line.strip()]
    gpu = facts["gpu"]
    assert gpu["source"] in ("nvml", "nvidia-smi") and gpu["error"] is None
    assert [d["uuid"] for d in gpu["devices"]] == [uuid for uuid, _ in rows]
    assert gpu["driver_version"] == rows[0][1]
    assert re.fullmatch(r"\d+\.\d", gpu["cuda_driver_version"] or "")
    for device in gpu["devices"]:
        assert device["memory_total_bytes"] and device["pcie_gen_max"] and device["processes"] is not None


def test_torch_is_read_without_importing_it(facts: dict[str, Any]) -> None:
    torch = facts["torch"]
    spec = importlib.util.find_spec("torch")
    if spec is None:
        assert torch == {"installed": False, "version": None, "cuda": None, "location": None,
                         "nccl_version": None, "nccl_library": None}
        return
    assert torch["installed"] is True
    assert torch["location"] == os.path.dirname(spec.origin or "")
    # The probe reads torch/version.py, which keeps the build's local label ("2.11.0+cu130"); a wheel's metadata can
    # leave it out (the H100 image's torch says "2.11.0" there), as CI's CPU build does not ("2.13.0+cpu").
    distribution = importlib.metadata.version("torch")
    assert torch["version"] == distribution or torch["version"].startswith(distribution + "+"), (torch["version"], distribution)
    # torch's own answer, from a separate process: the probe's regexes must agree with the real import.
    truth = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"],
                           capture_output=True, text=True, check=True, timeout=300).stdout
    assert [torch["version"], torch["cuda"]] == json.loads(truth)
    if torch["version"].endswith("+cpu"):
        assert torch["cuda"] is None


def test_torch_nccl_matches_the_nccl_wheel(facts: dict[str, Any]) -> None:
    torch = facts["torch"]
    assert torch["installed"], "torch: tests/setup.sh installs it"
    site = os.path.dirname(torch["location"])
    wheels = sorted(glob.glob(os.path.join(site, "nvidia_nccl_cu*.dist-info")))
    if not wheels:
        assert torch["nccl_library"] is None or not torch["nccl_library"].startswith(os.path.join(site, "nvidia"))
        skip_or_fail("no nvidia-nccl wheel beside torch (a CPU build)", gpu=True)
    assert torch["nccl_library"] == os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2")
    assert torch["nccl_version"] == importlib.metadata.Distribution.at(wheels[0]).version


def test_never_imports_torch_nor_preflight() -> None:
    _, stderr = run_probe("-X", "importtime")
    imported = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert "json" in imported  # the importtime listing was read at all
    assert not {m for m in imported if m.split(".")[0] in ("torch", "preflight")}


def test_nccl_env_and_conf_files(tmp_path: Path) -> None:
    conf = tmp_path / "nccl.conf"
    conf.write_text("# tuned for the fabric\nNCCL_IB_HCA=mlx5_0,mlx5_1\nNCCL_SOCKET_IFNAME =eth0\nnot a setting\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(probe.ENV_PREFIXES) and k not in probe.ENV_NAMES}
    env.update(NCCL_DEBUG="INFO", TORCH_NCCL_BLOCKING_WAIT="1", TORCH_DISTRIBUTED_DEBUG="DETAIL", GLOO_SOCKET_IFNAME="lo",
               CUDA_VISIBLE_DEVICES="0", NCCL_CONF_FILE=str(conf), NCCLX_NOT_OURS="1")
    facts, _ = run_probe(env=env)
    assert facts["nccl"]["env"] == {
        "CUDA_VISIBLE_DEVICES": "0", "GLOO_SOCKET_IFNAME": "lo", "NCCL_CONF_FILE": str(conf), "NCCL_DEBUG": "INFO",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_NCCL_BLOCKING_WAIT": "1",
    }
    # The stray space stays: NCCL would set "NCCL_SOCKET_IFNAME ", which is not NCCL_SOCKET_IFNAME.
    assert facts["nccl"]["conf_files"][str(conf)] == {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME ": "eth0"}


def test_the_shells_folder_does_not_shadow_the_environment(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('the probe imported json.py from its working folder')\n")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '0.0.0+shadow'\n")
    facts, _ = run_probe(cwd=tmp_path)
    assert facts["torch"]["location"] != str(tmp_path / "torch")


def test_runs_with_a_bare_ssh_environment() -> None:
    facts, _ = run_probe(env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")})
    assert facts["host"]["hostname"] == socket.gethostname()


def test_elapsed_is_measured(facts: dict[str, Any]) -> None:
    # How long it takes is bench/probe_speed.py's to measure (docs/benchmarks.md), not a test's.
    assert facts["probe"]["elapsed_s"] > 0


# ---------------------------------------------------------------------------------------------------------------------
# The source: stdlib only, old pythons


def imported_modules() -> set[str]:
    """Top-level names of every module the probe's source imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(SOURCE)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "no relative imports: the probe runs as a lone script"
            names.add(node.module.split(".")[0])
    return names


def test_imports_only_the_standard_library_and_pynvml() -> None:
    names = imported_modules()
    assert "pynvml" in names and "json" in names
    assert {n for n in names if n not in sys.stdlib_module_names and n != "__future__"} == {"pynvml"}


def test_every_nvml_call_exists_in_pynvml() -> None:
    import pynvml  # nvidia-ml-py, a dependency
    tree = ast.parse(SOURCE)
    called = {node.attr for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nvml"}
    # ask(nvml, "nvmlDeviceGetX", ...) names its call as a string.
    called |= {node.args[1].value for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ask"
               and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)}
    assert "nvmlDeviceGetRemappedRows" in called
    # probe.ask() turns any exception into None, so a misspelt name would silently read as "not supported".
    assert sorted(a for a in called if not hasattr(pynvml, a)) == []


# The scripts a host runs with its own python3 (cluster.hosts.N.python), which may be as old as 3.8, checked as hosts get
# them (their bundles); the collective's worker runs in the training environment's python, held to the same floor.
OLD_PYTHON_SCRIPTS = {script.name: bundle.text(script) for script in bundle.SCRIPTS}
# What Python 3.8 lacks that ast.parse(feature_version=(3, 8)) lets through: runtime names and keywords of 3.9 and later.
NEWER_ATTRIBUTES = {"removeprefix", "removesuffix", "is_relative_to", "with_stem", "readlink", "bit_count", "pairwise",
                    "stdlib_module_names", "orig_argv", "lcm", "nextafter", "ulp", "randbytes", "waitstatus_to_exitcode",
                    "pidfd_open", "to_thread", "unparse", "cache", "get_int_max_str_digits", "UTC"}
NEWER_MODULES = {"zoneinfo", "graphlib", "tomllib"}
NEWER_KEYWORDS = {("zip", "strict"), ("dataclass", "slots"), ("dataclass", "kw_only"), ("run", "process_group"),
                  ("Popen", "process_group"), ("glob", "root_dir"), ("glob", "dir_fd")}
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}


def _never_run(tree: ast.AST) -> set[int]:
    """ids of the nodes Python never evaluates: annotations (under `from __future__ import annotations`) and what an
    `if TYPE_CHECKING:` holds."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            roots += node.body
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(child) for root in roots for child in ast.walk(root)}


def _is_type(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in {*BUILTIN_GENERICS, "int", "str", "float", "bool", "bytes"}) or \
        (isinstance(node, ast.Constant) and node.value is None) or isinstance(node, ast.Subscript)


def _dotted(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and _dotted(node.value))


def newer_than_3_8(source: str) -> list[str]:
    """What in source Python 3.8 cannot run: its grammar (ast.parse's feature_version), and what that lets through:
    3.9's relaxed decorators, a starred subscript, `X | Y` of types and list[int] evaluated at run time, a dict literal's
    union, the names, modules and keywords above. A dict union of two variables is beyond a reading of the source."""
    try:
        tree = ast.parse(source, feature_version=(3, 8))
    except SyntaxError as e:
        return [f"line {e.lineno}: {e.msg}"]
    lazy = _never_run(tree)
    found = []
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
               for n in tree.body):
        found.append("no `from __future__ import annotations`: 3.8 evaluates list[int] and X | None in annotations")
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if id(node) in lazy:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found += [f"line {d.lineno}: a decorator 3.8's grammar refuses" for d in node.decorator_list
                      if not (_dotted(d) or (isinstance(d, ast.Call) and _dotted(d.func)))]
        elif isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id in BUILTIN_GENERICS:
                found.append(f"line {line}: {node.value.id}[...] at run time")
            if any(isinstance(e, ast.Starred) for e in (node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice])):
                found.append(f"line {line}: a starred subscript")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            if _is_type(node.left) or _is_type(node.right):
                found.append(f"line {line}: X | Y of types at run time")
            if any(isinstance(side, (ast.Dict, ast.DictComp)) for side in (node.left, node.right)):
                found.append(f"line {line}: a dict union")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr) and isinstance(node.value, (ast.Dict, ast.DictComp)):
            found.append(f"line {line}: a dict union")
        elif isinstance(node, ast.Attribute) and node.attr in NEWER_ATTRIBUTES:
            found.append(f"line {line}: .{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {line}: import {n}" for n in names if n.split(".")[0] in NEWER_MODULES]
            if isinstance(node, ast.ImportFrom):
                found += [f"line {line}: {a.name}" for a in node.names if a.name in NEWER_ATTRIBUTES]
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            found += [f"line {line}: {callee}({k.arg}=)" for k in node.keywords if (callee, k.arg) in NEWER_KEYWORDS]
        elif isinstance(node, (ast.With, ast.AsyncWith)) and _parenthesized_with(source, node):
            found.append(f"line {line}: a parenthesized with statement")
    return found


def _parenthesized_with(source: str, node: ast.With | ast.AsyncWith) -> bool:
    """`with (a as b, c as d):`, 3.9's form, which 3.12's parser lets through under feature_version=(3, 8) (seen on the
    H100 host's Python 3.12, 2026-11-27): a `)` between the last item's `as` target and the colon. `with (a, b):` and
    `with (a) as b:` are 3.8's grammar, and have none there."""
    last = node.items[-1]
    if last.optional_vars is None or last.optional_vars.end_lineno is None or last.optional_vars.end_col_offset is None:
        return False
    lines = source.splitlines()
    row, col = last.optional_vars.end_lineno - 1, last.optional_vars.end_col_offset
    rest = (lines[row][col:] + "\n" + "\n".join(lines[row + 1:node.body[0].lineno - 1])).split(":", 1)[0]
    return ")" in rest


@pytest.mark.parametrize("script", OLD_PYTHON_SCRIPTS)
def test_runs_on_python_3_8(script: str) -> None:
    assert newer_than_3_8(OLD_PYTHON_SCRIPTS[script]) == []


@pytest.mark.parametrize("snippet", [
    "match x:\n    case 1:\n        pass\n",
    "with (open(a) as f, open(b) as g):\n    pass\n",
    "with (\n    open(a) as f,\n    open(b) as g,\n):\n    pass\n",
    "@handlers[0].register\ndef f(): pass\n",
    "a[*b]\n",
    "isinstance(x, int | None)\n",
    "Hosts = dict[str, int]\n",
    "merged = {'a': 1} | other\n",
    "merged |= {'a': 1}\n",
    "name = text.removeprefix('x')\n",
    "import zoneinfo\n",
    "from functools import cache\n",
    "pairs = list(zip(a, b, strict=True))\n",
])
def test_the_3_8_check_finds_what_3_8_cannot_run(snippet: str) -> None:
    """Every one of these fails on Python 3.8 (a SyntaxError, TypeError or AttributeError); the check finds each, and
    finds nothing in its annotations, which 3.8 never evaluates under the __future__ import."""
    header = "from __future__ import annotations\n"
    assert newer_than_3_8(header + snippet) != [], snippet
    assert newer_than_3_8(header + "def f(a: dict[str, int] | None) -> list[int]:\n    b: tuple[int, ...] = ()\n") == []
    assert newer_than_3_8(header + "if TYPE_CHECKING:\n    Pair = tuple[int, int]\n") == []


@pytest.mark.parametrize("snippet, newer", [
    ("with (open(a) as f, open(b) as g):\n    pass\n", True),
    ("with (open(a) as f):\n    pass\n", True),
    ("with (\n    open(a) as f,\n    open(b) as g,\n):\n    pass\n", True),
    ("with (open(a)) as f, (open(b)) as g:\n    pass\n", False),
    ("with open(a) as f:  # (a comment)\n    pass\n", False),
    ("with (a, b):\n    pass\n", False),
])
def test_the_parenthesized_with_reader(snippet: str, newer: bool) -> None:
    """The rule that 3.12's parser needs, read on this interpreter's full grammar (3.11's refuses the form already)."""
    (statement,) = ast.parse(snippet).body
    assert isinstance(statement, ast.With) and _parenthesized_with(snippet, statement) is newer
    assert newer_than_3_8("x = 1\n") == ["no `from __future__ import annotations`: 3.8 evaluates list[int] and X | None in "
                                         "annotations"]


# ---------------------------------------------------------------------------------------------------------------------
# Pure conversions


@pytest.mark.parametrize("code, text", [
    (22809, "2.28.9"), (22803, "2.28.3"), (21005, "2.10.5"), (23203, "2.32.3"), (2708, "2.7.8"), (2408, "2.4.8"), (0, None),
])
def test_nccl_version_string(code: int, text: str | None) -> None:
    assert probe.nccl_version_string(code) == text


@pytest.mark.parametrize("code, text", [(13000, "13.0"), (12040, "12.4"), (12020, "12.2"), (11080, "11.8"), (0, None)])
def test_cuda_version_string(code: int, text: str | None) -> None:
    assert probe.cuda_version_string(code) == text


@pytest.mark.parametrize("text, expected", [
    ("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n", ("2.11.0+cu130", "13.0")),
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", ("2.13.0+cpu", None)),
    ('__version__ = "1.13.1"\ncuda = "11.7"\n', ("1.13.1", "11.7")),
    ("git_version = 'abc'\n", (None, None)),
])
def test_parse_torch_version_py(text: str, expected: tuple[str | None, str | None]) -> None:
    assert probe.parse_torch_version_py(text) == expected


def test_parse_smi_csv_reads_na_as_none_and_keeps_commas_in_the_last_field() -> None:
    fields = ("gpu_uuid", "pid", "used_memory", "process_name")
    text = ("GPU-1, 404, 2836, /usr/bin/python3\n"
            "GPU-1, 405, [N/A], /opt/my, odd name\n"
            "GPU-2, 406, [Not Supported], [Insufficient Permissions]\n"
            "WARNING: infoROM is corrupted at gpu 0000:00:06.0\n")
    assert probe.parse_smi_csv(text, fields) == [
        {"gpu_uuid": "GPU-1", "pid": "404", "used_memory": "2836", "process_name": "/usr/bin/python3"},
        {"gpu_uuid": "GPU-1", "pid": "405", "used_memory": None, "process_name": "/opt/my, odd name"},
        {"gpu_uuid": "GPU-2", "pid": "406", "used_memory": None, "process_name": None},
    ]


def test_smi_devices_from_the_h100_recording() -> None:
    # The values nvidia-smi printed on the recorded H100 host (tests/data/h100-single-node/nvidia-smi.txt).
    gpus = probe.parse_smi_csv(
        "0, GPU-68238f7a-fa6f-b6b8-6132-63c29858a94f, 00000000:00:06.0, 81559, 2847, Enabled, 0, 0, 5, 5, 16, 16, "
        "Enabled, Default, [N/A], 580.159.04, NVIDIA H100 80GB HBM3\n", probe.SMI_GPU_FIELDS)
    apps = probe.parse_smi_csv("GPU-68238f7a-fa6f-b6b8-6132-63c29858a94f, 404, 2836, python3\n", probe.SMI_APP_FIELDS)
    remaps = probe.parse_smi_csv("00000000:00:06.0, No, Yes\n", probe.SMI_REMAP_FIELDS)
    device = probe.smi_devices(gpus, apps, remaps)[0]
    assert device == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-68238f7a-fa6f-b6b8-6132-63c29858a94f",
        "pci_bus_id": "00000000:00:06.0", "memory_total_bytes": 85520809984, "memory_used_bytes": 2847 * 2**20,
        "ecc_enabled": True, "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
        "remapped_rows_pending": False, "remapped_rows_failed": True,
        "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16,
        "persistence_mode": True, "compute_mode": "default", "mig_enabled": None,
        "processes": [{"pid": 404, "name": "python3", "used_memory_bytes": 2836 * 2**20}],
        **dict.fromkeys(probe.SMI_XML_FIELDS),  # filled from nvidia-smi -q -x (below)
    }
    # A failed apps or remapped-rows query leaves only those fields unknown.
    degraded = probe.smi_devices(gpus, None, None)[0]
    assert degraded["processes"] is None and degraded["remapped_rows_pending"] is None
    assert degraded["memory_total_bytes"] == 85520809984


@pytest.mark.parametrize("cell, value", [
    ("Enabled", True), ("Disabled", False), ("Yes", True), ("No", False), ("0", False), ("2", True), (None, None), ("?", None),
])
def test_smi_bool(cell: str | None, value: bool | None) -> None:
    assert probe.smi_bool(cell) == value


def test_parse_nccl_conf_reads_as_nccl_does() -> None:
    assert probe.parse_nccl_conf("#NCCL_DEBUG=INFO\n\nNCCL_P2P_LEVEL=NVL\nNCCL_ALGO=Ring=Tree\njunk\n") == {
        "NCCL_P2P_LEVEL": "NVL", "NCCL_ALGO": "Ring=Tree",
    }


@pytest.mark.parametrize("text, state", [("4: ACTIVE", "ACTIVE"), ("5: LinkUp", "LinkUp"), ("1: DOWN", "DOWN"), (None, "unknown")])
def test_sysfs_state(text: str | None, state: str) -> None:
    assert probe.sysfs_state(text) == state


def test_parse_os_release() -> None:
    text = Path(__file__).parent.joinpath("data", "h100-single-node", "os-release.txt").read_text()
    fields = probe.parse_os_release(text + "# a comment\nVERSION_CODENAME=noble\nEMPTY=\n")
    assert fields["PRETTY_NAME"] == "Ubuntu 24.04.3 LTS"
    assert fields["VERSION_CODENAME"] == "noble" and fields["EMPTY"] == ""


def test_smi_xml_from_the_h100_recording() -> None:
    # nvidia-smi -q -x of the recorded H100: the same values NVML gave (tests/recorded.py), but the temperature,
    # read a moment apart (54 C here, 55 C through pynvml).
    details = probe.parse_smi_xml((H100 / "nvidia-smi-q.xml").read_text())
    expected = {k: v for k, v in h100_facts()["gpu"]["devices"][0].items() if k in probe.SMI_XML_FIELDS}
    assert details == {"00000000:00:06.0": {**expected, "temperature_c": 54}}
    assert probe.parse_smi_xml("<nvidia_smi_log><gpu") == {}


def test_smi_xml_reads_what_the_recording_leaves_at_na() -> None:
    # The recorded H100 has every clock reason Not Active and retired pages N/A; a throttled, pre-Ampere GPU is the
    # same document with those cells changed (the tag names are the recording's).
    text = (H100 / "nvidia-smi-q.xml").read_text()
    for tag in ("hw_slowdown", "hw_power_brake_slowdown"):
        text = text.replace(f"<clocks_event_reason_{tag}>Not Active<", f"<clocks_event_reason_{tag}>Active<")
    text = text.replace("<pending_retirement>N/A<", "<pending_retirement>Yes<")
    text = text.replace("<gpu_recovery_action>None<", "<gpu_recovery_action>Drain and Reset<")
    (gpu,) = probe.parse_smi_xml(text).values()
    assert gpu["clock_event_reasons"] == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert (gpu["retired_pages_pending"], gpu["recovery_action"]) == (True, "drain_and_reset")


@pytest.mark.parametrize("text, action", [("None", "none"), ("Drain and Reset", "drain_and_reset"), ("Reset", "gpu_reset"),
                                          ("Node Reboot", "node_reboot"), ("Recover IMEX Domain", "recover_imex_domain"),
                                          (None, None)])
def test_smi_recovery_action(text: str | None, action: str | None) -> None:
    assert probe.smi_recovery_action(text) == action


# The stand-in answers the calls of facts schema 2; those of schema 3 (and the errors of the calls it lacks) are
# tested through the real nvidia-ml-py against the compiled fake library (test_nvml_library.py).
_SCHEMA_3 = (*probe.SMI_XML_FIELDS, "nvml_call_errors")


def _schema_2(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: [_schema_2(d) for d in v] if k == "devices" else v for k, v in facts.items() if k not in _SCHEMA_3}


def _nvml_from_the_h100_recording(missing: str) -> Any:
    """A stand-in for pynvml answering with the real H100 recording's values: pynvml's own constants and error type,
    every call of facts schema 2 the probe makes, except `missing`, as on a host whose nvidia-ml-py predates that call."""
    import pynvml  # nvidia-ml-py, a dependency
    raw = json.loads((H100 / "facts.json").read_text())
    gpu = raw["gpus"][0]
    answers: dict[str, Any] = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: len(raw["gpus"]),
        "nvmlDeviceGetHandleByIndex": lambda index: raw["gpus"][index],
        "nvmlDeviceGetName": lambda h: h["name"], "nvmlDeviceGetUUID": lambda h: h["uuid"],
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=h["pci_bus_id"]),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=h["memory_total"], used=h["memory_used"]),
        "nvmlDeviceGetEccMode": lambda h: h["ecc_mode"],
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: h["ecc_uncorrected_volatile" if counter == pynvml.NVML_VOLATILE_ECC
                                                                  else "ecc_uncorrected_aggregate"],
        "nvmlDeviceGetRemappedRows": lambda h: tuple(h["remapped_rows"]),
        "nvmlDeviceGetMigMode": lambda h: h["mig_mode"],
        "nvmlDeviceGetPersistenceMode": lambda h: h["persistence_mode"], "nvmlDeviceGetComputeMode": lambda h: h["compute_mode"],
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: h["pcie_gen_cur"],
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: h["pcie_gen_max"],
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: h["pcie_width_cur"], "nvmlDeviceGetMaxPcieLinkWidth": lambda h: h["pcie_width_max"],
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],  # the recording counted 0 compute processes
        "nvmlSystemGetProcessName": lambda pid: None,
        "nvmlSystemGetCudaDriverVersion": lambda: raw["cuda_driver_version"],
        "nvmlSystemGetDriverVersion": lambda: raw["driver_version"],
    }
    assert gpu["index"] == 0 and missing in answers
    del answers[missing]
    constants = {name: value for name, value in vars(pynvml).items() if name.startswith("NVML") and not callable(value)}
    return SimpleNamespace(NVMLError=pynvml.NVMLError, **constants, **answers)


def test_a_call_missing_from_pynvml_leaves_only_its_facts_unknown() -> None:
    expected = _schema_2(h100_facts()["gpu"])
    info = probe.nvml_info(_nvml_from_the_h100_recording(missing="nvmlDeviceGetRemappedRows"))
    assert "nvmlDeviceGetRemappedRows: AttributeError: 'types.SimpleNamespace' object has no attribute " \
           "'nvmlDeviceGetRemappedRows'" in info["nvml_call_errors"]
    info = _schema_2(info)
    (device,) = info["devices"]
    assert (device["remapped_rows_pending"], device["remapped_rows_failed"]) == (None, None)
    assert {**device, "remapped_rows_pending": False, "remapped_rows_failed": False} == expected["devices"][0]
    assert {k: info[k] for k in ("source", "error", "driver_version", "cuda_driver_version")} == \
           {k: expected[k] for k in ("source", "error", "driver_version", "cuda_driver_version")}


def test_the_stand_in_answers_as_the_recording() -> None:
    # Without a missing call the stand-in reproduces the recording exactly: the test above changes one thing only.
    info = probe.nvml_info(_nvml_from_the_h100_recording(missing="nvmlSystemGetProcessName"))
    assert _schema_2(info) == _schema_2(h100_facts()["gpu"])


# ---------------------------------------------------------------------------------------------------------------------
# The GPU node's facts (facts schema 2), read for real on this machine


def test_kernel_log_is_read_for_real(facts: dict[str, Any]) -> None:
    log = facts["kernel_log"]
    if os.geteuid() != 0:
        skip_or_fail("reading /dev/kmsg here needs root (kernel.dmesg_restrict)")
    assert (log["source"], log["error"]) == ("kmsg", None)
    # dmesg reads the same ring buffer: the probe's events are its Xid lines, counted per GPU and code.
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert sum(e["count"] for e in log["events"]) == sum(1 for line in dmesg.splitlines() if re.search(r"\bS?Xid \(PCI:", line))


def test_an_unprivileged_user_gets_the_reason_not_a_failure() -> None:
    """As nobody, with the system's python: /dev/kmsg refuses (kernel.dmesg_restrict=1 here), journalctl -k shows
    nothing, there is no kern.log; the probe still exits 0 and says why."""
    if os.geteuid() != 0 or Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1" or not Path("/usr/bin/python3").exists():
        skip_or_fail("needs root to switch to nobody, dmesg_restrict=1 and /usr/bin/python3")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-"], input=SOURCE,
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    log = json.loads(done.stdout)["kernel_log"]
    assert log["source"] is None and log["events"] == []
    assert log["error"].startswith("/dev/kmsg: Operation not permitted")


def test_topology_matches_sysfs(facts: dict[str, Any]) -> None:
    topology = facts["topology"]
    nvidia = [Path(d).name for d in glob.glob("/sys/bus/pci/devices/*") if Path(d, "vendor").read_text().strip() == "0x10de"]
    assert sorted(d["pci"] for d in topology["devices"] if d["kind"] in ("gpu", "nvswitch")) == sorted(
        n for n in nvidia if Path("/sys/bus/pci/devices", n, "class").read_text().strip()[:4] in ("0x03", "0x06"))
    assert topology["iommu"]["groups"] == len(os.listdir("/sys/kernel/iommu_groups"))
    assert topology["numa_balancing"] == int(Path("/proc/sys/kernel/numa_balancing").read_text())
    assert topology["peermem_loaded"] == Path("/sys/module/nvidia_peermem").is_dir()
    assert facts["fabric"]["nvswitch_count"] == sum(1 for d in topology["devices"] if d["kind"] == "nvswitch")
    installed = any(Path(p).exists() for p in probe.FABRIC_MANAGER_UNITS) or shutil.which("nv-fabricmanager") is not None
    assert facts["fabric"]["fabric_manager"]["installed"] == installed
    for bridge in topology["bridges"]:  # every bridge's config space as sysfs gives it to this user
        assert bridge["config_bytes"] == len(Path("/sys/bus/pci/devices", bridge["pci"], "config").read_bytes())


def test_net_plugins_match_the_library_folders(facts: dict[str, Any]) -> None:
    found = sorted(p for folder in probe.linker_folders() for p in glob.glob(os.path.join(folder, "libnccl-net*.so*")))
    assert sorted(set(facts["nccl"]["net_plugins"]) - {p for p in facts["nccl"]["net_plugins"] if "/torch/" in p}) == sorted(set(found))


def test_nvml_fabric_of_the_recorded_pcie_h100_is_unknown_not_wrong() -> None:
    # The recording's NVML answered "Not Supported" for fabric and NVLink (README): the stand-in lacks those calls.
    fabric: dict[str, Any] = {"gpus": [], "nvlinks": []}
    probe.nvml_info(_nvml_from_the_h100_recording(missing="nvmlSystemGetProcessName"), fabric)
    assert fabric == {"gpus": h100_facts()["fabric"]["gpus"], "nvlinks": []}


def test_a_cluster_uuid_keeps_its_zero_bytes() -> None:
    import ctypes

    class FabricInfo(ctypes.Structure):  # the layout of NVML's nvmlGpuFabricInfo_t
        _fields_ = [("clusterUuid", ctypes.c_char * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte)]

    info = FabricInfo()
    raw = bytes.fromhex("dc6e40c4d72243579ba65291dd461278")
    ctypes.memmove(ctypes.addressof(info), raw[:3] + b"\0" + raw[4:], 16)
    assert info.clusterUuid == raw[:3]  # what attribute access gives: cut at the first zero byte
    assert probe.fabric_uuid(probe.struct_bytes(info, "clusterUuid", 16)) == "dc6e40c4"[:6] + "00-d722-4357-9ba6-5291dd461278"
