"""Files a user hands preflight (config YAML on the search path, saved reports), read within bounds before a parser
that trusts them sees them: a size cap, strict UTF-8, a cap on YAML nodes after alias expansion and on an integer's
digits. Hydra and OmegaConf expand every alias into a copy (a file of nested aliases, nine lists of nine six deep, took
them more than two minutes), Python refuses an integer of more than 4300 digits with a ValueError, and a binary file
fails to decode: each is an InputError naming the file here instead, before any of them runs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import yaml

from preflight.errors import InputError, one_line

# One config file: a 100,000-host cluster's, at about 150 B a host, is some 15 MB.
MAX_CONFIG_BYTES = 32 << 20
# YAML values that aliases add once expanded (a value reached a second time through an alias counts again): a cluster
# file written out has none, nine lists of nine six deep add 597,870. Values written out are bounded by the size alone.
MAX_ALIAS_VALUES = 200_000
# Python's own limit for reading an integer from text (sys.get_int_max_str_digits' default); no config value comes near.
MAX_INTEGER_DIGITS = 4300
MAX_REPORT_BYTES = 256 << 20  # a saved report; 1,000 hosts' facts are tens of MB
_INT_TAG = "tag:yaml.org,2002:int"
# libyaml's parser where PyYAML was built with it: the pure-Python one took 4 s of the 12 s that composing a 4,000-host
# cluster took. Only the nodes are composed here, never constructed, so the two agree on what they accept.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_text(path: Path, limit: int, what: str) -> str:
    """path's whole text, refused when it is larger than limit bytes or not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(f"cannot read the {what} {path}: {one_line(e.strerror or e)}") from None
    if len(data) > limit:
        raise InputError(f"cannot read the {what} {path}: larger than {limit >> 10} KiB, preflight's limit for one")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"cannot read the {what} {path}: not UTF-8 text (byte {e.start} is {data[e.start]:#04x})") from None


def _expanded_nodes(root: yaml.Node, path: Path) -> int:
    """The nodes of a composed YAML document with every alias expanded, stopped once aliases add more than
    MAX_ALIAS_VALUES; an integer of more digits than MAX_INTEGER_DIGITS is refused where it is."""
    count = 0
    seen: set[int] = set()  # a node reached again was reached through an alias
    todo = [root]
    while todo:
        node = todo.pop()
        count += 1
        seen.add(id(node))
        if count - len(seen) > MAX_ALIAS_VALUES:
            raise InputError(f"cannot read the config file {path}: more than {MAX_ALIAS_VALUES} values added once its aliases are "
                             "expanded (nested aliases multiply): preflight's limit for one config file")
        if isinstance(node, yaml.ScalarNode):
            digits = sum(c.isalnum() for c in str(node.value)) if node.tag == _INT_TAG else 0
            if digits > MAX_INTEGER_DIGITS:
                raise InputError(f"cannot read the config file {path}: line {node.start_mark.line + 1}: an integer of {digits} digits; "
                                 f"preflight reads at most {MAX_INTEGER_DIGITS}")
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                todo += (key, value)
    return count


def check_config_file(path: Path) -> None:
    """Refuse, as an InputError naming path, a YAML config file that is too large, not UTF-8, malformed, or that
    expands into too many values or holds an integer Python will not read. Nothing is constructed: the walk is over
    the composed nodes, in which an alias is one shared node however often it is used."""
    stream = io.StringIO(_read_text(path, MAX_CONFIG_BYTES, "config file"))
    stream.name = str(path)  # YAML's own messages then say where
    loader = _LOADER(stream)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as e:
        raise InputError(f"cannot read the config file {path}: malformed YAML: {one_line(e)}") from None
    finally:
        loader.dispose()
    if root is not None:
        _expanded_nodes(root, path)


def check_config_folder(folder: Path) -> None:
    """check_config_file for every YAML file Hydra may read from folder (it reads *.yaml, in group subfolders)."""
    for path in sorted(folder.rglob("*.yaml")):
        if path.is_file():
            check_config_file(path)


def read_json_file(path: Path, what: str, limit: int = MAX_REPORT_BYTES) -> Any:  # any JSON, for the caller to check
    """The JSON document at path; one that is too large, not UTF-8, not JSON, too deeply nested or holding an integer
    Python will not read is an InputError naming path. A missing file raises FileNotFoundError for the caller to word."""
    if not path.exists():
        raise FileNotFoundError(path)
    text = _read_text(path, limit, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"cannot read the {what} {path}: not JSON: {one_line(e)}") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise InputError(f"cannot read the {what} {path}: {one_line(str(e).split(';')[0])}") from None
    except RecursionError:
        raise InputError(f"cannot read the {what} {path}: nested deeper than Python's JSON reader goes") from None
