#!/bin/bash
# Slurm Prolog: `preflight gate` on this node before a job starts here. A non-zero exit makes Slurm drain
# the node with the reason "Prolog error" and requeue the job (held), so the job never starts on a node
# that fails. Slurm does not keep a prolog's words as the reason: preflight's line goes to stderr (slurmd
# logs it: "prolog failed: rc:1 output:preflight: PF203 ...") and to syslog. Install: playbooks/slurm/README.md.
#
# Exit code: 0 when the gate passes or when its input is bad (the site's configuration, not this node:
# logged, and the job runs); 1 when a check failed, the node could not be checked, or the gate timed out.
#
# Settings, from $PREFLIGHT_DEFAULTS (default /etc/default/preflight, sourced) since slurmd gives a prolog
# only the job's SLURM_* variables:
#   PREFLIGHT                  the preflight command (default: preflight on PATH)
#   PREFLIGHT_GATE_ARGS        arguments for `preflight gate`, split on spaces
#   PREFLIGHT_GATE_TIMEOUT_S   the gate's hard deadline in seconds (default 40)
set -uo pipefail

export PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PREFLIGHT_DEFAULTS="${PREFLIGHT_DEFAULTS:-/etc/default/preflight}"
if [[ -r "$PREFLIGHT_DEFAULTS" ]]; then
  # shellcheck source=/dev/null
  . "$PREFLIGHT_DEFAULTS"
fi
PREFLIGHT="${PREFLIGHT:-preflight}"
# Every job waits for the prolog, and Slurm's own PrologEpilogTimeout is unbounded by default: the gate's
# probe deadline (30 s, "PF001 ... timed out") answers first; this bounds a gate stuck before its probe.
PREFLIGHT_GATE_TIMEOUT_S="${PREFLIGHT_GATE_TIMEOUT_S:-40}"
OURS="preflight:"
node="${SLURMD_NODENAME:-$(hostname -s)}"
job="${SLURM_JOB_ID:-?}"

say() {
  echo "$*" >&2
  logger -t preflight-prolog -p daemon.notice -- "$node job $job: $*" 2>/dev/null || true
}

read -r -a gate_args <<< "${PREFLIGHT_GATE_ARGS:-}"
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
output="$(timeout --kill-after=2 "$PREFLIGHT_GATE_TIMEOUT_S" "$PREFLIGHT" gate "${gate_args[@]}" 2>"$errors")"
gate_rc=$?
line="$(grep -m1 "^$OURS" <<< "$output")"

case "$gate_rc" in
  0)
    [[ -n "$line" ]] && exit 0
    say "$OURS could not check: the gate passed without its line: $(head -n1 "$errors")"
    ;;
  1 | 3)
    say "${line:-$OURS could not check: the gate exited $gate_rc without its line: $(head -n1 "$errors")}"
    ;;
  2)
    # Failing here would drain every node a job lands on, for a typo in the site's configuration.
    say "$OURS bad input, the job runs unchecked: $(head -n1 "$errors")"
    exit 0
    ;;
  124 | 137)
    say "$OURS could not check: the gate did not answer within ${PREFLIGHT_GATE_TIMEOUT_S} s"
    ;;
  *)
    say "$OURS could not check: the gate exited $gate_rc: $(head -n1 "$errors")"
    ;;
esac
exit 1
