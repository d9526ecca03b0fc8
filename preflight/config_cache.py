"""Composed, validated configs kept between runs, so that a run whose config files and overrides are unchanged skips
Hydra (its import and its composition: 0.4 s for a small cluster, seconds for hundreds of hosts).

A cached config is never stale: its key is a hash of everything composition reads (every YAML file in every folder
of the search path, in search order, by path and content; the overrides, in order; the code that declares defaults
and validates; the Hydra and OmegaConf versions). A config whose files or overrides use an interpolation (``${...}``,
which may read the environment) is never cached. A cached entry is validated again when it is read, so a damaged
or altered file is composed afresh, never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from preflight import __version__

CACHE_ENV = "PREFLIGHT_CONFIG_CACHE"  # a folder for the cache, or "off"
KEPT_ENTRIES = 32  # the oldest entries beyond this are removed when one is written
_PACKAGE = Path(__file__).resolve().parent
# The code whose change changes a composed config: the declared defaults, the schema, composition itself.
_CODE = ("spec.py", "schemas/spec.schema.json", "compose.py", "schema_check.py", "host_list.py",
         "config_cache.py")
_INTERPOLATION = "${"


def cache_dir() -> Path | None:
    """The folder of cached configs: PREFLIGHT_CONFIG_CACHE, else $XDG_CACHE_HOME/preflight/config; None when off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "preflight" / "config"


def cache_key(folders: Sequence[Path], overrides: Sequence[str]) -> str | None:
    """The hash of everything composing these folders with these overrides reads; None when it must not be cached."""
    if any(_INTERPOLATION in override for override in overrides):
        return None
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("preflight", __version__.encode())
    for package in ("hydra-core", "omegaconf"):
        try:
            add(package, metadata.version(package).encode())
        except metadata.PackageNotFoundError:
            add(package, b"")
    for name in _CODE:
        add(name, (_PACKAGE / name).read_bytes())
    add("overrides", json.dumps(list(overrides)).encode())
    for folder in folders:
        add("folder", str(folder).encode())
        for path in sorted(folder.rglob("*.yaml")):
            try:
                data = path.read_bytes()
            except OSError:
                return None  # Hydra would fail on it too: let composition say so
            if _INTERPOLATION.encode() in data:
                return None
            add(str(path.relative_to(folder)), data)
    return digest.hexdigest()


def read_cached(key: str) -> dict[str, Any] | None:  # a config's plain JSON, validated by the caller
    """The plain config stored under key, or None (no cache, no entry, unreadable)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        plain = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return plain if isinstance(plain, dict) else None


def write_cached(key: str, plain: dict[str, Any]) -> None:  # a validated config's plain JSON
    """Store a validated plain config under key, atomically; a cache that cannot be written is skipped silently."""
    folder = cache_dir()
    if folder is None:
        return
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".entry.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as f:
                json.dump(plain, f)
            os.replace(temporary, folder / f"{key}.json")
        finally:
            Path(temporary).unlink(missing_ok=True)
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in entries[KEPT_ENTRIES:]:
            stale.unlink(missing_ok=True)
