"""A cluster file's host list, read beside Hydra instead of through it.

Composing a 12,000-host cluster file through Hydra and OmegaConf cost 25 s of CPU on a 2-core machine, about 2 ms a
host: OmegaConf's pure-Python YAML reader, and its typed merge, which deep-copies every host into a HostSpec node. Here
the chosen cluster file's ``hosts`` list is read with libyaml under OmegaConf's own YAML rules (its resolvers, its
refusal of a key given twice), each host filled in with HostSpec's defaults as that merge fills it, while Hydra composes
everything else from a stand-in of the file without the list. The plain config that comes out is the one Hydra's would
be, and the schema then judges it the same.

Only where nothing can tell the two apart: the file is the user's (never preflight's own), chosen with ``cluster=NAME``;
no override reaches ``cluster.hosts`` or moves a package; nothing in the file or the overrides interpolates (``${``);
the file has no defaults list and no merge keys where the list lives, and its ``hosts`` is a plain key of a block
mapping; every host is a mapping of HostSpec's keys whose values OmegaConf would keep as they are (no value it would
convert, such as a number where a string goes, nor one it would refuse or call missing). Anything else, and any failure
on the way, composes the whole config through Hydra as before, which names a problem in its own words.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from preflight.spec import MISSING, HostSpec

GROUP = "cluster"
# A cluster option as this reads it: folders and names of letters, digits, '_' and '-' (no '.': no '..' step, no suffix).
_OPTION = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*")
_INTERPOLATION = "${"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Aside:
    """A cluster file whose host list was read here: the folder of its stand-in (first on Hydra's search path), the
    option Hydra must take it for, and the hosts as plain JSON."""

    folder: Path  # holds cluster/OPTION.yaml: the file without its hosts
    option: str  # the cluster option (cluster=OPTION) that the stand-in is
    hosts: list[dict[str, object]]  # each host's plain JSON, every HostSpec key in declaration order

    def restored(self, container: dict[str, object], chosen: object) -> dict[str, object] | None:
        """The composed config with its hosts put back; None when Hydra did not take the stand-in (chosen: the cluster
        option it took) or something else gave it hosts."""
        cluster = container.get(GROUP)
        if chosen != self.option or not isinstance(cluster, dict) or cluster.get("hosts") != []:
            return None
        return {**container, GROUP: {**cluster, "hosts": self.hosts}}


@contextlib.contextmanager
def set_aside(overrides: Sequence[str], folders: Sequence[Path], users: Sequence[Path]) -> Iterator[Aside | None]:
    """The chosen cluster file's hosts read here and its stand-in written to a temporary folder (removed on exit); None
    where the file or the overrides could make this differ from Hydra's own composition. folders: the search path in
    order; users: those of them that are the user's."""
    found = _chosen_file(overrides, folders, users)
    read = _read(found[1]) if found else None
    if found is None or read is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="preflight-hosts-") as scratch:
        stand_in = Path(scratch) / GROUP / f"{found[0]}.yaml"
        stand_in.parent.mkdir(parents=True)
        stand_in.write_text(read[0], encoding="utf-8")
        yield Aside(folder=Path(scratch), option=found[0], hosts=read[1])


def _chosen_file(overrides: Sequence[str], folders: Sequence[Path], users: Sequence[Path]) -> tuple[str, Path] | None:
    """The option cluster=NAME of the overrides and the user's file Hydra reads for it; None when an override could
    change the hosts or how the file lands (a package, an interpolation), or the file is not the user's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    if any(_INTERPOLATION in override for override in overrides):
        return None
    option = None
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if override.package is not None or key == f"{GROUP}.hosts" or key.startswith(f"{GROUP}.hosts."):
            return None
        if key == GROUP:
            value = override.value()
            if override.type != OverrideType.CHANGE or not isinstance(value, str):
                return None
            option = value
    if option is None or not _OPTION.fullmatch(option):
        return None
    # Hydra takes an option from the first folder of its search path that has it.
    folder = next((f for f in folders if (f / GROUP / f"{option}.yaml").is_file()), None)
    return (option, folder / GROUP / f"{option}.yaml") if folder is not None and folder in users else None


def _read(path: Path) -> tuple[str, list[dict[str, object]]] | None:
    """The file's text without its host list, and the hosts as plain JSON; None where that could differ from Hydra's
    reading. The file passed preflight.input_files' bounds before this reads it."""
    from hydra.plugins.config_source import ConfigSource

    try:
        text = path.read_text(encoding="utf-8")
        # Hydra reads the header (# @package ...) from the first 512 characters.
        package = ConfigSource._get_header_dict(text[:512]).get("package")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if _INTERPOLATION in text or package not in (None, "_group_", GROUP, "_global_"):
        return None
    try:
        loaded = _load(text, ((GROUP,) if package == "_global_" else ()))
        if loaded is None:
            return None
        stand_in, document, hosts = loaded
        # The cut is checked: the stand-in reads as the file read does, with the list left out.
        if repr(_load_plain(stand_in)) != repr(document):
            return None
    except yaml.YAMLError:
        return None
    plain = _plain_hosts(hosts)
    return (stand_in, plain) if plain is not None else None


