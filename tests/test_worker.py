"""The per-rank worker: nccl-tests' formulas, event parsing, byte verification, and real torchrun runs with gloo."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, skip_or_fail

from preflight import bundle
from preflight.collective.wire import SweepConfig, WorkerConfigJson

# What hosts run: the worker's bundle, not its modules.
worker = bundle.load(bundle.WORKER)
COMPUTE_POINTS = worker.COMPUTE_POINTS
EVENT_PREFIX = worker.EVENT_PREFIX
PHASES = worker.PHASES
WorkerConfig = worker.WorkerConfig
algbw_gbps = worker.algbw_gbps
bus_factor = worker.bus_factor
busbw_gbps = worker.busbw_gbps
identity_problems = worker.identity_problems
parse_lines = worker.parse_lines
plateaued = worker.plateaued
sweep_bytes = worker.sweep_bytes

REPO = Path(__file__).resolve().parent.parent
NPROC = 3
FAST_DEADLINES = {"init": 30.0, "identity": 20.0, "verify": 20.0, "compute": 20.0, "neighbours": 20.0, "sweep": 30.0, "finish": 20.0}


def worker_config(**changes: Any) -> dict[str, Any]:
    """A whole config (the worker takes no other): no compute probe, no neighbour test."""
    config: dict[str, Any] = {"run_id": "test", "backend": "gloo", "seed": 1234, "host": "h1", "deadlines_s": dict(FAST_DEADLINES),
                              "verify_bytes": 256 << 10,
                              "sweep": {"sizes": [65536, 262144], "ops": ["all_gather", "all_reduce"], "warmup": 1, "iters": 3,
                                        "time_per_size_s": None},
                              "compute_s": 0.0, "neighbour_s": 0.0, "neighbour_bytes": 1 << 20, "suspect_fraction": 0.7, "repeats": 0,
                              "starved_repeats": 0, "starved_fraction": 0.5, "neighbour_ring": True, "pair_rounds": [], "rails": 0}
    config.update(changes)
    return config


# ---------------------------------------------------------------------------------------------------------------------
# Formulas: nccl-tests' doc/PERFORMANCE.md, "Summary" of the bus bandwidth factors


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_reduce", 16, 2 * 15 / 16), ("all_reduce", 1, 0.0),
    ("all_gather", 8, 7 / 8), ("all_gather", 2, 0.5), ("all_gather", 1, 0.0),
])
def test_bus_factor_is_nccl_tests(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


def test_bandwidths_in_gb_of_1e9_bytes() -> None:
    assert algbw_gbps(1_000_000_000, 1.0) == pytest.approx(1.0)
    assert algbw_gbps(1 << 30, 0.5) == pytest.approx(2 * 1.073741824)
    # nccl-tests' own example row: all_reduce of 1 GiB on 8 ranks in 5503.4 us.
    assert busbw_gbps("all_reduce", 1 << 30, 5503.4e-6, 8) == pytest.approx(195.10 * 1.75, rel=1e-3)
    assert busbw_gbps("all_gather", 8 << 20, 1e-3, 4) == pytest.approx(8.388608 * 0.75)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: bus_factor("all_reduce", 0), "world_size"),
    (lambda: bus_factor("alltoall_v", 4), "unknown collective"),
    (lambda: bus_factor("broadcast", 4), "unknown collective"),  # the sweep runs no broadcast: no factor for it
    (lambda: algbw_gbps(1024, 0.0), "positive"),
    (lambda: sweep_bytes("broadcast", 1024, 2), "sweep runs"),
])
def test_formulas_refuse_bad_input(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_sweep_bytes_are_whole_float32_shares() -> None:
    assert sweep_bytes("all_gather", 65536, 4) == 65536
    assert sweep_bytes("all_gather", 65536, 3) == 65532
    assert sweep_bytes("all_reduce", 1000, 3) == 996
    assert sweep_bytes("all_reduce", 8, 3) == 0


# ---------------------------------------------------------------------------------------------------------------------
# parse_lines


def test_parse_lines_keeps_only_whole_events() -> None:
    text = "\n".join([
        'PREFLIGHT {"event":"phase","phase":"init","rank":0}',
        "W1123 08:55:01 torch/distributed/run.py:792] Setting OMP_NUM_THREADS",
        'PREFLIGHT {"event":"phase","phase":"init",',          # cut by a kill
        "PREFLIGHT [1, 2]",                                    # JSON, but not an event
        'PREFLIGHT{"event":"x"}',                              # no space: not the prefix
        'PREFLIGHT {"event":"phase"} trailing junk',
        'preflight {"event":"lower"}',
        '  PREFLIGHT {"event":"indented"}',
        'some output PREFLIGHT {"event":"mid-line"}',
        'PREFLIGHT {"event":"result","rank":1,"sweep":[]}\r',  # a CRLF terminal
        '[default2]:PREFLIGHT {"event":"phase","phase":"verify","rank":2}',  # torchrun --tee
        "",
        "PREFLIGHT ",
    ])
    assert parse_lines(text) == [{"event": "phase", "phase": "init", "rank": 0}, {"event": "result", "rank": 1, "sweep": []},
                                 {"event": "phase", "phase": "verify", "rank": 2}]
    assert parse_lines("") == []
    assert EVENT_PREFIX == "PREFLIGHT " and PHASES == ("init", "identity", "verify", "compute", "neighbours", "sweep", "finish")


# ---------------------------------------------------------------------------------------------------------------------
# Config and identity


def test_config_parses_and_names_the_wrong_key() -> None:
    config = WorkerConfig.from_json(json.dumps(worker_config()))
    assert config.backend == "gloo" and config.sweep_sizes == [65536, 262144] and config.deadlines_s["init"] == 30.0
    assert config.neighbour_ring and config.pair_rounds == []
    rounds = WorkerConfig.from_json(json.dumps(worker_config(neighbour_ring=False, pair_rounds=[[["h1", "h2"], ["h3", "h4"]]])))
    assert not rounds.neighbour_ring and rounds.pair_rounds == [[("h1", "h2"), ("h3", "h4")]]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"backend": "mpi"}, "backend"), ({"deadlines_s": {**FAST_DEADLINES, "verify": 0}}, "deadlines_s.verify"),
        ({"deadlines_s": {"init": 1}}, "deadlines_s.identity"),
        ({"sweep": {"sizes": [1], "ops": ["broadcast"], "warmup": 0, "iters": 1, "time_per_size_s": None}}, "sweep.ops"),
        ({"sweep": {"sizes": [0], "ops": [], "warmup": 0, "iters": 1, "time_per_size_s": None}}, "sweep.sizes"),
        ({"sweep": {"sizes": [1], "ops": [], "warmup": 0, "iters": 0, "time_per_size_s": None}}, "sweep.iters"),
        ({"verify_bytes": True}, "verify_bytes"), ({"verify_bytes": 3}, "verify_bytes"), ({"seed": "1"}, "seed"), ({"host": None}, "host"),
        ({"neighbour_ring": 1}, "neighbour_ring"), ({"pair_rounds": [[["h1"]]]}, "pair_rounds"),
        ({"pair_rounds": [["h1", "h2"]]}, "pair_rounds"), ({"rails": -1}, "rails"), ({"rails": 65}, "rails"),
        ({"starved_repeats": 21}, "starved_repeats"), ({"starved_repeats": True}, "starved_repeats"),
        ({"starved_fraction": 1.5}, "starved_fraction"),
    ]
    for changes, key in cases:
        with pytest.raises(ValueError, match=re.escape(key)):
            WorkerConfig.from_json(json.dumps(worker_config(**changes)))
    with pytest.raises(ValueError, match="not JSON"):
        WorkerConfig.from_json("{")


def test_config_keys_are_the_wire_types() -> None:
    # The host script cannot import preflight/collective/wire.py: its own lists of keys are held to the types here.
    assert set(worker.CONFIG_KEYS) == WorkerConfigJson.__required_keys__ and not WorkerConfigJson.__optional_keys__
    assert set(worker.SWEEP_KEYS) == SweepConfig.__required_keys__ and not SweepConfig.__optional_keys__


@pytest.mark.parametrize("key", [*worker.CONFIG_KEYS, *(f"sweep.{k}" for k in worker.SWEEP_KEYS), "deadlines_s.neighbours"])
def test_config_without_a_key_is_refused(key: str) -> None:
    config = worker_config()
    *outer, last = key.split(".")
    del (config[outer[0]] if outer else config)[last]
    with pytest.raises(ValueError, match=f"^the worker's config lacks {re.escape(key)}$"):
        WorkerConfig.from_json(json.dumps(config))


@pytest.mark.parametrize(("where", "meant", "misspelt"), [("", "repeats", "repeat"), ("sweep", "iters", "iter"),
                                                        ("deadlines_s", "neighbours", "neighbors")])
def test_a_misspelt_config_key_is_refused(where: str, meant: str, misspelt: str) -> None:
    config = worker_config()
    inner = config[where] if where else config
    inner[misspelt] = inner.pop(meant)
    prefix = f"{where}." if where else ""
    with pytest.raises(ValueError, match=f"^the worker's config lacks {prefix}{meant}; has unknown key.s. {prefix}{misspelt} .known: "):
        WorkerConfig.from_json(json.dumps(config))


def test_a_config_key_beside_the_whole_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^the worker's config has unknown key\(s\) extra \(known: run_id, backend, "):
        WorkerConfig.from_json(json.dumps(worker_config(extra=1)))
    with pytest.raises(ValueError, match=r"^sweep must be a JSON object, not \[\]$"):
        WorkerConfig.from_json(json.dumps(worker_config(sweep=[])))


def _mypy(folder: Path, *sources: str) -> subprocess.CompletedProcess[str]:
    """mypy on copies in folder, preflight's other modules skipped (Any) but the wire types, so that it takes seconds."""
    if importlib.util.find_spec("mypy") is None:
        skip_or_fail("mypy is not installed (pip install -e '.[test]')")
    (folder / "mypy.ini").write_text(f"[mypy]\nmypy_path = {REPO}\nfollow_imports = skip\n"
                                     "[mypy-preflight.collective.wire]\nfollow_imports = normal\n")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", "cache", "--no-error-summary",
                           *sources], cwd=folder, capture_output=True, text=True, timeout=120, check=False)


