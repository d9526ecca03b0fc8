"""What the host scripts share, joined into each by preflight.bundle: the import-path guard, small file readers, the
CPU cgroup reader and the JSON wire. Standard library only, and Python 3.8's, as a host may run it with its own python3."""
