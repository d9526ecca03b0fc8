"""Write preflight/schemas/spec.schema.json, report.schema.json and launch.schema.json from the types: the config's
dataclasses (spec.PreflightConfig), the report's TypedDicts (report_shape.Report, each stage's section in its package)
and the launch document's (contracts.LaunchDocument).

    python3 -m preflight.schemas_gen           # write all three
    python3 -m preflight.schemas_gen --check   # exit 1, naming each, when a checked-in schema is not what the types give

A developer's command rather than a `preflight` subcommand: operators never run it, and the command line's parser should
not import every stage's types. tests/test_schemas_gen.py runs --check's comparison, so CI fails on a stale schema.

How a type becomes a schema:
- str, int, float, bool: their JSON types; an Enum or a Literal: its values; ``X | None``: oneOf null and X (the
  config's error messages name X's complaint); list[X]: an array; dict[str, X]: an object of X values.
- A dataclass or a TypedDict: an object in $defs under its class name, additionalProperties false; every dataclass
  field is required (a composed config holds them all), a TypedDict's required keys are required.
- preflight.schema_marks in ``Annotated[...]``: ranges, formats, patterns, lengths, item counts, key formats.
- A TypedDict of preflight.facts is a host's facts, which schemas/facts.schema.json judges: here only an object.
- The description of a class is its docstring; of a field, the comment beside it, else the comment lines just above it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import io
import json
import sys
import tokenize
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union

from preflight import schema_marks as marks

SCHEMAS = Path(__file__).resolve().parent / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
Json = dict[str, Any]  # a JSON Schema node, as JSON


@cache
def _module_source(path: str) -> tuple[ast.Module, dict[int, str], set[int]]:
    """A module's tree, its comments by line, and the lines that hold nothing but a comment."""
    text = Path(path).read_text(encoding="utf-8")
    comments: dict[int, str] = {}
    alone: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
            if not token.line[:token.start[1]].strip():
                alone.add(token.start[0])
    return ast.parse(text), comments, alone


def _class_node(cls: type) -> tuple[ast.ClassDef | None, dict[int, str], set[int]]:
    tree, comments, alone = _module_source(inspect.getfile(cls))
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
    return node, comments, alone


def class_doc(cls: type) -> str | None:
    """The class's own docstring, on one line (a dataclass's generated __doc__ is none)."""
    node, _, _ = _class_node(cls)
    doc = ast.get_docstring(node) if node else None
    return " ".join(doc.split()) if doc else None


def _field_node(cls: type, name: str) -> tuple[type, ast.AnnAssign] | None:
    """The class (cls, or a base it inherits the field from) that declares the field, and the declaration."""
    for owner in _declaring(cls):
        node, _, _ = _class_node(owner)
        for statement in node.body if node else []:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.target.id == name:
                return owner, statement
    return None


def field_doc(cls: type, name: str) -> str | None:
    """The comment beside the field where cls, or a base it was declared in, declares it; else the comments just above."""
    found = _field_node(cls, name)
    if found is None:
        return None
    owner, statement = found
    _, comments, alone = _class_node(owner)
    end = statement.end_lineno or statement.lineno
    beside = [comments[n] for n in range(statement.lineno, end + 1) if n in comments and n not in alone]
    if beside:
        return " ".join(beside)
    above: list[str] = []
    line = statement.lineno - 1
    while line in alone:
        above.insert(0, comments[line])
        line -= 1
    return " ".join(above) or None


def _required(cls: type, name: str) -> bool:
    """Whether a TypedDict's key is required: its declaring class's totality (python 3.10 has no Required). Python's own
    __required_keys__ cannot tell on 3.10 and 3.11: there a TypedDict keeps no bases, so the source says which declared it."""
    found = _field_node(cls, name)
    return bool(getattr(found[0] if found else cls, "__total__", True))


def _declaring(cls: type) -> list[type]:
    """cls and the classes it inherits fields from, nearest first, as its source names them (a TypedDict keeps no bases
    at run time on python 3.11)."""
    found: list[type] = []
    todo = [cls]
    while todo:
        current = todo.pop(0)
        if current in found:
            continue
        found.append(current)
        node, _, _ = _class_node(current)
        scope = vars(sys.modules[current.__module__])
        todo += [base for b in (node.bases if node else []) if isinstance(b, ast.Name)
                 and isinstance(base := scope.get(b.id), type) and base.__module__.startswith("preflight")]
    return found


class _Writer:
    """One schema document: the root class, and each class it reaches under $defs."""

    def __init__(self) -> None:
        self.defs: dict[str, Json] = {}

    def of(self, hint: Any) -> Json:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Annotated:
            schema = self.of(args[0])
            for mark in args[1:]:
                _apply(schema, mark)
            return schema
        if origin in (Union, types.UnionType):
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                raise TypeError(f"{hint}: only X | None is a schema here")
            return {"oneOf": [{"type": "null"}, self.of(rest[0])]}
        if origin is Literal:
            return {"enum": list(args)}
        if origin is list:
            return {"type": "array", "items": self.of(args[0])}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.of(args[1])}
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return {"enum": [member.value for member in hint]}
        if hint in _SCALARS:
            return {"type": _SCALARS[hint]}
        if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or typing.is_typeddict(hint)):
            if hint.__module__ == "preflight.facts":
                return {"type": "object"}  # a host's facts: schemas/facts.schema.json judges them
            if hint.__name__ not in self.defs:
                self.defs[hint.__name__] = {}  # taken before its fields, so a class that reaches itself ends
                self.defs[hint.__name__] = self.object(hint)
            return {"$ref": f"#/$defs/{hint.__name__}"}
        raise TypeError(f"{hint!r} has no JSON Schema here")

    def object(self, cls: type) -> Json:
        hints = typing.get_type_hints(cls, include_extras=True)
        if dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls)]
            required = names
        else:
            names = list(hints)
            required = [n for n in names if _required(cls, n)]
        schema: Json = {"type": "object"}
        if doc := class_doc(cls):
            schema["description"] = doc
        schema["additionalProperties"] = False
        schema["required"] = required
        properties: Json = {}
        for name in names:
            prop = self.of(hints[name])
            doc = field_doc(cls, name)
            if doc and "description" not in prop:
                prop["description"] = doc
            properties[name] = prop
        schema["properties"] = properties
        return schema


