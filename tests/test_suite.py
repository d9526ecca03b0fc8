"""The suite's own rules, checked on its source and its collected tests, so that it stays a gate to trust: a test that
uses what this machine has only one of (loopback port 29500, the default sandbox `pf`) carries the marker that puts it
in the one work unit that may (conftest.py), and no two units can hold them at once."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import THIS_MACHINE_MARKER, THIS_MACHINE_UNIT, work_unit

TESTS = Path(__file__).resolve().parent
# Words that take a `check` off this machine's default port: a cluster of its own (its folder, another cluster than
# local), a port of its own, a command that stops before the collective.
OWN_CLUSTER = ("--config-dir",)
NO_COLLECTIVE = ("--cfg", "--help", "playbook=facts", "playbook=gate")
DEFAULT_PORT = 29500  # conf/network/default.yaml
# What runs a command line in the tests (the CLI in process, the console script, a subprocess), and the words that may
# stand before `check` on one.
RUNNERS = ("main", "preflight", "run", "Popen", "check_output", "check_call", "call")
PROGRAM_WORDS = ("preflight", "-m", "python3", "python")


@dataclass(frozen=True)
class Use:
    """A place in a test module's source that uses this machine's default port or default sandbox."""

    module: str
    line: int
    function: str | None  # the enclosing top-level function, None at module level
    what: str


def _words(node: ast.AST) -> list[str]:
    """Every literal string under node, an f-string as its literal start (f"network.master_port={port}" ->
    "network.master_port=")."""
    words = []
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            words.append(child.value)
        elif isinstance(child, ast.JoinedStr) and child.values and isinstance(child.values[0], ast.Constant):
            words.append(str(child.values[0].value))
    return words


def _check_on_default_port(words: list[str]) -> bool:
    """Whether a `check` with these words runs the collective on this machine's default port."""
    for word in words:
        if word in OWN_CLUSTER or word in NO_COLLECTIVE:
            return False
        if word.startswith("cluster=") and word != "cluster=local":
            return False
        if word.startswith("network.master_port=") and word != f"network.master_port={DEFAULT_PORT}":
            return False
    return True


