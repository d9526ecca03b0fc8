"""The facts probe, as modules: preflight.bundle joins them, after the shared helpers, into the one file each host runs
(``preflight.bundle.FACTS``); nothing here imports more of preflight than the other probe modules and preflight.hostlib."""
