"""The connectivity test before torchrun: ``plan`` chooses who tests whom, ``stage`` runs preflight/mesh.py on every
host at once, and ``judge`` turns what each host saw into findings that name the host, port, pair or size."""

from preflight.connectivity.judge import blamed_hosts
from preflight.connectivity.stage import run_connectivity_stage

__all__ = ["blamed_hosts", "run_connectivity_stage"]