def test_a_misspelt_config_key_is_a_type_error_at_both_ends(tmp_path: Path) -> None:
    builder, script = ((REPO / "preflight" / "collective" / name).read_text() for name in ("run.py", "host/config.py"))
    (tmp_path / "run.py").write_text(builder)
    (tmp_path / "config.py").write_text(script)
    whole = _mypy(tmp_path, "run.py", "config.py")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    # The orchestrator writes neighbor_ring, and the host script reads it: each is an error of its own.
    assert builder.count('"neighbour_ring":') == 1 and script.count('data["neighbour_ring"]') == 1
    (tmp_path / "run.py").write_text(builder.replace('"neighbour_ring":', '"neighbor_ring":'))
    (tmp_path / "config.py").write_text(script.replace('data["neighbour_ring"]', 'data["neighbor_ring"]'))
    misspelt = _mypy(tmp_path, "run.py", "config.py")
    errors: dict[str, list[str]] = {}
    for line in misspelt.stdout.splitlines():
        if ": error: " in line:
            errors.setdefault(line.split(":")[0], []).append(line.split(": error: ")[1])
    # run.py: the extra key and the one it leaves missing; the worker's config.py: the key the TypedDict has not.
    assert sorted(errors) == ["config.py", "run.py"] and all("neighbor_ring" in " ".join(e) for e in errors.values()), misspelt.stdout
    assert misspelt.returncode == 1 and any("neighbour_ring" in e for e in errors["run.py"]), misspelt.stdout + misspelt.stderr