def _load(text: str, above: tuple[str, ...]) -> tuple[str, object, object] | None:
    """The text without the hosts entry of the block mapping at the path above (() for the file's top), the document
    read without it, and the hosts read; None when the entry is not a plain key of block mappings free of merge keys
    and defaults lists, or is not a list."""
    loader = _loader()(text)
    try:
        root = loader.get_single_node()
        if root is None or _entry(root, "defaults") != (None, None):
            return None
        mapping: yaml.Node = root
        following: int | None = len(text)
        for key in above:
            found, after = _entry(mapping, key)
            if found is None:
                return None
            mapping, following = found[1], (_line_start(text, after[0]) if after else following)
        found, after = _entry(mapping, "hosts")
        if found is None or not isinstance(found[1], yaml.SequenceNode):
            return None
        start = _line_start(text, found[0])
        end = _line_start(text, after[0]) if after else following
        if start is None or end is None:
            return None
        hosts = loader.construct_document(found[1])
        mapping.value.remove(found)
        document = loader.construct_document(root)
    finally:
        loader.dispose()
    return text[:start] + text[end:], document, hosts


def _entry(mapping: yaml.Node, key: str) -> tuple[tuple[yaml.Node, yaml.Node] | None, tuple[yaml.Node, yaml.Node] | None]:
    """The (key, value) nodes of key in a block mapping and the entry after it; (None, None) when the key is absent.
    A mapping that is not one in block style, or that has a merge key or the key twice, has no entry found."""
    if not isinstance(mapping, yaml.MappingNode) or mapping.flow_style or any(k.tag == _MERGE_TAG for k, _ in mapping.value):
        return None, None
    indexes = [i for i, (k, _) in enumerate(mapping.value) if k.tag == _STR_TAG and k.value == key]
    if len(indexes) != 1:
        return None, None
    i = indexes[0]
    return mapping.value[i], (mapping.value[i + 1] if i + 1 < len(mapping.value) else None)


def _line_start(text: str, key: yaml.Node) -> int | None:
    """Where the line of a key begins; None when something other than indentation comes before the key on it."""
    start = key.start_mark.index - key.start_mark.column
    return start if 0 <= start <= key.start_mark.index and not text[start:key.start_mark.index].strip(" ") else None


def _load_plain(text: str) -> object:
    loader = _loader()(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@cache
def _loader() -> type[yaml.SafeLoader]:
    """libyaml's parser (where PyYAML has it) with OmegaConf's rules for what a scalar is and for keys given twice."""
    from omegaconf._utils import get_yaml_loader

    rules = get_yaml_loader()
    base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[valid-type,misc]
        yaml_implicit_resolvers = rules.yaml_implicit_resolvers
        yaml_constructors = rules.yaml_constructors

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # YAML's mapping
            keys = [k.value for k, _ in node.value if k.tag == _STR_TAG]
            if len(keys) != len(set(keys)):  # OmegaConf's loader refuses this; let it say so
                raise yaml.constructor.ConstructorError(None, None, "a key given twice", node.start_mark)
            mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
            return mapping

    return Loader


def _plain_hosts(hosts: object) -> list[dict[str, object]] | None:
    """Each host with HostSpec's defaults filled in, its keys in declaration order, as OmegaConf's merge and
    to_container give it; None when a host is not a mapping of HostSpec's keys, lacks a key with no default, or has a
    value OmegaConf would convert or refuse."""
    rules = _rules()
    if rules is None or not isinstance(hosts, list):
        return None
    plain = []
    for host in hosts:
        if not isinstance(host, dict) or not all(isinstance(k, str) and k in rules for k in host):
            return None
        entry: dict[str, object] = {}
        for name, (kept, default) in rules.items():
            value = host[name] if name in host else default()
            if value is MISSING or not kept(value):
                return None
            entry[name] = list(value) if isinstance(value, list) else value
        plain.append(entry)
    return plain


@cache
def _rules() -> dict[str, tuple[Callable[[object], bool], Callable[[], object]]] | None:
    """Each HostSpec key: which values OmegaConf keeps as they are, and the default; None when a key's type is one this
    does not know."""
    hints = typing.get_type_hints(HostSpec)
    rules = {}
    for field in dataclasses.fields(HostSpec):
        kept = _kept(hints[field.name])
        if kept is None:
            return None
        if field.default_factory is not dataclasses.MISSING:
            default: Callable[[], object] = field.default_factory
        else:  # an enum's default is given back by its name, as to_container(enum_to_str=True) gives it
            default = _constant(field.default.name if isinstance(field.default, Enum) else field.default)
        rules[field.name] = (kept, default)
    return rules


def _constant(value: object) -> Callable[[], object]:
    return lambda: value


def _kept(hint: object) -> Callable[[object], bool] | None:
    """Which values of a field of this type OmegaConf keeps unchanged (a string that is no marker of a missing value,
    an int that is no bool, an enum by a member's name, which to_container gives back); None for a type not known here."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _kept(args[0])
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _kept(next(a for a in args if a is not type(None)))
        return None if inner is None else (lambda v: v is None or inner(v))
    if origin is list and len(args) == 1 and (item := _kept(args[0])) is not None:
        return lambda v: type(v) is list and all(item(x) for x in v)
    if hint is str:
        return lambda v: type(v) is str and v != MISSING
    if hint is int or hint is bool:
        return lambda v: type(v) is hint
    if isinstance(hint, type) and issubclass(hint, Enum):
        members = set(hint.__members__)
        return lambda v: type(v) is str and v in members and hint[v].name == v
    return None
