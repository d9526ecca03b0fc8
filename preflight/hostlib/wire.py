"""The wire of a script run as ``python3 - CONFIG_JSON``: its config from the command line, its one JSON line out."""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def read_config(argv: list[str]) -> Any:  # raw JSON from preflight: the script's TypedDict says what it holds
    """The config preflight passed as the one argument."""
    return json.loads(argv[1])


def write_output(out: object, allow_nan: bool = True) -> int:
    """Print out as one JSON line, flushed before the script exits; the script's exit status (0)."""
    sys.stdout.write(json.dumps(out, allow_nan=allow_nan) + "\n")
    sys.stdout.flush()
    return 0
