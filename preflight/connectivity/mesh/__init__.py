"""The mesh test, in modules: preflight.bundle joins them, after the shared host helpers, into the one script sent to
every host (MESH). Imports nothing, so that the connectivity stage's imports load no socket code."""
