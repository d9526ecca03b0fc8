"""Compose the Spec: Hydra configs + overrides -> validated, typed PreflightConfig.

Bad input stops here, before anything touches a host, as an InputError whose message is one
line naming the key path and what is wrong.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from preflight import config_cache, host_list
from preflight.errors import InputError, one_line
from preflight.input_files import check_config_folder
from preflight.records import rail_interfaces, rails_declared
from preflight.resources import shipped_dir, user_config_dir
from preflight.schema_check import first_problem, schema_errors
from preflight.spec import HIGHEST_PORT, HostSpec, PreflightConfig, from_plain, highest_derived_port, register_configs

# Hydra and OmegaConf (0.4 s to import) are imported where composition needs them: a cached config needs neither.
if TYPE_CHECKING:
    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR_ENV = "PREFLIGHT_CONFIG_DIR"


@dataclass(frozen=True)
class Spec:
    """A validated configuration: the typed tree, its plain form, and a hash of it."""

    config: PreflightConfig
    plain: dict[str, Any]  # the same config as plain JSON: what the schema validates and the digests hash
    digest: str  # sha256 of the composed config, so a report can be matched to its config

    def group_digests(self) -> dict[str, str]:
        """sha256 of each config group that defines the job (JOB_GROUPS): emit-launch matches a report on these."""
        return {group: _sha256(self.plain[group]) for group in JOB_GROUPS}

    @property
    def master(self) -> HostSpec:
        """The master host, which validation made sure is in the cluster."""
        master = self.config.cluster.host(self.config.cluster.master)
        if master is None:
            raise InputError(f"cluster.master: {self.config.cluster.master!r} is not the name of a host in cluster.hosts")
        return master


# The groups that decide what a job is; the rest (ssh, collective, playbook, launch) decide how it is checked or emitted.
JOB_GROUPS = ("cluster", "pins", "network", "training", "thresholds")


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()



def _check_overrides(overrides: Sequence[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            (parsed,) = parser.parse_overrides([override])
        except HydraException:
            raise InputError(
                f"override {override!r} is not KEY=VALUE in Hydra's grammar "
                "(quote special characters: key='a b'; list items are key.0.field)"
            ) from None
        except ValueError as e:
            # The grammar takes an integer of any length; Python refuses to read one of more than 4300 digits.
            key = override.partition("=")[0].lstrip("+~")
            raise InputError(f"{key}: {one_line(str(e).split(';')[0])}") from None
        if parsed.is_sweep_override():
            # a,b (or choice(), range()) asks Hydra for one run per value: a list or a string with commas misspelled.
            raise InputError(f"{parsed.key_or_group}: {override.partition('=')[2]!r} is a sweep over several values, and "
                             "preflight makes one run (a list is [a,b]; a string with commas is quoted: 'a,b')")


# OmegaConf appends lines such as "    full_key: ..." and "    object_type=..." to its message.
OMEGACONF_DETAILS = re.compile(r"\n\s*(?:full_key|reference_type|object_type)[:=]")


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or ""
    msg = getattr(e, "msg", None) or str(e)
    # The message is what comes before OmegaConf's details. It quotes the value as given: a newline or a terminal's
    # escape sequence in it is shown escaped, as repr() shows it, never sent to the terminal.
    text = OMEGACONF_DETAILS.split(msg, maxsplit=1)[0].strip() or type(e).__name__
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"{key}: {one_line(text)}" if key else one_line(text)


# Hydra's words for a group option that no folder has ("Could not find 'cluster/nope'"), then the options it has, one a
# line after a tab. Like the other patterns on Hydra's and OmegaConf's messages here, tests/test_config.py holds it to
# the real message of the installed versions.
MISSING_CONFIG = re.compile(r"Could not find '([^']+)'")
AVAILABLE_OPTIONS = re.compile(r"Available options in '([^']+)':\n((?:\t.*\n?)*)")


def _missing_config_message(e: MissingConfigException) -> str:
    text = str(e)
    found = MISSING_CONFIG.search(text)
    options = AVAILABLE_OPTIONS.search(text)
    if found and "/" in found.group(1):
        group, _, name = found.group(1).rpartition("/")
        available = ", ".join(o.strip() for o in options.group(2).splitlines() if o.strip()) if options else ""
        hint = f" (available: {available})" if available else ""
        return f"{group}: no config named {name!r}{hint}"
    return one_line(text.splitlines()[0])


def _shadowed(user: Path, shipped: list[Path]) -> None:
    """Hydra takes a group option from the first folder that has it, and preflight's own come
    first: refuse a user file that would be silently ignored."""
    for path in sorted(user.glob("*/*.yaml")):
        relative = path.relative_to(user)
        if any((folder / relative).exists() for folder in shipped):
            raise InputError(f"{path}: preflight ships {relative.parent}={relative.stem} too; give yours another name")


def search_path(config_dir: str | None) -> tuple[Path, list[Path]]:
    """The primary config folder (preflight's conf/) and the folders searched after it."""
    shipped = [shipped_dir("conf"), shipped_dir("playbooks")]
    chosen = config_dir or os.environ.get(CONFIG_DIR_ENV)
    users: list[Path] = []
    if chosen:
        folder = Path(chosen).expanduser().resolve()
        if not folder.is_dir():
            source = "--config-dir" if config_dir else CONFIG_DIR_ENV
            raise InputError(f"{source}: {chosen!r} is not a folder")
        users.append(folder)
    default = user_config_dir()
    if default.is_dir() and default.resolve() not in users:
        users.append(default.resolve())
    for folder in users:
        _shadowed(folder, shipped)
    return shipped[0], [*users, shipped[1]]


def _compose(overrides: Sequence[str], config_dir: str | None, aside: Path | None = None) -> DictConfig:
    """Hydra's composition. aside: a folder searched before the user's (a cluster file's stand-in, preflight.host_list);
    Hydra's own node is then kept, for its choices to say which file it took."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    primary, extra = search_path(config_dir)
    searchpath = ",".join(f"file://{p}" for p in ([aside] if aside else []) + extra)
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(primary), version_base=None):
            return compose("config", overrides=[*overrides, f"hydra.searchpath=[{searchpath}]"], return_hydra_config=aside is not None)
    finally:
        GlobalHydra.instance().clear()


def _locate(overrides: Sequence[str], config_dir: str | None) -> str | None:
    """The schema's message for the first bad value, composed without the structured config."""
    from omegaconf import OmegaConf

    try:
        raw = OmegaConf.to_container(_compose([*overrides, "~schema"], config_dir), resolve=True)
    except Exception:
        return None
    errors = schema_errors({str(k): v for k, v in raw.items()}, complete=False) if isinstance(raw, dict) else []
    return first_problem(errors) if errors else None


# Hydra's account of a config file OmegaConf refused: the file, OmegaConf's message, the key (without the list item's path).
HYDRA_FILE_ERROR = re.compile(r"In '([^']+)': \w+ raised while composing config:\n(.*?)\n\s+full_key: (\S*)", re.S)


def _check_inputs(overrides: Sequence[str], config_dir: str | None) -> None:
    """What is refused before Hydra runs: an override outside its grammar, a user's file outside preflight.input_files' bounds."""
    _check_overrides(overrides)
    for folder in search_path(config_dir)[1]:
        if folder != shipped_dir("playbooks"):  # preflight's own files are not the user's input
            check_config_folder(folder)


def compose_config(overrides: Sequence[str] = (), config_dir: str | None = None) -> DictConfig:
    """Compose conf/ with Hydra's override grammar; no outputs/ folder, no logging set-up."""
    _check_inputs(overrides, config_dir)
    return _composed(overrides, config_dir)


def _composed(overrides: Sequence[str], config_dir: str | None) -> DictConfig:
    """Hydra's composition of inputs already checked, its errors made one line naming the key."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _compose(overrides, config_dir)
    except MissingConfigException as e:
        raise InputError(_missing_config_message(e)) from None
    except HydraException as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, OmegaConfBaseException) and "." in str(getattr(cause, "full_key", "") or ""):
            raise InputError(_omegaconf_message(cause)) from None
        if cause is not None and type(cause).__module__.startswith("yaml"):
            raise InputError(f"malformed YAML: {one_line(str(cause))}") from None
        # OmegaConf names a bad key inside a list item without the item's path: find it.
        located = _locate(overrides, config_dir)
        if located:
            raise InputError(located) from None
        if isinstance(cause, OmegaConfBaseException):
            raise InputError(_omegaconf_message(cause)) from None
        found = HYDRA_FILE_ERROR.search(str(e))
        if found:
            source, message, key = found.groups()
            raise InputError(f"{source}.yaml: {key}: {one_line(message)}") from None
        raise InputError(one_line(str(e).strip().splitlines()[0])) from None
    except OmegaConfBaseException as e:
        raise InputError(_omegaconf_message(e)) from None
    except OverflowError as e:
        # An integer too large for a float, given to a float key: out of every range. OmegaConf passes Python's error
        # on with the key's path; the schema's own words for the value replace it where they can be found.
        where = getattr(e, "full_key", None) or "(root)"
        raise InputError(_locate(overrides, config_dir) or f"{where}: {one_line(str(e).splitlines()[0])}") from None
    except Exception as e:
        if type(e).__module__.startswith("yaml"):  # YAML errors surface raw from Hydra's loader
            raise InputError(f"malformed YAML: {one_line(str(e))}") from None
        raise


def _same_address(address: str) -> str:
    """One spelling per address: an IP in its compressed form, a name in lower case."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower()


def _check_semantics(config: PreflightConfig) -> None:
    hosts = config.cluster.hosts
    seen: dict[str, int] = {}
    addresses: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if host.name in seen:
            raise InputError(f"cluster.hosts[{i}].name: {host.name!r} is already the name of cluster.hosts[{seen[host.name]}]")
        seen[host.name] = i
        # The address is where the host is reached and where its ranks meet the others: one machine listed twice (a
        # copied line) would pass every check twice over and run two nodes of the launch on its one set of GPUs.
        where = _same_address(host.address)
        if where in addresses:
            first = addresses[where]
            raise InputError(f"cluster.hosts[{i}].address: {host.name}'s {host.address!r} is already the address of "
                             f"cluster.hosts[{first}] ({hosts[first].name}): one machine listed twice")
        addresses[where] = i
    if config.cluster.master not in seen:
        raise InputError(f"cluster.master: {config.cluster.master!r} is not the name of a host in cluster.hosts")
    if rails_declared(config):
        # Rail r of every host meets the others on one switch: a host with another count of rails has no rail r peer.
        counts = [len(rail_interfaces(host, config)) for host in hosts]
        for i, count in enumerate(counts):
            if count != counts[0]:
                raise InputError(f"cluster.hosts[{i}].interfaces: {hosts[i].name} has {count} rail{'s' * (count != 1)} where "
                                 f"{hosts[0].name} has {counts[0]}: every host has one interface per rail, in rail order")
    paths: dict[str, int] = {}
    for i, entry in enumerate(config.storage.paths):
        folder = entry.path.rstrip("/") or "/"
        if folder in paths:
            raise InputError(f"storage.paths[{i}].path: {entry.path!r} is already storage.paths[{paths[folder]}]")
        paths[folder] = i
    low, high = config.collective.sweep_min_bytes, config.collective.sweep_max_bytes
    if low is not None and high is not None and low > high:
        raise InputError(f"collective.sweep_min_bytes: {low} is more than collective.sweep_max_bytes ({high})")
    for backend in ("nccl", "gloo"):
        verdicts = getattr(config.collective.speed, backend)
        if verdicts.fail_fraction > verdicts.suspect_fraction:
            raise InputError(f"collective.speed.{backend}.fail_fraction: {verdicts.fail_fraction:g} is more than "
                             f"collective.speed.{backend}.suspect_fraction ({verdicts.suspect_fraction:g}); a failure is a suspect first")
    port = config.network.master_port
    if port and "collective" in config.playbook.stages and (highest := highest_derived_port(port, len(hosts))) > HIGHEST_PORT:
        room = HIGHEST_PORT - (highest - port)
        raise InputError(f"network.master_port: {port} leaves no room for the collective's ports above it (up to {highest} with "
                         f"{len(hosts)} host{'s' * (len(hosts) != 1)}, to split a failing set); give one of at most {room}, or 0")


def load_spec(overrides: Sequence[str] = (), config_dir: str | None = None) -> Spec:
    """Compose and validate: the only way a Spec is made. A config composed before from the same files and overrides
    comes from the cache (preflight.config_cache), validated again."""
    primary, extra = search_path(config_dir)
    key = config_cache.cache_key([primary, *extra], overrides)
    cached = config_cache.read_cached(key) if key else None
    if cached is not None and not schema_errors(cached, complete=True):
        try:
            config = from_plain(cached)
            _check_semantics(config)
            return Spec(config=config, plain=cached, digest=_sha256(cached))
        except (InputError, LookupError, TypeError, ValueError):
            pass  # an entry damaged or altered since it was written: compose afresh, which names any real problem
    spec = _compose_spec(overrides, config_dir)
    if key:
        config_cache.write_cached(key, spec.plain)
    return spec


def _compose_spec(overrides: Sequence[str], config_dir: str | None) -> Spec:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _check_inputs(overrides, config_dir)
    plain = _compose_aside(overrides, config_dir)
    if plain is None:
        composed = _composed(overrides, config_dir)
        try:
            container = OmegaConf.to_container(composed, resolve=True, throw_on_missing=True, enum_to_str=True)
        except OmegaConfBaseException as e:
            raise InputError(_omegaconf_message(e)) from None
        if not isinstance(container, dict):
            raise InputError("the composed config is not a mapping")
        plain = {str(k): v for k, v in container.items()}
    errors = schema_errors(plain, complete=True)
    if errors:
        raise InputError(first_problem(errors))
    # The plain form, validated, makes the same typed tree as OmegaConf.to_object, in a tenth of its time (5 s of CPU for
    # 12,000 hosts); a cached config is built the same way.
    config = from_plain(plain)
    _check_semantics(config)
    return Spec(config=config, plain=plain, digest=_sha256(plain))


def _compose_aside(overrides: Sequence[str], config_dir: str | None) -> dict[str, object] | None:
    """The plain config composed with the cluster file's hosts read beside Hydra (preflight.host_list), of inputs that
    _check_inputs passed: 12,000 hosts in a few seconds of CPU where Hydra took 25. None where that could differ from
    Hydra's own composition, or where it failed: composing the usual way then names any problem in Hydra's and
    OmegaConf's words."""
    from omegaconf import OmegaConf, open_dict

    primary, extra = search_path(config_dir)
    with host_list.set_aside(overrides, [primary, *extra], [f for f in extra if f != shipped_dir("playbooks")]) as aside:
        if aside is None:
            return None
        try:
            composed = _compose(overrides, config_dir, aside.folder)
            chosen = composed.hydra.runtime.choices.get(host_list.GROUP)
            with open_dict(composed):
                del composed["hydra"]  # as hydra.compose removes it
            container = OmegaConf.to_container(composed, resolve=True, throw_on_missing=True, enum_to_str=True)
        except Exception:  # any of Hydra's and OmegaConf's errors: the usual composition says which, in their words
            return None
    return aside.restored({str(k): v for k, v in container.items()}, chosen) if isinstance(container, dict) else None