def _arguments(node: ast.AST) -> list[ast.expr] | None:
    """The items of a command line: a list or tuple literal's elements, a call's positional arguments."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return node.elts
    if isinstance(node, ast.Call):
        return node.args
    return None


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_check_command(node: ast.AST, items: list[ast.expr]) -> bool:
    """Whether node is a `check` command line: a call of something that runs one, or a list or tuple whose first word
    is `check` (after the program's name); not a string "check" among others' values, such as a metric's label."""
    if isinstance(node, ast.Call) and _callee(node) not in RUNNERS:
        return False
    for item in items:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            if item.value == "check":
                return True
            if item.value not in PROGRAM_WORDS:
                return False
    return False


def _uses_here(node: ast.AST) -> str | None:
    """What node does with this machine's default port or sandbox, if anything."""
    items = _arguments(node)
    strings = [i.value for i in items or [] if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    if items is not None and _is_check_command(node, items) and _check_on_default_port(_words(node)):
        return "a `check` on this machine's default port 29500 (no cluster, port or playbook of its own)"
    if isinstance(node, ast.Call) and any(k.arg == "PREFLIGHT_CHECK_ARGS" for k in node.keywords) and _check_on_default_port(
            _words(node)):
        return "a job script's `check` on the default port 29500"
    # A shell's command line: a string given to `bash -c`, or one kept in a name to be run (not a message about it).
    shell = [w for w in _words(node) if "preflight check" in w] if "-c" in strings else []
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) and \
            "preflight check" in node.value.value:
        shell = [node.value.value]
    if any(_check_on_default_port(line.split()) for line in shell):
        return "a shell's `preflight check` on the default port 29500"
    if "sandbox" in strings and ("up" in strings or "down" in strings) and "--prefix" not in strings:
        return "`preflight sandbox up/down` of the default sandbox `pf`"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and ("sandbox_up(" in node.value or
                                                                          "sandbox_down(" in node.value):
        return "sandbox_up/sandbox_down: the default sandbox `pf`"
    if isinstance(node, ast.Call) and _callee(node) in ("sandbox_up", "sandbox_down"):
        return "sandbox_up/sandbox_down: the default sandbox `pf`"
    if isinstance(node, ast.Call) and _callee(node) in ("leftovers", "down_prefix") and not node.args and not node.keywords:
        return f"{_callee(node)}() of the default sandbox `pf`"
    if isinstance(node, ast.Call) and _callee(node) == "up" and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id == "Sandbox" and \
            not any(k.arg == "prefix" for k in node.keywords):
        return "Sandbox.up() of the default sandbox `pf`"
    return None


def uses_of_this_machine(path: Path) -> Iterator[Use]:
    """Every place in a test module that uses the default port or sandbox, with its top-level function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for top in tree.body:
        function = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        for node in ast.walk(top):
            what = _uses_here(node)
            if what is not None:
                yield Use(path.stem, getattr(node, "lineno", 0), function, what)


def _is_the_marker(node: ast.expr) -> bool:
    """pytest.mark.this_machine, alone or in a list."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_the_marker(e) for e in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == THIS_MACHINE_MARKER


def marked(path: Path) -> tuple[bool, set[str]]:
    """Whether the module's pytestmark has the marker, and the top-level functions and classes decorated with it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
                 and _is_the_marker(n.value) for n in tree.body)
    decorated = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and any(_is_the_marker(d) for d in n.decorator_list)}
    return module, decorated


def unmarked_uses(path: Path) -> list[Use]:
    """The uses of this machine's one-of-a-kind things in a test module that its markers do not cover. A use in a
    helper (not a test) needs the module's marker: any test may call the helper."""
    module, decorated = marked(path)
    if module:
        return []
    return [use for use in uses_of_this_machine(path)
            if not (use.function is not None and use.function.startswith(("test_", "Test")) and use.function in decorated)]


def test_every_use_of_this_machines_port_or_sandbox_is_marked() -> None:
    found = [use for path in sorted(TESTS.glob("*.py")) if path.name not in ("conftest.py", "test_suite.py")
             for use in unmarked_uses(path)]
    assert found == [], "mark these tests @pytest.mark.this_machine, or give them a port (network.master_port=0) or " \
                        f"a sandbox of their own (conftest.py): {found}"


def _write(path: Path, source: str) -> Path:
    path.write_text(source, encoding="utf-8")
    return path


def test_the_scan_finds_a_local_check_without_the_marker(tmp_path: Path) -> None:
    """The rule above can fail: a test that runs a local check on the default port, unmarked, is found."""
    source = (
        "import pytest\n"
        "def test_a(): preflight('check', '--json')\n"  # cluster=local, port 29500: found
        "def test_b(): main(['check', 'network.master_port=0'])\n"  # a free port
        "def test_c(): subprocess.run([exe, 'check', '--config-dir', d, 'cluster=x'])\n"  # a cluster of its own
        "def test_d(): preflight('check', 'playbook=facts')\n"  # no collective
        "def test_e(): subprocess.run(['bash', '-c', 'pip install . && preflight check'])\n"  # found
        "def test_e2(): pytest.fail('run `preflight check` first')\n"  # a message, not a command
        "def test_f(): job(PREFLIGHT_CHECK_ARGS=' '.join(FAST))\n"  # found
        "def test_g(): job(PREFLIGHT_CHECK_ARGS=f'network.master_port={port}')\n"
        "def test_h(): run('sandbox', 'up', '4')\n"  # found
        "def test_i(): assert leftovers() == []\n"  # found
        "def test_j(): assert leftovers('pt0101') == []\n"
        "def helper(): return [exe, 'check', 'network.master_port=29500']\n"  # found: in a helper any test may call
        "@pytest.mark.this_machine\n"
        "def test_k(): preflight('check')\n"
        "def test_l(): assert metrics_text(report, 'check') and ('command', 'check')\n"  # a label's value, not a command
    )
    uses = unmarked_uses(_write(tmp_path / "test_x.py", source))
    assert [(u.line, u.function) for u in uses] == [(2, "test_a"), (6, "test_e"), (8, "test_f"), (10, "test_h"), (11, "test_i"),
                                                    (13, "helper")], uses
    assert unmarked_uses(_write(tmp_path / "test_y.py", "import pytest\npytestmark = [pytest.mark.this_machine]\n" + source)) == []


def test_no_two_work_units_can_hold_the_default_port(request: pytest.FixtureRequest) -> None:
    """Every collected test marked this_machine runs in the one this-machine unit (xdist's loadgroup runs a unit on one
    worker, test after test), and no other test is put there."""
    items = request.session.items
    assert items, "the session's collected tests"
    for item in items:
        group = item.get_closest_marker("xdist_group")
        assert group is not None, item.nodeid
        unit = group.args[0] if group.args else group.kwargs["name"]
        assert unit == work_unit(item), item.nodeid
        assert (unit == THIS_MACHINE_UNIT) == (item.get_closest_marker(THIS_MACHINE_MARKER) is not None), item.nodeid


def plain_skips(path: Path) -> list[str]:
    """pytest's own ways to skip, used in a test module: a skip that CI cannot turn into a failure."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pytest" and \
                node.attr in ("skip", "importorskip", "xfail"):
            found.append(f"{path.name}:{node.lineno}: pytest.{node.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark" and \
                node.attr in ("skip", "skipif", "xfail"):
            found.append(f"{path.name}:{node.lineno}: pytest.mark.{node.attr}")
    return found


def test_every_skip_goes_through_skip_or_fail(tmp_path: Path) -> None:
    """conftest.skip_or_fail is the one way to skip: under PREFLIGHT_REQUIRE_SANDBOX=1 (CI) or PREFLIGHT_REQUIRE_GPU=1
    it fails instead, so a machine that lacks what a test needs cannot pass the run by skipping it."""
    found = [skip for path in sorted(TESTS.glob("*.py")) if path.name != "conftest.py" for skip in plain_skips(path)]
    assert found == [], "skip with conftest.skip_or_fail(why) (gpu=True for what only a GPU host has)"
    source = ("import pytest\n@pytest.mark.skipif(True, reason='x')\ndef test_a(): pytest.skip('y')\n"
              "def test_b(): pytest.importorskip('torch')\n")
    assert [s.split(": ", 1)[1] for s in plain_skips(_write(tmp_path / "test_x.py", source))] == [
        "pytest.mark.skipif", "pytest.skip", "pytest.importorskip"]
