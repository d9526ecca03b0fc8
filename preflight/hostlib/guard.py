"""The import-path guard, first in every script run as ``python3 -``."""

from __future__ import annotations

import sys

# Run as `python3 -`, the first import path is the folder the remote shell starts in (run as a file, the file's folder).
# A json.py or a torch/ there is not the training environment's, so neither may shadow what the job will import.
if __name__ == "__main__" and sys.path and not sys.flags.isolated and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]
