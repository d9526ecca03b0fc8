"""The storage stage: the job's checkpoint and data paths (storage.paths), tried from every host at once as the training
user. ``stage`` runs preflight/storage_probe.py's rounds over the transport; ``judge`` turns what they printed into
findings (PF901-PF910) and the report's section."""

from preflight.storage.stage import run_storage_stage

__all__ = ["run_storage_stage"]
