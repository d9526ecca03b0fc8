"""The house rules that keep the package easy to extend, checked on its source: imports run downward only, modules
stay small, untyped JSON is rare and says why, and nothing points outside the repository (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "preflight"

# Floors, lowest first: a module may import its own floor and the floors below, never one above. The data flows one
# way (Spec -> Facts -> Findings -> Report -> Launch), and so do the imports.
FLOORS: list[set[str]] = [
    # what every stage reads: errors and exit codes, the typed config, facts, findings, the typed contracts, the facts
    # stage's products; the facts probe, shipped to hosts, which imports nothing of preflight; and each stage's shapes
    {"preflight", "errors", "resources", "paths", "spec", "facts", "rail_env", "contracts", "spread", "findings",
     "records", "config_cache", "history", "input_files", "probe", "hostlib", "bundle", "connectivity.mesh", "connectivity.wire",
     "connectivity.contracts", "collective.host", "collective.wire", "collective.contracts", "storage.probe", "storage.wire",
     "storage.contracts", "dcgm.contracts",
     # and what every stage's rendering of its report section shares (styles, figures, HTML pieces, SVG charts)
     "rendering", "svg_plot",
     # and the marks that carry what a value may be in its type (the schemas are written from them)
     "schema_marks"},
    {"compose", "schema_check", "host_list"},  # config files + overrides -> Spec: composed, a large host list beside Hydra, validated
    {"transport", "interrupt"},  # how commands reach hosts, and ending them on an interrupt
    {"gather", "this_machine", "ports", "stages"},  # the facts stage; what listens on a host's port; the Stage protocol
    {"checks", "launch"},  # facts -> findings; facts -> the launch
    {"connectivity", "collective", "dcgm", "storage"},  # the paths between hosts, the launch, DCGM's diagnostic, run for real on hosts
    # the stages in their order, each imported from its module; the report composed of their sections; the remedies of
    # every stage's codes
    {"stage_list", "report_shape", "catalogue"},
    {"report", "report_html", "prometheus"},  # findings -> the report; its HTML page and metrics
    {"pipeline", "emit", "gate", "agent", "diagnose", "sandbox", "schemas_gen"},  # the commands, and the schemas' writer
    {"cli", "__main__"},
]
# A stage's shapes: its host script, the types of what that script reads and prints, and its report section's types. A
# stage's package holds them (one package per stage), yet they sit on floor 0, below the stage's own code: the stage's
# code builds its section on them, and the script imports nothing of preflight when it runs. Each is a room of its own,
# so a shape may import what all stages share on floor 0 (storage.contracts -> spread) while the stage's code imports its
# shapes (storage -> storage.contracts). Only modules above the stages (report_shape) compose them:
# test_no_stage_package_is_imported_from_below holds that.
STAGE_SHAPES = {"connectivity.mesh", "connectivity.wire", "connectivity.contracts", "collective.host", "collective.wire",
                "collective.contracts", "storage.probe", "storage.wire", "storage.contracts", "dcgm.contracts"}
LONGEST_MODULE = 450
# Sent to hosts whole, so they cannot be split (paths under preflight/).
SHIPPED_AS_ONE_FILE = {"rail_env.py"}
UNTYPED_JSON_BUDGET = 20


def _room(module: str) -> str:
    """preflight.checks.cross -> checks; preflight.storage.wire -> storage.wire (a stage's shape); preflight -> preflight."""
    parts = module.split(".")
    shape = ".".join(parts[1:3])
    return shape if shape in STAGE_SHAPES else parts[1] if len(parts) > 1 else parts[0]


def _whole(module: str) -> str:
    """A stage's package seen whole, its shapes included (as a drawing of the package's structure shows it); any other
    module's room."""
    package = module.split(".")[1] if "." in module else module
    return package if package in {shape.split(".")[0] for shape in STAGE_SHAPES} else _room(module)


def _floor(room: str) -> int:
    for index, rooms in enumerate(FLOORS):
        if room in rooms:
            return index
    raise AssertionError(f"module room {room!r} is on no floor of tests/test_architecture.py: put it on one")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every preflight module the file imports, at the top or inside a function alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "preflight":
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "preflight")
    return found


