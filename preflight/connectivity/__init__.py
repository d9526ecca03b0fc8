"""The connectivity test before torchrun: ``plan`` chooses who tests whom, ``stage`` runs preflight/mesh.py on every
host at once, and ``judge`` turns what each host saw into findings that name the host, port, pair or size."""

from preflight.connectivity.stage import run_connectivity_stage

__all__ = ["run_connectivity_stage"]
