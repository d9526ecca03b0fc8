"""The collective's host script, in modules: preflight.bundle joins them, with the shared host helpers, into the one
worker.py staged on each host (WORKER). This package's __init__ imports nothing, so that the orchestrator's imports of
the formulas load no rank code."""
