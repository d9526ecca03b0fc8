"""Host scripts built from modules: a stage's host modules and the shared helpers (preflight/hostlib) joined into the one
file that is sent to a host.

A host runs one file (``python3 -`` on stdin, or a file staged in a folder), with its own python and nothing of
preflight installed, so its modules cannot import each other there. Here they are ordinary modules of the package, which
import each other with ``from preflight.X import name`` and are type-checked and tested as such; ``text`` joins them,
in the order a script lists them, into one namespace:

- each module's docstring and ``from __future__ import annotations`` go (the bundle has one of each, the last module's
  docstring, since the last module is the entry point);
- each top-level ``from preflight.X import ...`` goes, as X's names are already defined above it in the bundle;
- a top-level ``import`` line already written by an earlier module goes; every other line stays as it is, comments too.

The join reads lines, not syntax trees: parsing the facts probe costs 34 ms on a 2-core VM, as much as `preflight gate`'s
spare start-up. ``problems`` parses the modules to prove that this line join is sound (imports resolve to modules above
in the same script, no name is defined twice, no preflight import hides in a function); the tests run it on every script.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ast

PACKAGE = Path(__file__).resolve().parent
_FUTURE = "from __future__ import annotations"


@dataclass(frozen=True)
class HostScript:
    """One file sent to hosts, and the modules it is joined from."""

    name: str  # a word for the script in messages and in the bundle module's name (facts, mesh, worker, storage)
    modules: tuple[str, ...]  # paths under preflight/, dependencies first; the last is the entry point


def _module_name(path: str) -> str:
    return "preflight." + path.removesuffix(".py").replace("/", ".")


def _docstring_end(lines: list[str]) -> int:
    """The index of the first line after the module's docstring (0 when it has none)."""
    if not lines or not lines[0].startswith('"""'):
        return 0
    if lines[0].count('"""') >= 2 and len(lines[0].strip()) > 3:
        return 1
    return next(i for i, line in enumerate(lines[1:], 1) if line.rstrip().endswith('"""')) + 1


def _join(script: HostScript) -> str:
    parts: list[str] = []
    written: set[str] = set()
    docstring: list[str] = []
    for path in script.modules:
        lines = (PACKAGE / path).read_text(encoding="utf-8").splitlines()
        start = _docstring_end(lines)
        docstring = lines[:start]
        kept: list[str] = []
        skipping = False
        for line in lines[start:]:
            if skipping:
                skipping = not line.rstrip().endswith(")")
                continue
            if line == _FUTURE:
                continue
            if line.startswith("from preflight.") or line.startswith("from preflight import"):
                skipping = line.rstrip().endswith("(")
                continue
            if line.startswith(("import ", "from ")):
                if line in written:
                    continue
                written.add(line)
            kept.append(line)
        parts.append(f"# ---- preflight/{path} ----\n" + "\n".join(kept).strip("\n"))
    head = "\n".join(docstring)
    return f"{head}\n\n{_FUTURE}\n\n" + "\n\n\n".join(parts) + "\n"


FACTS = HostScript("facts", ("hostlib/guard.py", "hostlib/files.py", "hostlib/cgroup.py", "hostlib/wire.py",
                             "probe/constants.py", "probe/parse.py", "probe/readings.py", "probe/host.py", "probe/gpu.py",
                             "probe/net.py", "probe/machine.py", "probe/main.py"))
MESH = HostScript("mesh", ("hostlib/guard.py", "hostlib/wire.py",
                           *(f"connectivity/mesh/{name}.py" for name in ("sockets", "registry", "prober", "main"))))
STORAGE = HostScript("storage", ("hostlib/guard.py", "hostlib/wire.py", "storage/probe.py"))
WORKER = HostScript("worker", ("hostlib/guard.py", "hostlib/files.py", "hostlib/cgroup.py", *(f"collective/host/{name}.py" for name in
                    ("events", "plans", "config", "output", "tensors", "traffic", "rank", "supervisor", "ranks", "main"))))
SCRIPTS = (FACTS, MESH, STORAGE, WORKER)


@cache
def text(script: HostScript) -> str:
    """The file sent to hosts: script's modules joined, built once per process."""
    return _join(script)


# The oldest python a host script runs on: tests/test_probe.py holds every host module to its grammar and names.
OLDEST_PYTHON = (3, 8)