def who(rank: int, host: str, uuid: str | None = None, torch: str = "2.11.0", nccl: str | None = None) -> dict[str, Any]:
    return {"host": host, "hostname": host, "rank": rank, "local_rank": rank % 2, "gpu_uuid": uuid, "torch": torch, "nccl": nccl}


def test_identity_problems() -> None:
    healthy = [who(0, "h1", "GPU-a", nccl="2.27.3"), who(1, "h1", "GPU-b", nccl="2.27.3"), who(2, "h2", "GPU-c", nccl="2.27.3")]
    assert identity_problems(healthy) == []
    assert identity_problems([who(0, "h1"), who(1, "h1")]) == []  # gloo: no GPU, no NCCL

    shared = [who(0, "h1", "GPU-a"), who(1, "h1", "GPU-a"), who(2, "h2", "GPU-c")]
    (problem,) = identity_problems(shared)
    assert "GPU-a" in problem and "[0, 1]" in problem and "h1" in problem

    # One machine listed under two host names has the same GPU UUIDs under both.
    (problem,) = identity_problems([who(0, "h1", "GPU-a"), who(1, "h2", "GPU-a")])
    assert "h1, h2" in problem

    mixed = [who(0, "h1", "GPU-a", torch="2.11.0", nccl="2.27.3"), who(1, "h2", "GPU-b", torch="2.10.0", nccl="2.26.2")]
    problems = identity_problems(mixed)
    assert problems == ["torch versions differ between ranks: 2.10.0 on h2; 2.11.0 on h1",
                        "NCCL versions differ between ranks: 2.26.2 on h2; 2.27.3 on h1"]


# ---------------------------------------------------------------------------------------------------------------------
# Verification on tensors


