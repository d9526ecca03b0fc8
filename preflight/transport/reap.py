"""Ending a run's work on a host, whatever it started there.

Every command a HostRouter sends runs with ``PREFLIGHT_TAG=<the run's tag>`` in its environment, and every process it
starts inherits it: torchrun, its ranks in sessions of their own, a wrapper's children. Closing an SSH channel does not
signal a command run without a pty, so on an interrupt a short shell script, sent untagged over the same transport,
kills every process that carries the tag and removes the run's temporary folders. It is a shell script, not python:
the training environment's python may be the very thing that hangs.

A run's temporary folders are named ``preflight-<tag>-<host>-*``, <host> being ``uname -n`` with every character but
letters, digits, '.' and '-' left out: hosts that share a /tmp (the test cluster's do) each remove only their own. The
storage stage's files are ``.preflight-<tag>-*`` in the folders it tests (storage.paths), given to the reaper as
arguments: every host removes every one of the run's files there, its own and, on a shared folder, any other host's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preflight.errors import one_line
from preflight.spec import HostSpec
from preflight.transport.base import CommandResult, RemoteCommand

TAG_VARIABLE = "PREFLIGHT_TAG"
# $1 is the tag, $2 TAG_VARIABLE, any more the folders of the run's files (validated absolute paths). A command of the
# run may keep one line in a file `status` of its temporary folder to say what it is doing there (the collective's
# supervisor: its ranks' phase); the reaper reports it before killing.
# Python's tempfile looks in TMPDIR, TEMP, TMP, then /tmp, /var/tmp, /usr/tmp: so does this. Killing repeats until two
# scans in a row find nothing: a process may fork while it is being killed. Only processes in the reaper's own network
# namespace count: the hosts of a test cluster (preflight.sandbox) see each other's processes, real hosts never do.
REAPER = r"""
marker="$2=$1"
folders="preflight-$1-$(uname -n | tr -cd 'A-Za-z0-9.-')-"
net=$(readlink /proc/$$/ns/net 2>/dev/null)
ours() {
  for pid in $(grep -lsxzF -e "$marker" /proc/[0-9]*/environ | cut -d/ -f3); do
    [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$net" ] && echo "$pid"
  done
}
for base in "${TMPDIR:-/tmp}" "${TEMP:-/tmp}" "${TMP:-/tmp}" /tmp /var/tmp /usr/tmp; do
  for file in "$base/$folders"*/status; do
    [ -f "$file" ] && printf 'status %s\n' "$(head -c 100 "$file" | tr -d '\n')"
  done
done
all="" quiet=0 round=0
while [ "$round" -lt 30 ] && [ "$quiet" -lt 2 ]; do
  round=$((round + 1))
  pids=$(ours)
  if [ -n "$pids" ]; then
    quiet=0
    kill -9 $pids 2>/dev/null
    all="$all $pids"
  else
    quiet=$((quiet + 1))
  fi
  sleep 0.1
done
left=$(ours | wc -l)
removed=0
for base in "${TMPDIR:-/tmp}" "${TEMP:-/tmp}" "${TMP:-/tmp}" /tmp /var/tmp /usr/tmp; do
  for folder in "$base/$folders"*; do
    [ -d "$folder" ] && rm -rf -- "$folder" && removed=$((removed + 1))
  done
done
tag=$1 files=0
shift 2
for base in "$@"; do
  for file in "$base/.preflight-$tag-"*; do
    [ -f "$file" ] && rm -f -- "$file" && files=$((files + 1))
  done
done
printf 'killed %s\nleft %s\nremoved %s\nfiles %s\n' "$(printf '%s\n' $all | sort -u | grep -c .)" "$left" "$removed" "$files"
"""


@dataclass(frozen=True)
class Cleanup:
    """What the reaper did on one host, or why it could not."""

    host: str
    reached: bool
    killed: int = 0  # processes of the run it killed
    left: int = 0  # processes of the run still alive after it
    removed: int = 0  # temporary folders of the run it removed
    files: int = 0  # the storage stage's files of the run it removed
    status: tuple[str, ...] = ()  # what the run's commands said they were doing there
    reason: str = ""  # why it could not run, when not reached

    @property
    def clean(self) -> bool:
        """Nothing of the run is left on the host."""
        return self.reached and self.left == 0


def reap_command(host: HostSpec, tag: str, timeout_s: float, folders: Sequence[str] = ()) -> RemoteCommand:
    """The reaper for one host, which also removes the run's files in folders; it must be sent without the tag, or it
    would count itself."""
    return RemoteCommand(host=host, argv=["sh", "-c", REAPER, "sh", tag, TAG_VARIABLE, *folders], timeout_s=timeout_s)


def read_cleanup(result: CommandResult) -> Cleanup:
    """The reaper's answer."""
    counts: dict[str, int] = {}
    status: list[str] = []
    for line in result.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "status" and value and value not in status:
            status.append(value)
        elif key in ("killed", "left", "removed", "files") and value.strip().isdigit():
            counts[key] = int(value)
    if not result.ok or not {"killed", "left", "removed"} <= set(counts):
        why = result.reason or one_line(result.stderr, 200) or f"the cleanup ended with exit status {result.exit_code}"
        return Cleanup(result.host, reached=False, status=tuple(status), reason=why)
    return Cleanup(result.host, reached=True, killed=counts["killed"], left=counts["left"], removed=counts["removed"],
                   files=counts.get("files", 0), status=tuple(status))
