"""Allows ``python -m preflight``."""

from preflight.cli import run

run()
