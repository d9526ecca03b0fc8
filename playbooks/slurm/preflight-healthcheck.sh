#!/bin/bash
# Slurm HealthCheckProgram: `preflight gate` on this node; drains the node with preflight's one line as
# the reason when a check fails, and resumes it when it passes again, but only from a drain preflight
# itself set. Install and configure: playbooks/slurm/README.md.
#
# Exit code: the gate's (0 pass, 1 failed, 2 bad input, 3 could not check; a timeout is 3). slurmd only
# logs a non-zero one ("health_check failed: rc:1 output:..."): what acts on the node is the drain below.
#
# Settings, from $PREFLIGHT_DEFAULTS (default /etc/default/preflight; sourced, so it wins) or the environment:
#   PREFLIGHT                  the preflight command (default: preflight on PATH)
#   PREFLIGHT_GATE_ARGS        arguments for `preflight gate`, split on spaces (e.g. "cluster=prod --config-dir /etc/preflight")
#   PREFLIGHT_GATE_TIMEOUT_S   the gate's hard deadline in seconds (default 40)
#   SLURM_CONF                 as for any Slurm command
# and, from the environment only: PREFLIGHT_HEALTHCHECK_LOCK (default /run/lock/preflight-healthcheck.lock).
set -uo pipefail

# slurmd starts this program with SLURMD_NODENAME and nothing else: no PATH, no SLURM_CONF. Whatever a
# site needs beyond the standard folders comes from the defaults file.
export PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
node="${SLURMD_NODENAME:-$(hostname -s)}"

say() {
  # slurmd keeps this output only when the exit code is not 0; syslog keeps it either way.
  echo "preflight-healthcheck on $node: $*" >&2
  logger -t preflight-healthcheck -p daemon.notice -- "$node: $*" 2>/dev/null || true
}

# One run at a time on a node: a run started by hand and slurmd's must not interleave reading the node's
# state and updating it (one would resume what the other just drained). Taken before the settings are
# read, so that a run waiting here acts on the settings of when it goes on.
lock="${PREFLIGHT_HEALTHCHECK_LOCK:-/run/lock/preflight-healthcheck.lock}"
if ! { exec 9>>"$lock"; } 2>/dev/null; then
  say "cannot open $lock: running without the lock"
elif ! flock --wait 5 9; then
  say "another run has held $lock for 5 s: node left as it is"
  exit 3
fi

PREFLIGHT_DEFAULTS="${PREFLIGHT_DEFAULTS:-/etc/default/preflight}"
if [[ -r "$PREFLIGHT_DEFAULTS" ]]; then
  # shellcheck source=/dev/null
  . "$PREFLIGHT_DEFAULTS"
fi
PREFLIGHT="${PREFLIGHT:-preflight}"
# slurmd kills a HealthCheckProgram at 60 s, and a killed one drains nothing. The gate's own probe deadline
# (playbook=gate, deadline_s: 30) answers first with "PF001 ... timed out" (exit 3); this one catches a
# gate stuck before its probe starts (a hung filesystem under python). With the lock's 5 s, the gate's
# 40 + 2 and 5 s for each Slurm call, a run ends within 57 s.
PREFLIGHT_GATE_TIMEOUT_S="${PREFLIGHT_GATE_TIMEOUT_S:-40}"
SLURM_CALL_TIMEOUT_S=5
REASON_MAX_CHARS=160
OURS="preflight:"

one_line() {
  # A reason is one line: Slurm stores it as given, and `sinfo -R` shows a newline as a broken row.
  local text="${1//[$'\t\r\n']/ }"
  printf '%s\n' "${text:0:$REASON_MAX_CHARS}"
}

read -r -a gate_args <<< "${PREFLIGHT_GATE_ARGS:-}"
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
# 9>&-: a gate left running past its deadline must not keep the lock.
output="$(timeout --kill-after=2 "$PREFLIGHT_GATE_TIMEOUT_S" "$PREFLIGHT" gate "${gate_args[@]}" 2>"$errors" 9>&-)"
gate_rc=$?
line="$(grep -m1 "^$OURS" <<< "$output")"

case "$gate_rc" in
  0 | 1 | 3)
    if [[ -z "$line" ]]; then
      # A crash (a traceback, exit 1) is not a verdict on the node: it says nothing was checked.
      line="$OURS could not check: the gate exited $gate_rc without its line: $(head -n1 "$errors")"
      gate_rc=3
    fi
    ;;
  2)
    # Bad input is the site's configuration, not this node: draining for it would drain every node at once
    # within one HealthCheckInterval. Say it loudly and leave the node as it is.
    say "bad input, node left as it is: $(head -n1 "$errors")"
    exit 2
    ;;
  124 | 137)
    line="$OURS could not check: the gate did not answer within ${PREFLIGHT_GATE_TIMEOUT_S} s"
    gate_rc=3
    ;;
  *)
    line="$OURS could not check: the gate exited $gate_rc: $(head -n1 "$errors")"
    gate_rc=3
    ;;
esac
line="$(one_line "$line")"

# One word of state (idle, drained, draining, down*, ...), then the reason or "none"; awk rather than head,
# which stops reading after one line and can fail the pipe under sinfo.
if ! node_info="$(timeout "$SLURM_CALL_TIMEOUT_S" sinfo --noheader --Node --nodes="$node" --format='%T %E' | awk 'NR == 1')" \
    || [[ -z "$node_info" ]]; then
  say "cannot read the node's state from slurmctld; gate said: $line"
  exit 3
fi
state="${node_info%% *}"
reason="${node_info#* }"

if [[ "$gate_rc" == 0 ]]; then
  # Resume only a drain of our own: an admin's drain, "Prolog error" or "Kill task failed" must stay until
  # whoever set it clears it.
  if [[ "$state" == drain* && "$reason" == "$OURS"* ]]; then
    if timeout "$SLURM_CALL_TIMEOUT_S" scontrol update nodename="$node" state=resume; then
      say "resumed (was: $reason); $line"
    else
      say "could not resume (was: $reason)"
      exit 3
    fi
  fi
  exit 0
fi

if [[ "$reason" != none && "$reason" != "$OURS"* ]]; then
  # Someone else's reason explains this node; ours replacing it would also let us resume their drain later.
  say "$line (node left as it is: already $state with reason: $reason)"
  exit "$gate_rc"
fi
if [[ "$state" == drain* && "$reason" == "$line" ]]; then
  exit "$gate_rc"  # already drained for this very reason: keep the time it was first seen
fi
if ! timeout "$SLURM_CALL_TIMEOUT_S" scontrol update nodename="$node" state=drain reason="$line"; then
  say "could not drain: $line"
  exit 3
fi
say "drained: $line"
exit "$gate_rc"
