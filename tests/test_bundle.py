"""The host scripts' bundles (preflight.bundle): the line join behaves as the modules do, is the same every time, and
says what it cannot join; and the one CPU cgroup reader that the facts probe and the collective's worker share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from preflight import bundle
from preflight.hostlib.cgroup import cgroup_cpu_quota, cgroup_throttled_s

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", bundle.SCRIPTS, ids=lambda s: s.name)
def test_each_script_joins_soundly(script: bundle.HostScript) -> None:
    assert bundle.problems(script) == []
    # Built twice from the files, byte for byte the same: what a host gets does not depend on the run.
    assert bundle._join(script) == bundle._join(script) == bundle.text(script)
    assert bundle.text(script).count("from __future__ import annotations") == 1


@pytest.mark.parametrize("script", bundle.SCRIPTS, ids=lambda s: s.name)
def test_each_bundle_has_every_module_s_names_once(script: bundle.HostScript) -> None:
    loaded = bundle.load(script)
    for path in script.modules:
        module = __import__(bundle._module_name(path), fromlist=["_"])
        public = [n for n, v in vars(module).items() if callable(v) and getattr(v, "__module__", "") == module.__name__]
        assert public == [] or all(getattr(loaded, n).__qualname__ == getattr(module, n).__qualname__ for n in public), path


def test_the_bundle_command_prints_what_hosts_get() -> None:
    done = subprocess.run([sys.executable, "-m", "preflight.bundle", "facts"], capture_output=True, text=True, timeout=60,
                          check=True, cwd=ROOT)
    assert done.stdout == bundle.text(bundle.FACTS)
    wrong = subprocess.run([sys.executable, "-m", "preflight.bundle", "nope"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert wrong.returncode == 2 and wrong.stderr.startswith("usage:")


@pytest.mark.parametrize("modules, why", [
    ({"a.py": "from __future__ import annotations\n\nfrom preflight.b import f\n",
      "b.py": "from __future__ import annotations\n\n\ndef f() -> None:\n    pass\n"}, "preflight.b, which is not above it"),
    ({"a.py": "from __future__ import annotations\n\n\ndef f() -> None:\n    pass\n",
      "b.py": "from __future__ import annotations\n\nfrom preflight.a import g\n"}, "g is not defined at the top of preflight.a"),
    ({"a.py": "from __future__ import annotations\n\nX = 1\n", "b.py": "from __future__ import annotations\n\nX = 2\n"},
     "X is defined in a.py too"),
    ({"a.py": "from __future__ import annotations\n\n\ndef f() -> None:\n    pass\n",
      "b.py": "from __future__ import annotations\n\nfrom preflight.a import f as g\n"}, "no renaming"),
    ({"a.py": "from __future__ import annotations\n\n\ndef f() -> None:\n    from preflight.b import g\n",
      "b.py": "from __future__ import annotations\n"}, "a preflight import below the top level"),
    ({"a.py": "X = 1\n", "b.py": "from __future__ import annotations\n"}, "no `from __future__ import annotations`"),
    ({"a.py": "from __future__ import annotations\n\nif __name__ == '__main__':\n    pass\n",
      "b.py": "from __future__ import annotations\n"}, "only the last module may run as __main__"),
    ({"a.py": "from __future__ import annotations\n\nimport preflight.b\n", "b.py": "from __future__ import annotations\n"},
     "`import preflight...`"),
])
def test_what_the_line_join_cannot_join_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: dict[str, str],
                                                  why: str) -> None:
    for name, text in modules.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(bundle, "PACKAGE", tmp_path)
    found = bundle.problems(bundle.HostScript("test", ("a.py", "b.py")))
    assert any(why in line for line in found), found


def test_the_join_keeps_comments_and_drops_imports_written_already(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.py").write_text('"""A."""\n\nfrom __future__ import annotations\n\nimport os\n\n\ndef f() -> str:\n'
                                   "    return os.sep  # why\n")
    (tmp_path / "b.py").write_text('"""The entry point."""\n\nfrom __future__ import annotations\n\nimport os\n\n'
                                   "from preflight.a import (\n    f,\n)\n\nY = f() + os.sep\n")
    monkeypatch.setattr(bundle, "PACKAGE", tmp_path)
    script = bundle.HostScript("test", ("a.py", "b.py"))
    text = bundle._join(script)
    assert text.startswith('"""The entry point."""\n') and '"""A."""' not in text
    assert text.count("import os") == 1 and "# why" in text and "preflight" not in text.replace("# ---- preflight/", "")
    namespace: dict[str, object] = {}
    exec(compile(text, "test", "exec"), namespace)
    assert namespace["Y"] == "//"


# ---------------------------------------------------------------------------------------------------------------------
# The CPU cgroup reader


def test_a_container_without_a_cgroup_namespace_reads_its_own_group(tmp_path: Path) -> None:
    """/proc/self/cgroup names the host's path (/docker/abc) while the container's /sys/fs/cgroup is its own group: the
    walk up reaches that group. The collective's worker read the named path alone before, and saw no throttling there."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.stat").write_text("nr_periods 40\nnr_throttled 20\nthrottled_time 3000000000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cgroup").write_text("5:cpu,cpuacct:/docker/abc123\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup"), str(tmp_path)) == 3.0
    assert cgroup_cpu_quota(str(tmp_path / "cgroup"), str(tmp_path)) == 0.5
    (tmp_path / "cgroup").write_text("0::/docker/abc123\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 10\nthrottled_usec 250000\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup"), str(tmp_path)) == 0.25


def test_the_throttled_time_is_the_nearest_group_s(tmp_path: Path) -> None:
    """The process's own group counts before the groups above it; a group whose cpu.stat has no throttled counter (v2's
    root) is passed over."""
    own = tmp_path / "job" / "step"
    own.mkdir(parents=True)
    (own / "cpu.stat").write_text("usage_usec 5\nthrottled_usec 1000000\n")
    (tmp_path / "job" / "cpu.stat").write_text("usage_usec 9\nthrottled_usec 4000000\n")
    (tmp_path / "cgroup").write_text("0::/job/step\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup"), str(tmp_path)) == 1.0
    (own / "cpu.stat").write_text("usage_usec 5\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup"), str(tmp_path)) == 4.0
    (tmp_path / "cgroup").write_text("garbage\n")
    assert cgroup_throttled_s(str(tmp_path / "cgroup"), str(tmp_path)) is None