def reference_payload(seed: int, rank: int, elements: int) -> list[int]:
    """The payload's hash in plain Python integers, to pin it independently of torch's integer arithmetic."""
    offset = ((seed * 1000003 + rank) * 0x9E3779B1) & 0xFFFFFFFF
    values = []
    for x in range(elements):
        v = ((x + offset) & 0xFFFFFFFF) * 0x2545F491 & 0xFFFFFFFF
        v ^= v >> 16
        v = v * 0x045D9F3B & 0xFFFFFFFF
        v ^= v >> 16
        values.append(v - (1 << 31))
    return values


def test_payload_differs_per_rank_and_element() -> None:
    import torch
    a, b = worker.payload(1234, 0, 4096), worker.payload(1234, 1, 4096)
    assert a.dtype == torch.int32 and a.numel() == 4096
    assert a.tolist() == reference_payload(1234, 0, 4096) and b.tolist() == reference_payload(1234, 1, 4096)
    assert torch.unique(a).numel() == 4096
    assert not torch.eq(a, b).any()
    assert not torch.equal(a, worker.payload(1235, 0, 4096))
    # Every byte position takes many values, so a stuck or flipped byte lane shows.
    lanes = a.view(torch.uint8).view(-1, 4)
    assert all(torch.unique(lanes[:, k]).numel() > 200 for k in range(4))


def test_count_wrong_is_exact_per_source_rank() -> None:
    import torch
    world, elements, seed = 4, 1000, 99
    good = torch.cat([worker.payload(seed, r, elements) for r in range(world)])
    assert worker.count_wrong(good, seed, world) == (0, {})

    received = good.clone()
    received[1 * elements + 5] += 1                 # one flipped value from rank 1
    received[3 * elements:3 * elements + 10] = good[3 * elements + 10:3 * elements + 20]  # 10 shifted elements from rank 3
    received[-1] ^= 1 << 31                         # sign bit of rank 3's last element
    assert worker.count_wrong(received, seed, world) == (12, {1: 1, 3: 11})

    swapped = torch.cat([good[elements:2 * elements], good[:elements], good[2 * elements:]])
    assert worker.count_wrong(swapped, seed, world) == (2 * elements, {0: elements, 1: elements})
    assert worker.count_wrong(good, seed + 1, world)[0] == world * elements
    with pytest.raises(ValueError, match="multiple of 3"):
        worker.count_wrong(good, seed, 3)


# ---------------------------------------------------------------------------------------------------------------------
# Without torch


def test_module_imports_without_torch() -> None:
    code = ("import sys\nimport preflight.collective.host.main\nfrom preflight import bundle\nw = bundle.load(bundle.WORKER)\n"
            "print(w.busbw_gbps('all_reduce', 10**9, 1.0, 8), 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1.75", "False"]