def test_imports_never_run_upward() -> None:
    modules = _modules()
    upward = []
    for module, path in modules.items():
        here = _floor(_room(module))
        for imported in _imports(path, set(modules)):
            there = _floor(_room(imported))
            if there > here:
                upward.append(f"{module} (floor {here}) imports {imported} (floor {there})")
    assert upward == []


def test_no_stage_package_is_imported_from_below() -> None:
    # Seen whole, a stage's package stands on the stages' floor, its shapes included (as a drawing of the package's
    # structure shows it): a module below may import none of it, not even its shapes. A root module that composed a
    # stage's section into its own types would otherwise run up to that package, and round a circle through it.
    modules = _modules()
    upward = [f"{module} (floor {_floor(_whole(module))}) imports {imported} ({_whole(imported)}, floor {_floor(_whole(imported))})"
              for module, path in modules.items() for imported in _imports(path, set(modules))
              if _floor(_whole(imported)) > _floor(_whole(module))]
    assert upward == []


@pytest.mark.parametrize("room", [_room, _whole], ids=["rooms", "stage_packages_whole"])
def test_no_rooms_import_each_other_round_a_circle(room: Callable[[str], str]) -> None:
    # Floors keep imports from running upward; this keeps the rooms of one floor from leaning on each other, so each
    # can be read, and moved, on its own. A TYPE_CHECKING import counts: the reader still has to follow it. Seen whole
    # too, as the drawing of the package shows a stage: one stage's shapes importing another's, whose code imports the
    # first's shapes, is a circle between the two stages though no two rooms import each other.
    modules = _modules()
    leads: dict[str, set[str]] = {}
    for module, path in modules.items():
        leads.setdefault(room(module), set()).update(room(i) for i in _imports(path, set(modules)) if room(i) != room(module))

    def reached(room: str) -> set[str]:
        seen: set[str] = set()
        todo = list(leads.get(room, ()))
        while todo:
            if (nxt := todo.pop()) not in seen:
                seen.add(nxt)
                todo += leads.get(nxt, ())
        return seen

    circles = {room: sorted(r for r in reached(room) if room in reached(r)) for room in sorted(leads) if room in reached(room)}
    assert circles == {}


def test_floor_0_loads_nothing_above_it_when_it_runs() -> None:
    # The tests above read import statements. Python also runs a package's __init__ before any module of it, so a stage's
    # shape imported by the report's types would load whatever its package's __init__ imports: the stage's code, under
    # the types (and round a circle when that code imports the types). Each stage package's __init__ imports nothing.
    lowest = sorted(m for m in _modules() if _floor(_room(m)) == 0)
    code = (f"import sys\nfor m in {lowest!r}:\n    __import__(m)\n"
            "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('preflight', 'torch')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = result.stdout.split()
    assert set(lowest) <= set(loaded)
    packages = {f"preflight.{shape.split('.')[0]}" for shape in STAGE_SHAPES}
    assert [m for m in loaded if m not in packages and (m.split(".")[0] == "torch" or _floor(_room(m)) > 0)] == []
    modules = _modules()
    assert {package: sorted(_imports(modules[package], set(modules))) for package in packages} == {p: [] for p in packages}


def test_the_stage_list_imports_every_stage_plainly_from_below_it() -> None:
    from preflight.stage_list import STAGES, load_stage

    modules = _modules()
    imported = _imports(modules["preflight.stage_list"], set(modules))
    homes = {type(load_stage(name)).__module__ for name in STAGES}
    assert homes <= imported
    # So an import of the list from a stage's module is an upward one, which test_imports_never_run_upward fails on.
    assert all(_floor(_room(home)) < _floor(_room("preflight.stage_list")) for home in homes)
    by_string = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in modules.values()
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Attribute) and node.attr == "import_module"]
    assert by_string == []