@cache
def version_gated(script: HostScript) -> str:
    """The script as the first command on a host sends it (``python3 -``). An older python compiles the whole file
    before running any of it, and stops with a bare "SyntaxError: invalid syntax" at the first newer construct; these
    few lines, which every python from 2.6 on compiles, say instead which python it is and what the scripts need.
    Built once per process, as text() is: a check sends it to every host."""
    version = ".".join(map(str, OLDEST_PYTHON))
    return ("import sys\n"
            f"if sys.version_info < {OLDEST_PYTHON!r}:\n"
            f"    sys.stderr.write('Python %s; preflight\\'s host scripts need {version} or newer\\n' % sys.version.split()[0])\n"
            "    sys.exit(3)\n"
            f"exec(compile({text(script)!a}, '<preflight {script.name}>', 'exec'))\n")


def load(script: HostScript) -> types.ModuleType:
    """The bundle as a module (not run as __main__), for tests that call the functions the hosts run."""
    name = f"preflight_bundle_{script.name}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = f"<{script.name} bundle>"
    # dataclasses look their module up in sys.modules while the class body runs.
    sys.modules[name] = module
    try:
        exec(compile(text(script), module.__file__, "exec"), module.__dict__)  # noqa: S102 - the package's own modules
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _defined(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (imports of preflight aside)."""
    import ast

    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def problems(script: HostScript) -> list[str]:
    """Why the line join of script would not behave as its modules do, one line each; [] when it is sound."""
    import ast  # only the tests ask: the module is 2 ms of a command's start-up

    found: list[str] = []
    owner: dict[str, str] = {}
    for index, path in enumerate(script.modules):
        source = (PACKAGE / path).read_text(encoding="utf-8")
        tree = ast.parse(source)
        if _FUTURE not in source.splitlines():
            found.append(f"{path}: no `{_FUTURE}` line")
        earlier = {_module_name(p): p for p in script.modules[:index]}
        for statement in tree.body:
            if isinstance(statement, ast.If) and isinstance(statement.test, ast.Compare) and index < len(script.modules) - 1 and \
                    isinstance(statement.test.left, ast.Name) and statement.test.left.id == "__name__":
                found.append(f"{path}:{statement.lineno}: only the last module may run as __main__")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "preflight" for a in node.names):
                found.append(f"{path}:{node.lineno}: `import preflight...`: import names with `from preflight.X import`")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "preflight":
                top = node in tree.body
                if top and node.module not in earlier:
                    found.append(f"{path}:{node.lineno}: imports {node.module}, which is not above it in the {script.name} script")
                elif not top and not _in_type_checking(tree, node):
                    found.append(f"{path}:{node.lineno}: a preflight import below the top level stays in the bundle")
                elif top:
                    other = ast.parse((PACKAGE / earlier[str(node.module)]).read_text(encoding="utf-8"))
                    found += [f"{path}:{node.lineno}: {a.name} is not defined at the top of {node.module}"
                              for a in node.names if a.name not in _defined(other)]
                    found += [f"{path}:{node.lineno}: `as {a.asname}`: the bundle has one namespace, so no renaming"
                              for a in node.names if a.asname and a.asname != a.name]
            elif isinstance(node, ast.Global):
                found.append(f"{path}:{node.lineno}: `global`: rebinding a name differs between the modules and the bundle")
        for name in sorted(_defined(tree) - {"TYPE_CHECKING"}):
            if name in owner:
                found.append(f"{path}: {name} is defined in {owner[name]} too, and the bundle has one namespace")
            owner.setdefault(name, path)
    try:
        compile(text(script), script.name, "exec")
    except SyntaxError as e:
        found.append(f"the {script.name} bundle does not compile: line {e.lineno}: {e.msg}")
    return found


def _in_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    import ast

    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               and any(child is target for statement in node.body for child in ast.walk(statement))
               for node in tree.body)


def main(argv: list[str]) -> int:
    """``python3 -m preflight.bundle NAME``: print the named script's bundle, as a host receives it."""
    by_name = {script.name: script for script in SCRIPTS}
    if len(argv) != 1 or argv[0] not in by_name:
        print(f"usage: python3 -m preflight.bundle {{{','.join(by_name)}}}", file=sys.stderr)
        return 2
    sys.stdout.write(text(by_name[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