def test_bad_config_is_an_error_event_before_torch(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(bundle.text(bundle.WORKER))
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    bad = json.dumps(worker_config(backend="mpi"))
    result = subprocess.run([sys.executable, "-X", "importtime", str(tmp_path / "worker.py"), bad], env=env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 1
    # It gave up before importing torch: -X importtime lists every module the process imported, on stderr.
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "json" in imported and not {m for m in imported if m.split(".")[0] == "torch"}
    (event,) = parse_lines(result.stdout)
    assert event == {"event": "error", "phase": "init", "rank": 0, "local_rank": 0, "host": None,
                     "error": "ValueError: backend must be nccl or gloo, not 'mpi'", "t": event["t"]}


def test_watchdog_alone(tmp_path: Path) -> None:
    """Without torch: a phase past its deadline ends the process with 3 after a timeout event; so does a changed parent."""
    (tmp_path / "worker.py").write_text(bundle.text(bundle.WORKER))
    code = ("import os, sys, time; from worker import Output, Watchdog\n"
            "out = Output(sys.argv[1])\n"
            "parent = os.getppid() if sys.argv[2] == 'deadline' else -1\n"
            "dog = Watchdog(parent, lambda phase, s: out.emit({'event': 'timeout', 'phase': phase, 'deadline_s': s}))\n"
            "dog.start(); dog.arm('verify', 0.2); time.sleep(30)\n")
    for case, events in (("deadline", [{"event": "timeout", "phase": "verify", "deadline_s": 0.2}]), ("orphan", [])):
        begun = time.monotonic()
        result = subprocess.run([sys.executable, "-c", code, str(tmp_path / ".output.lock"), case], cwd=tmp_path,
                                capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 3, (case, result.stderr)
        assert parse_lines(result.stdout) == events
        assert time.monotonic() - begun < 5


# Stands in for torchrun: one rank in a session of its own (as torch elastic starts them), its events, then as told.
FAKE_TORCHRUN = """
import json, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
def emit(event):
    print("PREFLIGHT " + json.dumps({**event, "rank": 0, "local_rank": 0, "host": "h1", "pid": rank.pid}), flush=True)
emit({"event": "phase", "phase": "verify"})
if sys.argv[1] != "stuck":
    emit({"event": "result"})
if sys.argv[1] == "passes":
    rank.kill()
    sys.exit(0)
time.sleep(60)
"""


def process_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("case", "exit_code", "ended_by"), [
    ("passes", 0, None), ("stuck", 3, "rank 0 did not end 0.3 s after its verify deadline"),
    ("lingers", 3, "torchrun did not exit after every local rank had ended"),
])
def test_supervisor_cuts_what_a_rank_cannot(case: str, exit_code: int, ended_by: str | None, capfd: pytest.CaptureFixture[str]) -> None:
    """A rank frozen past its phase's deadline (its own watchdog cannot run) and a torchrun that lingers after its
    ranks ended are cut within the deadlines; the relayed events stay whole and nothing is left running."""
    config = WorkerConfig.from_json(json.dumps(worker_config(deadlines_s={**FAST_DEADLINES, "verify": 0.5, "finish": 0.5})))
    supervisor = worker.Supervisor(config, 1, [sys.executable, "-c", FAKE_TORCHRUN, case], grace_s=0.3)
    begun = time.monotonic()
    assert supervisor.run() == exit_code
    assert time.monotonic() - begun < 10
    assert supervisor.cut == ended_by
    events = parse_lines(capfd.readouterr().out)
    assert [e["event"] for e in events] == {"passes": ["phase", "result"], "stuck": ["phase", "timeout", "cut"],
                                            "lingers": ["phase", "result", "cut"]}[case]
    if case == "stuck":
        assert events[1] == {**events[1], "phase": "verify", "rank": 0, "host": "h1", "stuck": True, "deadline_s": 0.5}
    rank_pid = events[0]["pid"]
    give_up = time.monotonic() + 5
    while process_alive(rank_pid) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not process_alive(rank_pid)


def test_supervise_refuses_bad_usage(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(bundle.text(bundle.WORKER))
    for args in (["supervise"], ["supervise", "x", "{}", "--", "true"], ["supervise", "1", json.dumps(worker_config()), "true"]):
        result = subprocess.run([sys.executable, str(tmp_path / "worker.py"), *args],
                                capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 1 and "usage: worker.py supervise" in result.stderr
    for config, error in ((worker_config(backend="mpi"), "backend must be nccl or gloo, not 'mpi'"),
                          ({"backend": "gloo"}, "the worker's config lacks run_id, seed, host, deadlines_s, ")):
        result = subprocess.run([sys.executable, str(tmp_path / "worker.py"), "supervise", "1", json.dumps(config), "--", "true"],
                                capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 1 and result.stderr.startswith(f"worker.py supervise: {error}"), result.stderr
        assert result.stderr.count("\n") == 1


def test_event_lines_stay_whole_when_ranks_share_a_pipe(tmp_path: Path) -> None:
    """Lines far over PIPE_BUF from four processes at once on one pipe, as rank 0's result with every identity."""
    (tmp_path / "worker.py").write_text(bundle.text(bundle.WORKER))
    code = ("import sys; from worker import Output\n"
            "out = Output(sys.argv[1])\n"
            "for i in range(5):\n"
            "    out.emit({'event': 'result', 'rank': int(sys.argv[2]), 'i': i, 'identity': ['x' * 100] * 2000})\n")
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / ".output.lock"), str(rank)], cwd=tmp_path, stdout=write)
             for rank in range(4)]
    os.close(write)
    with os.fdopen(read, "rb") as f:
        text = f.read().decode()
    for proc in procs:
        assert proc.wait(timeout=30) == 0
    events = parse_lines(text)
    assert sorted((e["rank"], e["i"]) for e in events) == [(r, i) for r in range(4) for i in range(5)]
    assert len(text.splitlines()) == 20


# ---------------------------------------------------------------------------------------------------------------------
# Real torchrun runs with gloo on this machine


class Torchrun:
    """torchrun with the staged worker, stdout read line by line as it comes."""

    def __init__(self, folder: Path, config: dict[str, Any], nproc: int = NPROC, extra: tuple[str, ...] = (),
                 nodes: tuple[str, ...] = ("--standalone", "--nnodes", "1"), env: dict[str, str] | None = None) -> None:
        self.folder = folder
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", **(env or {})}
        argv = [sys.executable, "-m", "torch.distributed.run", *nodes, "--local-addr", "127.0.0.1",
                "--nproc-per-node", str(nproc), *extra, str(folder / "worker.py"), json.dumps(config)]
        self.begun = time.monotonic()
        # Its own session, so that killing it here reaches torchrun's agent alone, as a killed ssh channel would.
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, sink), daemon=True)
                         for stream, sink in ((self.proc.stdout, self.lines), (self.proc.stderr, self._stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def events(self) -> list[dict[str, Any]]:
        return parse_lines("".join(self.lines))

    def wait(self, timeout: float) -> tuple[int, float]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for reader in self._readers:
            reader.join(timeout=10)
        return self.proc.returncode, time.monotonic() - self.begun

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if predicate(self.events()):
                return True
            if self.proc.poll() is not None:
                return bool(predicate(self.events()))
            time.sleep(0.05)
        return False


def workers_left(folder: Path) -> list[str]:
    result = subprocess.run(["pgrep", "-af", re.escape(str(folder / "worker.py"))], capture_output=True, text=True, timeout=10, check=False)
    return [line for line in result.stdout.splitlines() if line.strip()]


@pytest.fixture
def staged(tmp_path: Path) -> Iterator[Path]:
    """worker.py alone in a fresh folder, as the collective stages it on a host; no process of it outlives the test."""
    (tmp_path / "worker.py").write_text(bundle.text(bundle.WORKER))
    yield tmp_path
    for line in workers_left(tmp_path):
        os.kill(int(line.split()[0]), signal.SIGKILL)


def by_rank(events: list[dict[str, Any]], kind: str) -> dict[int, list[dict[str, Any]]]:
    table: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("event") == kind:
            table.setdefault(int(event["rank"]), []).append(event)
    return table


def test_real_run_verifies_every_byte_and_sweeps(staged: Path) -> None:
    run = Torchrun(staged, worker_config())
    code, elapsed = run.wait(timeout=90)
    events = run.events()
    assert code == 0, run.stderr[-3000:]
    print(f"\nreal gloo run, {NPROC} ranks: {elapsed:.2f} s wall")

    phases = by_rank(events, "phase")
    assert sorted(phases) == list(range(NPROC))
    for rank in range(NPROC):
        assert [e["phase"] for e in phases[rank]] == list(PHASES)
        assert all(e["host"] == "h1" and e["local_rank"] == rank and e["t"] >= 0 for e in phases[rank])

    results = by_rank(events, "result")
    assert sorted(results) == list(range(NPROC)) and all(len(r) == 1 for r in results.values())
    assert not by_rank(events, "error") and not by_rank(events, "timeout")
    for rank, (result,) in results.items():
        assert result["world_size"] == NPROC and result["problems"] == [] and result["gpu_uuid"] is None and result["nccl"] is None
        assert result["verify"] == {"bytes": 256 << 10, "elements": NPROC * (64 << 10), "wrong": 0, "wrong_by_source_rank": {}}
        assert [(row["op"], row["bytes"]) for row in result["sweep"]] == [
            ("all_gather", 65536), ("all_gather", 262144), ("all_reduce", 65536), ("all_reduce", 262144)]
        for row in result["sweep"]:
            assert row["time_us"] > 0 and row["algbw_GBps"] > 0 and row["busbw_GBps"] > 0
            factor = bus_factor(row["op"], NPROC)
            assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor, rel=1e-3, abs=1e-6)
        assert set(result["phases_s"]) == set(PHASES)
        assert (result["identity"] is None) == (rank != 0)
    identity = results[0][0]["identity"]
    assert [who["rank"] for who in identity] == list(range(NPROC))
    assert {who["torch"] for who in identity} == {results[0][0]["torch"]}
    assert not any(line.startswith(EVENT_PREFIX) and not parse_lines(line) for line in run.lines)
    assert workers_left(staged) == []


def test_the_compute_slices_are_spread_over_the_launch(staged: Path) -> None:
    """One slice per repeat: the first in the compute phase, the next at the end of the neighbour test, the third at the
    end of the sweep, each after a barrier: three moments of the host's load, not one (COMPUTE_POINTS)."""
    run = Torchrun(staged, worker_config(compute_s=0.6, repeats=3))
    code, _elapsed = run.wait(timeout=90)
    assert code == 0, run.stderr[-3000:]
    for rank, (result,) in by_rank(run.events(), "result").items():
        compute, phases = result["compute"], result["phases_s"]
        assert len(compute["slices_tflops"]) == 3 and all(rate > 0 for rate in compute["slices_tflops"]), (rank, compute)
        # Each slice's wait for a CPU, from the matmul thread's schedstat (this machine's kernel keeps it).
        assert len(compute["slices_waited"]) == 3 and all(0 <= w <= 1 for w in compute["slices_waited"]), (rank, compute)
        assert compute["iters"] >= 3 and compute["seconds"] >= 0.6 * 0.99 and compute["tflops"] > 0, (rank, compute)
        # Each point holds its own slice (a third of compute_s): the compute phase no longer holds all three.
        assert phases["compute"] < 0.4 and phases["neighbours"] >= 0.2 * 0.99 and phases["sweep"] >= 0.2 * 0.99, (rank, phases)
    assert COMPUTE_POINTS == ("compute", "neighbours", "sweep") and set(COMPUTE_POINTS) <= set(PHASES)


def test_plateau_needs_two_flat_doublings_in_a_row() -> None:
    assert not plateaued([1.0, 1.01])  # three sizes at least
    assert plateaued([1.0, 1.02, 1.03])
    assert not plateaued([1.0, 1.5, 1.52])  # the last doubling still gained 50%: one flat step is noise
    assert not plateaued([1.0, 1.01, 1.2])
    assert plateaued([0.5, 0.9, 1.0, 0.98, 1.01])
    assert plateaued([1.0, 0.7, 0.6])  # falling is not gaining


def test_adaptive_sweep_times_its_iterations_and_every_rank_measures_the_same_sizes(staged: Path) -> None:
    """A real run asked for 1000 iterations of each of 14 sizes: the time budget holds each size to a fraction of a
    second, and every rank measures the same sizes (where the sweep stops is decided on the slowest rank's figure, the
    same on every rank: a rank that went on alone would hang in its next collective). Gloo on this loopback is still
    gaining at 8 MiB, so the sizes run to the end here; the plateau rule itself is the test above."""
    sizes = [1024 << k for k in range(0, 14)]  # 1 KiB to 8 MiB
    config = worker_config()
    config["sweep"] = {"sizes": sizes, "ops": ["all_reduce"], "warmup": 1, "iters": 1000, "time_per_size_s": 0.02}
    run = Torchrun(staged, config)
    code, _elapsed = run.wait(timeout=90)
    assert code == 0, run.stderr[-3000:]
    results = by_rank(run.events(), "result")
    measured = {rank: [row["bytes"] for row in result["sweep"]] for rank, (result,) in results.items()}
    assert len({tuple(m) for m in measured.values()}) == 1, measured
    (done,) = {tuple(m) for m in measured.values()}
    assert len(done) >= 3 and list(done) == sizes[:len(done)]
    # 1000 iterations a size take milliseconds each here: over a minute without the budget.
    assert all(result["phases_s"]["sweep"] < 20 for (result,) in results.values()), [r["phases_s"] for (r,) in results.values()]


def test_adaptive_sweep_stops_growing_after_a_size_whose_iteration_took_twenty_budgets(staged: Path) -> None:
    """A time budget of 10 us a size: 1 MiB all_reduces on this loopback take a millisecond or more, over 20 budgets, so
    each op stops after its first size, where the plateau rule alone measures three at least."""
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    config = worker_config()
    config["sweep"] = {"sizes": sizes, "ops": ["all_reduce", "all_gather"], "warmup": 1, "iters": 5, "time_per_size_s": 0.00001}
    run = Torchrun(staged, config)
    code, _elapsed = run.wait(timeout=90)
    assert code == 0, run.stderr[-3000:]
    for (result,) in by_rank(run.events(), "result").values():
        assert [(row["op"], row["bytes"]) for row in result["sweep"]] == [("all_reduce", 1 << 20), ("all_gather", 1 << 20)]


def test_a_rank_whose_peers_never_come_is_cut_at_the_init_deadline(staged: Path) -> None:
    port = free_port()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "GLOO_SOCKET_IFNAME": "lo"}
    config = worker_config(deadlines_s={**FAST_DEADLINES, "init": 1.5})
    result = subprocess.run([sys.executable, str(staged / "worker.py"), json.dumps(config)], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 3, result.stderr[-2000:]
    phase, timeout = parse_lines(result.stdout)
    assert phase["event"] == "phase" and phase["phase"] == "init"
    assert timeout == {"event": "timeout", "phase": "init", "rank": 0, "local_rank": 0, "host": "h1", "deadline_s": 1.5,
                       "t": timeout["t"], "pid": timeout["pid"]}
    assert 1.5 - 0.002 <= timeout["t"] - phase["t"] < 2.5  # the event times are rounded to the millisecond


def test_a_rank_that_fails_init_stops_its_peers_at_once(staged: Path) -> None:
    """Two torchrun nodes on loopback; node b's gloo is bound to an interface this machine lacks, so its rank fails in
    init and never joins. Node a's ranks hear of it through torchrun's store and stop in seconds, naming it, instead of
    waiting out the 30 s init deadline."""
    port = free_port()

    def node(host: str, is_host: int, interface: str) -> Torchrun:
        nodes = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "peers",
                 "--rdzv-conf", f"is_host={is_host}")
        return Torchrun(staged, worker_config(host=host), nproc=2, nodes=nodes, env={"GLOO_SOCKET_IFNAME": interface})

    good, bad = node("a", 1, "lo"), node("b", 0, "preflight-none0")
    (good_code, good_s), (bad_code, _bad_s) = good.wait(timeout=90), bad.wait(timeout=90)
    print(f"\nthe peers of a rank that failed init stopped {good_s:.2f} s after their torchrun started")
    # torchrun stops a failed rank's siblings at once: whichever of a node's ranks had begun may have spoken.
    failed = {e["rank"]: e for e in bad.events() if e.get("event") == "error" and "after" not in e}
    stopped = [e for e in good.events() if e.get("event") == "error"]
    assert bad_code == 1 and failed and all("preflight-none0" in e["error"] for e in failed.values()), bad.stderr[-3000:]
    assert good_code == 1 and stopped, good.stderr[-3000:]
    assert "terminate called" not in bad.stderr + good.stderr  # no rank aborts on its way out
    for event in stopped:
        assert event["phase"] == "init" and event["host"] == "a"
        after = event["after"]
        # The first of b's ranks to fail is the one every peer names, with its own error line.
        assert after == {key: failed[after["rank"]][key] for key in ("rank", "host", "phase", "error")}
        assert event["error"] == f"stopped: rank {after['rank']} on b failed in init"
    assert not [e for e in good.events() + bad.events() if e.get("event") == "timeout"]
    # Torch's import and torchrun's rendezvous included: far inside the 30 s init deadline it used to wait out.
    assert good_s < FAST_DEADLINES["init"]
    assert workers_left(staged) == []