_SCALARS: dict[object, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _apply(schema: Json, mark: object) -> None:
    # A mark on X | None applies to X: write it inside (Annotated[X, mark] | None); here it would land beside oneOf.
    if "oneOf" in schema:
        raise TypeError(f"{mark!r} marks an optional type: put it inside, Annotated[X, mark] | None")
    if isinstance(mark, marks.Range):
        if mark.minimum is not None:
            schema["exclusiveMinimum" if mark.above else "minimum"] = mark.minimum
        if mark.maximum is not None:
            schema["maximum"] = mark.maximum
    elif isinstance(mark, marks.Format):
        schema["format"] = mark.name
    elif isinstance(mark, marks.Pattern):
        schema["pattern"] = mark.regex
    elif isinstance(mark, marks.MinLength):
        schema["minLength"] = mark.count
    elif isinstance(mark, marks.Items):
        if mark.minimum is not None:
            schema["minItems"] = mark.minimum
        if mark.maximum is not None:
            schema["maxItems"] = mark.maximum
        if mark.unique:
            schema["uniqueItems"] = True
    elif isinstance(mark, marks.Keys):
        schema["propertyNames"] = {"format": mark.format}
    elif isinstance(mark, marks.KeyPattern):
        schema["propertyNames"] = {"pattern": mark.regex}
    elif isinstance(mark, marks.Requires):
        schema["required"] = list(mark.keys)
    elif isinstance(mark, marks.OneOf):
        schema.pop("type", None)
        schema["enum"] = list(mark.values)
    else:
        raise TypeError(f"{mark!r} is no mark of preflight.schema_marks")


def document(root: type, schema_id: str, title: str, more: Mapping[str, object] | None = None, rules: Json | None = None) -> Json:
    """The JSON Schema of root and every class it reaches; more: keys root does not declare, each optional, by type;
    rules: keywords across fields that no type can carry, added at the top."""
    writer = _Writer()
    body = writer.object(root)
    body["properties"].update({name: writer.of(hint) for name, hint in (more or {}).items()})
    head: Json = {"$schema": DRAFT, "$id": schema_id, "title": title}
    defs = {name: schema for name, schema in sorted(writer.defs.items())}
    return {**head, **body, **(rules or {}), "$defs": defs} if defs else {**head, **body, **(rules or {})}


def spec_schema() -> Json:
    """spec.schema.json: what the values of a composed config may be."""
    from preflight.spec import PreflightConfig

    return document(PreflightConfig, "https://preflight.dev/schemas/spec.schema.json", "preflight composed configuration")


def report_schema() -> Json:
    """report.schema.json: one run's report, every schema emit-launch still reads: report_shape.Report, and the section
    of each stage in the stage list that Report does not name (None where the run did not perform it)."""
    from preflight.report_shape import Report
    from preflight.stage_list import section_types

    more = {name: section | None for name, section in section_types().items() if name not in Report.__annotations__}
    return document(Report, "https://preflight.dev/schemas/report.schema.json", "preflight report", more)


# A rendezvous on loopback works on the master alone and hangs every other host: across hosts, no address may be one.
# A rule across fields (nnodes, and each address), so no type can carry it; emit refuses such a launch before this too.
_NO_LOOPBACK_ACROSS_HOSTS: Json = {
    "if": {"properties": {"nnodes": {"const": 1}}},
    "then": {},
    "else": {"description": "across hosts, a loopback address would work on the master and hang every other host",
             "properties": {"master": {"properties": {"addr": {"not": {"pattern": "^127\\."}}}},
                            "hosts": {"items": {"properties": {"local_addr": {"not": {"pattern": "^127\\."}}}}}}},
}


def launch_schema() -> Json:
    """launch.schema.json: what `preflight emit-launch --format json` prints (contracts.LaunchDocument)."""
    from preflight.contracts import LaunchDocument

    return document(LaunchDocument, "https://preflight.dev/schemas/launch.schema.json", "preflight launch",
                    rules=_NO_LOOPBACK_ACROSS_HOSTS)


GENERATED: dict[str, Callable[[], Json]] = {"spec": spec_schema, "report": report_schema, "launch": launch_schema}


def text(schema: Json) -> str:
    """A schema as the file holds it."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """The checked-in schemas that differ from what the types give."""
    return [name for name, make in GENERATED.items()
            if (SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8") != text(make())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m preflight.schemas_gen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a checked-in schema is stale")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"preflight/schemas/{name}.schema.json is stale: run python3 -m preflight.schemas_gen", file=sys.stderr)
        return 1 if names else 0
    for name, make in GENERATED.items():
        (SCHEMAS / f"{name}.schema.json").write_text(text(make()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