def test_no_module_is_longer_than_the_house_allows() -> None:
    long = {path.relative_to(ROOT).as_posix(): n for path in _modules().values() if path.relative_to(PACKAGE).as_posix() not in
            SHIPPED_AS_ONE_FILE and (n := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST_MODULE}
    assert long == {}


def test_untyped_json_is_rare_and_says_why() -> None:
    untyped = [(path, number, line) for path in _modules().values() if PACKAGE / "probe" not in path.parents
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if "dict[str, Any]" in line]
    assert len(untyped) <= UNTYPED_JSON_BUDGET, [f"{p.name}:{n}" for p, n, _ in untyped]
    unexplained = [f"{p.relative_to(ROOT)}:{n}" for p, n, line in untyped if "#" not in line.split("dict[str, Any]", 1)[1]]
    assert unexplained == []


@pytest.mark.parametrize("folder", ["preflight", "tests", "bench", "docs", "playbooks", "conf"])
def test_nothing_points_outside_the_repository(folder: str) -> None:
    outside = re.compile(r"\.\./shared|DESIGN\.md")
    hits = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / folder).rglob("*")) if path.is_file() and path.suffix != ".pyc"
            and path != Path(__file__).resolve()
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1) if outside.search(line)]
    assert hits == []


def test_no_module_imports_another_s_private_names() -> None:
    private = [f"{path.relative_to(ROOT)}: {node.module}.{alias.name}" for path in _modules().values()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("preflight")
               for alias in node.names if alias.name.startswith("_") and alias.name != "__version__"]
    assert private == []


DOC = ROOT / "docs" / "architecture.md"
# What the page names in backticks that is not a file of the repository: a folder made at run time.
NOT_IN_THE_REPOSITORY = {"state_dir/history"}


def test_every_path_the_architecture_page_names_exists() -> None:
    named = set(re.findall(r"`([\w./-]+\.(?:py|json|yaml|md)(?:::\w+)?|[\w.-]+/[\w./-]*)`", DOC.read_text(encoding="utf-8")))
    missing = []
    for name in sorted(named - NOT_IN_THE_REPOSITORY):
        path, _, function = name.partition("::")
        if path.startswith("/"):
            continue  # a path on a host (/dev/shm, /dev/kmsg)
        if "/" in path.rstrip("/"):
            found = [p for p in (ROOT / path, PACKAGE / path) if p.exists()]
        else:  # a module or folder named alone: somewhere in the package, its tests or benchmarks
            found = [p for folder in (ROOT, PACKAGE) if (p := folder / path).exists()] + \
                [p for folder in ("preflight", "tests", "bench") for p in (ROOT / folder).rglob(path.rstrip("/"))]
        if not found or (function and f"def {function}(" not in found[0].read_text(encoding="utf-8")):
            missing.append(name)
    assert len(named) > 40 and missing == []


def test_the_architecture_page_s_code_families_and_stages_are_the_code_s() -> None:
    from preflight.checks.registry import REGISTRY
    from preflight.stage_list import STAGES, load_stage

    text = " ".join(DOC.read_text(encoding="utf-8").split())
    named = re.findall(r"`(\w+)` PF(\d\d?)x(?: and PF(\d\d?)x)?", text)
    families = {module: tuple(p for p in prefixes if p) for module, *prefixes in named}
    assert len(families) == 11, families
    for entry in REGISTRY:
        module = (entry.host_check or entry.cross_check).__module__.rsplit(".", 1)[-1]  # type: ignore[union-attr]
        assert all(code[2:].startswith(families[module]) for code in entry.codes), (module, entry.codes)

    def expanded(codes: str) -> set[str]:
        found = set()
        for low, high in re.findall(r"PF(\d{3})(?:-PF(\d{3}))?", codes):
            found |= {f"PF{n:03d}" for n in range(int(low), int(high or low) + 1)}
        return found

    rows = re.findall(r"\| (\w+)[^|]* \| `([\w/.]+)`[^|]* \| ([^|]*) \|", DOC.read_text(encoding="utf-8"))
    stages = {name: (home, codes) for name, home, codes in rows if name in STAGES}
    assert set(stages) == set(STAGES)
    for name, (home, codes) in stages.items():
        stage = load_stage(name)
        assert type(stage).__module__ == "preflight." + home.removesuffix(".py").replace("/", "."), name
        if name != "facts":  # "every check's": the families above
            assert expanded(codes) == set(stage.codes), name
