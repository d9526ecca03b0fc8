"""What `preflight sandbox up N` and `preflight sandbox down` run."""

from __future__ import annotations

from collections import Counter

from preflight.resources import user_config_dir
from preflight.sandbox.cluster import Sandbox
from preflight.sandbox.layout import DEFAULT_PREFIX
from preflight.sandbox.system import check_requirements

CLI_CONFIG_HEADER = "written by `preflight sandbox up`; removed by `preflight sandbox down`"


def sandbox_up(n: int) -> str:
    """`preflight sandbox up N`: build n hosts (prefix pf) that stay up, write cluster config `sandbox`; returns a summary."""
    sandbox = Sandbox.up(n)
    try:
        config = sandbox.write_cluster_config(user_config_dir() / "cluster" / "sandbox.yaml", header=CLI_CONFIG_HEADER)
    except BaseException:
        sandbox.down()
        raise
    sandbox.detach()
    last = sandbox.hosts[-1]
    return "\n".join([
        f"sandbox up: {n} host{'s' if n > 1 else ''} {sandbox.master.name}..{last.name} "
        f"({sandbox.master.address}..{last.address}) on bridge {sandbox.bridge}",
        f"cluster config: {config}",
        "check it:  preflight check cluster=sandbox",
        "remove it: preflight sandbox down",
    ])


def sandbox_down() -> str:
    """`preflight sandbox down`: remove everything `sandbox up` made, even after a crash; returns a summary."""
    check_requirements()
    removed = Sandbox.down_prefix(DEFAULT_PREFIX)
    config = user_config_dir() / "cluster" / "sandbox.yaml"
    try:
        ours = config.read_text(encoding="utf-8").splitlines()[1:2] == [f"# {CLI_CONFIG_HEADER}"]
    except OSError:
        ours = False
    if ours:  # outlived its state folder: /run is emptied at boot
        config.unlink()
        removed.append(f"file {config}")
    if not removed:
        return "sandbox down: nothing to remove"
    counts = Counter(item.split()[0] for item in removed)
    plural = {"process": "processes"}
    return "sandbox down: removed " + ", ".join(
        f"{count} {kind if count == 1 else plural.get(kind, kind + 's')}" for kind, count in counts.items()
    )
