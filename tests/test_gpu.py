"""NCCL on a real NVIDIA GPU host: one host, one rank (init with device_id, the verified all_gather, the sweep).

Skipped wherever torch sees no CUDA device, CI included. On a GPU host: ``PREFLIGHT_REQUIRE_GPU=1 python3 -m pytest -m gpu -s``
(the variable turns the skip into a failure there).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from conftest import skip_or_fail

from preflight.resources import load_schema

pytestmark = pytest.mark.gpu


def _cuda_devices() -> int:
    if not Path("/dev/nvidiactl").exists():
        return 0  # no NVIDIA driver: spare every test run torch's import
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_local_check_runs_the_nccl_collective_on_one_rank(tmp_path: Path) -> None:
    if _cuda_devices() == 0:
        skip_or_fail("no CUDA device here", gpu=True)
    exe = shutil.which("preflight")
    if exe is None:
        pytest.fail("the console script `preflight` is not installed (pip install -e .)")
    # One rank on the first GPU, the sweep up to 256 MiB: what one H100 proves without peers.
    result = subprocess.run([exe, "check", "--json", "cluster=local", "training.nproc_per_node=1",
                             "collective.sweep_max_bytes=268435456", f"state_dir={tmp_path}", "network.master_port=0"],
                            capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert result.stdout, result.stderr[-2000:]
    report = json.loads(result.stdout)
    jsonschema.validate(report, load_schema("report"))
    collective = report["collective"]
    print(json.dumps(collective, indent=1))  # the record this test exists for (-s shows it)
    assert collective["backend"] == "nccl", collective
    assert collective["status"] == "pass", collective["message"]
    assert collective["verify"]["wrong"] == 0 and collective["verify"]["ranks"] == 1
    assert {row["op"] for row in collective["sweep"]} == {"all_gather", "all_reduce"}
    assert all(row["algbw_mean_GBps"] > 0 for row in collective["sweep"])
