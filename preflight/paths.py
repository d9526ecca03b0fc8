"""Output folders, proven writable before any work starts: a run that can only fail at the end fails at once."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from preflight.errors import InputError


def writable_folder(path: str | Path, key: str) -> Path:
    """The folder at path, created if needed and proven writable (a temporary file made and removed in it);
    InputError naming key (a config key or an option) when it is not."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Permission bits alone do not tell: root ignores them, and a read-only mount or a full disk refuses anyway.
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".preflight-writable-")
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"{key}: {path} is not a writable folder: {e.strerror or e}") from None
    return folder