def test_watchdog_cuts_a_phase_at_its_deadline(staged: Path) -> None:
    config = worker_config(deadlines_s={**FAST_DEADLINES, "sweep": 0.001},
                           sweep={"sizes": [64 << 20], "ops": ["all_reduce"], "warmup": 2, "iters": 20, "time_per_size_s": None})
    # A slow monitor leaves every rank the time to reach its own deadline before the agent stops the group.
    run = Torchrun(staged, config, extra=("--monitor-interval", "3"))
    code, elapsed = run.wait(timeout=90)
    print(f"\nwatchdog run: {elapsed:.2f} s wall")
    assert code != 0
    timeouts = by_rank(run.events(), "timeout")
    assert sorted(timeouts) == list(range(NPROC)), run.stderr[-3000:]
    for (event,) in timeouts.values():
        assert event["phase"] == "sweep" and event["deadline_s"] == 0.001 and event["host"] == "h1"
    assert not by_rank(run.events(), "result")
    # torchrun's failure table lists each rank's exit code.
    assert len(re.findall(r"^\s*exitcode\s+: 3\b", run.stderr, re.MULTILINE)) == NPROC
    assert elapsed < 30
    assert workers_left(staged) == []


def test_workers_die_with_torchrun(staged: Path) -> None:
    # A sweep that would run for minutes: the workers are surely alive when the agent dies.
    config = worker_config(deadlines_s={**FAST_DEADLINES, "sweep": 300.0},
                           sweep={"sizes": [16 << 20], "ops": ["all_reduce"], "warmup": 0, "iters": 100000, "time_per_size_s": None})
    run = Torchrun(staged, config)
    try:
        assert run.wait_for(lambda events: len(by_rank(events, "phase")) == NPROC and
                            all(e[-1]["phase"] == "sweep" for e in by_rank(events, "phase").values()), timeout=60), run.lines
        assert len(workers_left(staged)) == NPROC + 1  # the agent and its workers
        killed = time.monotonic()
        os.kill(run.proc.pid, signal.SIGKILL)
        while workers_left(staged) and time.monotonic() - killed < 5:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed
        print(f"\nworkers gone {gone_after:.2f} s after the agent was killed")
        assert workers_left(staged) == []
    finally:
        run.wait(timeout=10)
