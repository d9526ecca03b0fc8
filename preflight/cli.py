"""The command line. The only place where exceptions become exit codes (errors.ExitCode; docs/architecture.md)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from preflight import __version__
from preflight.contracts import LAUNCH_FORMATS
from preflight.errors import InputError, Interrupted, PreflightError
from preflight.interrupt import interrupts_deferred, signals_interrupt

if TYPE_CHECKING:
    from preflight.compose import Spec
    from preflight.report_shape import Report


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line and exit 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra overrides, e.g. cluster=prod network.master_port=29600")
    parser.add_argument("--config-dir", metavar="DIR",
                        help="your own config folder (also PREFLIGHT_CONFIG_DIR); preflight's conf/ stays behind it")


def _add_this_host_options(parser: argparse.ArgumentParser, json_help: str) -> None:
    """The options of the commands that check the machine they run on (gate, agent)."""
    _add_config_options(parser)
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--host", metavar="NAME", help="this machine's name in the cluster config (default: found by hostname or address)")


PROMETHEUS_HELP = ("also write the report as metrics for node_exporter's textfile collector (a .prom file in its "
                   "--collector.textfile.directory), atomically")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """Where a run's report goes besides the terminal and state_dir."""
    parser.add_argument("--html", metavar="OUT.html", help="also write the report as one self-contained HTML page")
    parser.add_argument("--prometheus", metavar="FILE.prom", help=PROMETHEUS_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    parser = _Parser(prog="preflight", description="Cluster preflight checks and launch configs for PyTorch distributed training.")
    parser.add_argument("--version", action="version", version=f"preflight {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = commands.add_parser("check", help="check every host of a cluster and save the report")
    _add_config_options(check)
    check.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    check.add_argument("--all", action="store_true", help="also list the checks that passed")
    check.add_argument("--cfg", choices=["job"], help="print the composed config and exit")
    _add_output_options(check)
    check.add_argument("--quiet", "-q", action="store_true", help="print only the verdict line")
    check.set_defaults(func=cmd_check)

    emit = commands.add_parser("emit-launch", help="write the launch that passed the last check, for torchrun")
    _add_config_options(emit)
    emit.add_argument("--format", choices=LAUNCH_FORMATS, default="env",
                      help="env: KEY=VALUE per host (default); torchrun: the command per host; json: the whole launch; "
                           "slurm: an sbatch script")
    emit.add_argument("--report", metavar="PATH", help="the report to launch from (default: the last one `check` saved)")
    emit.add_argument("--out", metavar="DIR", help="write the files into DIR instead of printing")
    emit.add_argument("--host", action="append", metavar="NAME", default=[], help="only this host (env, torchrun); repeatable")
    emit.add_argument("--force", action="store_true", help="emit even from a failed, stale or other config's report; the output says so")
    emit.set_defaults(func=cmd_emit_launch)

    gate = commands.add_parser("gate", help="check this machine alone, for a scheduler's pre-job gate (one line, exit code)",
                               description="The node-local checks of a playbook (default playbook=gate) on this machine, "
                                           "without SSH or a collective; prints one line fit for a drain reason and saves nothing.")
    _add_this_host_options(gate, json_help="print the report as JSON instead of the line")
    gate.add_argument("--prometheus", metavar="FILE.prom", help=PROMETHEUS_HELP)
    gate.set_defaults(func=cmd_gate)

    agent = commands.add_parser("agent", help="check run by torchrun or srun on every host; rank 0 writes the report",
                                description="Started on every host by torchrun (--nproc-per-node=1) or srun (one task per node): "
                                            "each agent probes its own host and runs the commands of every stage (mesh test, "
                                            "collective, storage) on it, talking to rank 0 through a store rank 0 serves; rank 0 "
                                            "runs the playbook's stages and saves and prints the report, as `check` does, with no SSH.")
    _add_this_host_options(agent, json_help="rank 0 prints the report as JSON instead of a table")
    agent.set_defaults(func=cmd_agent)

    diagnose = commands.add_parser("diagnose", help="read a failed job's log: known failures as finding codes, root cause first",
                                   description="Maps known failure signatures in a training job's log (NCCL, gloo, torchrun, "
                                               "DDP, DataLoader, the kernel's Xid lines) to finding codes with their cause and "
                                               "fix; a hang that printed no error; a denylisted driver or NCCL the log names. "
                                               "A folder is one job: its per-rank logs merged, or its flight recorder dumps "
                                               "(which collective diverged, which ranks and hosts never entered it). "
                                               "Exit 1 when a known failure is recognized, 0 when none is.")
    diagnose.add_argument("logfile", metavar="PATH", help="the log to read (- for stdin), or a folder of one job's logs or dumps")
    diagnose.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    diagnose.set_defaults(func=cmd_diagnose)

    report = commands.add_parser("report", help="show a saved report in the terminal, or write it as an HTML page",
                                 description="Reads a report `check`, `agent` or `gate --json` wrote (default: the last one "
                                             "`check` saved, in state_dir) and prints its table, or with --html writes one "
                                             "self-contained page: verdict, findings, hosts side by side, bandwidth plots.")
    report.add_argument("report", nargs="?", metavar="REPORT.json", help="the report to read (default: state_dir/report.json)")
    report.add_argument("--html", metavar="OUT.html", help="write the report as one self-contained HTML page")
    report.add_argument("--all", action="store_true", help="also list the checks that passed (terminal)")
    report.add_argument("--config-dir", metavar="DIR", help="your own config folder, to find state_dir (also PREFLIGHT_CONFIG_DIR)")
    report.set_defaults(func=cmd_report, overrides=[])

    explain = commands.add_parser("explain", help="what a finding code means and how to fix it")
    explain.add_argument("code", nargs="?", help="a code such as PF203; none lists every code")
    explain.set_defaults(func=cmd_explain)

    sandbox = commands.add_parser("sandbox", help="a local test cluster of network namespaces (root)")
    sandbox_commands = sandbox.add_subparsers(dest="action", required=True, parser_class=_Parser)
    up = sandbox_commands.add_parser("up", help="build N hosts and write the cluster config `sandbox`")
    up.add_argument("hosts", type=int, metavar="N", help="number of hosts (1 to 200)")
    up.set_defaults(func=cmd_sandbox_up)
    down = sandbox_commands.add_parser("down", help="remove everything `sandbox up` made")
    down.set_defaults(func=cmd_sandbox_down)
    return parser


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """A progress bar on stderr while hosts answer; only on a terminal."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from preflight.report import console

    with Progress(TextColumn("probing hosts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as progress:
        task = progress.add_task("probe", total=total)
        yield lambda _result: progress.advance(task)


def cmd_check(args: argparse.Namespace) -> int:
    """preflight check: probe, check, report; exit 0/1/3."""
    from preflight.compose import load_spec

    spec = load_spec(args.overrides, args.config_dir)
    if args.cfg:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(spec.plain), end="")
        return 0
    from preflight.paths import writable_folder
    from preflight.pipeline import run_check

    # The report is saved at the end: a state folder that cannot take it must stop the run before any host is touched,
    # and so must an output file's.
    writable_folder(spec.config.state_dir, "state_dir")
    outputs = _Outputs.of(args)

    with _progress(len(spec.config.cluster.hosts), enabled=not args.json and not args.quiet and sys.stderr.isatty()) as on_result:
        report = run_check(spec, on_result)
    _deliver(spec, report, as_json=args.json, show_all=args.all, quiet=args.quiet)
    outputs.write(report, "check")
    return int(report["exit_code"])


class _Outputs:
    """The --html and --prometheus files of a run, proven writable before the run starts."""

    def __init__(self, html: str | None, prometheus: str | None) -> None:
        from pathlib import Path

        from preflight.paths import writable_folder

        self.html = Path(html) if html else None
        self.prometheus: Path | None = None
        if prometheus:
            from preflight.prometheus import prometheus_path

            self.prometheus = prometheus_path(prometheus)
        for path, option in ((self.html, "--html"), (self.prometheus, "--prometheus")):
            if path is not None:
                if path.is_dir():  # found now, not by the rename after a whole check
                    raise InputError(f"{option} {path}: is a folder; name the file to write in it")
                writable_folder(path.parent, f"{option} {path}")

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Outputs:
        return cls(getattr(args, "html", None), getattr(args, "prometheus", None))

    def write(self, report: Report, command: str) -> None:
        from preflight.report import write_atomically

        if self.html is not None:
            from preflight.report_html import report_html

            write_atomically(self.html, report_html(report))
        if self.prometheus is not None:
            from preflight.prometheus import write_metrics

            write_metrics(report, command, self.prometheus)


def cmd_emit_launch(args: argparse.Namespace) -> int:
    """preflight emit-launch: exit 0 with the launch, 1 when the report does not prove it, 2 on bad input."""
    from pathlib import Path

    from preflight.compose import load_spec
    from preflight.emit import default_report_path, emit, render, write_outputs
    from preflight.paths import writable_folder

    spec = load_spec(args.overrides, args.config_dir)
    if args.out:
        writable_folder(args.out, "emit-launch --out")
    document, plan = emit(spec, Path(args.report) if args.report else default_report_path(spec), force=args.force)
    names = [h["name"] for h in document["hosts"]]
    unknown = [h for h in args.host if h not in names]
    if unknown:
        raise InputError(f"emit-launch --host: {', '.join(unknown)} not in the launch (hosts: {', '.join(names)})")
    for reason in plan.forced:
        print(f"preflight: warning: forced over: {reason}", file=sys.stderr)
    for host, why in plan.excluded.items():
        print(f"preflight: left out {host}: {why}", file=sys.stderr)
    outputs = render(document, args.format, args.host)
    if args.out is None and len(outputs) == 1:
        print(outputs[0].text, end="")
        return 0
    # Several env files (one per host) cannot share stdout: they go to the state folder unless --out says where. Only
    # now is it known that the state folder is written to; it is proven writable before the first file is.
    folder = Path(args.out) if args.out else writable_folder(Path(spec.config.state_dir) / "launch", "state_dir")
    for path in write_outputs(outputs, folder):
        print(path)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    """preflight gate: one line (or --json), exit 0/1/3."""
    from preflight.gate import run_gate

    outputs = _Outputs(None, args.prometheus)
    result = run_gate(args.overrides, args.config_dir, args.host)
    print(json.dumps(result.report, indent=1) if args.json else result.line)
    outputs.write(result.report, "gate")
    return int(result.report["exit_code"])


def cmd_report(args: argparse.Namespace) -> int:
    """preflight report [REPORT.json] [--html OUT.html]: exit with the report's own code, 2 when it cannot be read."""
    from pathlib import Path

    from preflight.emit import read_report

    if args.report and "=" in args.report and not Path(args.report).exists():
        args.overrides, args.report = [args.report, *args.overrides], None  # `report cluster=prod`: an override
    if args.report:
        path = Path(args.report)
    else:
        from preflight.compose import load_spec
        from preflight.emit import default_report_path

        path = default_report_path(load_spec(args.overrides, args.config_dir))
    if not path.exists():  # read_report's own message speaks of emit-launch's --report
        raise InputError(f"no report at {path}: run `preflight check` first, or name one: preflight report REPORT.json")
    outputs = _Outputs(args.html, None)
    report = read_report(path)
    if outputs.html is not None:
        outputs.write(report, "report")
        print(outputs.html)
    else:
        from preflight.report import console, render

        console().print(render(report, show_all=args.all))
    return int(report["exit_code"])


def cmd_agent(args: argparse.Namespace) -> int:
    """preflight agent: rank 0 saves and prints the report and exits with its code; the others exit 0."""
    from preflight.agent import run_agent

    return run_agent(args.overrides, args.config_dir, lambda spec, report: _deliver(spec, report, as_json=args.json), args.host)


def _deliver(spec: Spec, report: Report, *, as_json: bool, show_all: bool = False, quiet: bool = False) -> None:
    """Save the report where emit-launch finds it, and print it (only its verdict line when quiet)."""
    from preflight.report import console, render, report_text, save_report, verdict_line

    text = report_text(report)
    # The kept report and the latest one are written together or not at all.
    with interrupts_deferred("while saving the report (it was saved whole)"):
        saved = save_report(report, spec.config.state_dir, text, keep=spec.config.history_keep)
    if as_json:
        print(text, end="", flush=True)
    elif quiet:
        console().print(verdict_line(report))
    else:
        out = console()
        out.print(render(report, show_all=show_all))
        out.print(f"report saved to {saved}", style="dim")


def cmd_diagnose(args: argparse.Namespace) -> int:
    """preflight diagnose PATH: exit 1 when a known failure is recognized, 0 when none is, 2 on a bad file."""
    from preflight.diagnose import diagnose_path

    result = diagnose_path(args.logfile)
    print(json.dumps(result.to_json(), indent=1) if args.json else result.render())
    return result.exit_code


def cmd_explain(args: argparse.Namespace) -> int:
    """preflight explain [CODE]."""
    from preflight.catalogue import explain, listing

    print(explain(args.code) if args.code else listing())
    return 0


def cmd_sandbox_up(args: argparse.Namespace) -> int:
    """preflight sandbox up N."""
    from preflight.sandbox import sandbox_up

    if not 1 <= args.hosts <= 200:
        raise InputError(f"sandbox up: N must be 1 to 200, not {args.hosts}")
    print(sandbox_up(args.hosts))
    return 0


def cmd_sandbox_down(args: argparse.Namespace) -> int:
    """preflight sandbox down."""
    from preflight.sandbox import sandbox_down

    print(sandbox_down())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; turn every PreflightError into its one-line message and exit code, and SIGINT or SIGTERM into
    one line saying what was interrupted and exit 130 or 143."""
    return _main(argv)[0]


def run() -> NoReturn:
    """The program (the console script and ``python -m preflight``): main(), then the exit.

    After an interrupt the hosts are cleaned within the cleanup's deadline and the line is out, so the exit skips the
    interpreter's teardown: its final garbage collection of Hydra's, Fabric's and rich's objects was seen to take 1 to
    3.5 s on a loaded 2-core machine, past the deadline that an interrupt promises. atexit's handlers still run (they
    flush logging and remove local temporary folders); threads still waiting on an unreachable host are not joined."""
    # A log's own text, which diagnose echoes, may have no form in stdout's encoding (a Latin-1 locale,
    # PYTHONIOENCODING=ascii): an escape in its place, not a traceback. stderr escapes by default already.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")
    sys.stdout = _ReaderMayLeave(sys.stdout)
    code, interrupted = _main(None)
    if interrupted:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(code)
    sys.exit(code)


class _ReaderMayLeave:
    """The program's stdout, which goes quiet when its reader leaves (`preflight check | head -3`, a pager quit early).

    Python raises BrokenPipeError at the next write, and rich answers it with exit 1: a check that passed, saved its
    report and cleaned every host would exit as failed, and a pipeline under `set -o pipefail` or `${PIPESTATUS[0]}`
    reads that exit as the verdict. Here the rest of the output goes to /dev/null and the command ends as it would
    have, with its own exit code."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._discard_the_rest()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard_the_rest()

    def _discard_the_rest(self) -> None:
        # What the stream still buffers, and every later write, go to /dev/null: the final flush at exit finds no pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the stream's own
        return getattr(self._stream, name)


def _main(argv: Sequence[str] | None) -> tuple[int, bool]:
    """main()'s exit code, and whether a signal interrupted the command."""
    parser = build_parser()
    with signals_interrupt():
        try:
            args, extra = parser.parse_known_args(argv)
            # Overrides may come after options (`check --json cluster=prod`): keep them in order.
            unknown = [a for a in extra if a.startswith("-")]
            if unknown:
                raise InputError(f"preflight {args.command}: unrecognized arguments: {' '.join(unknown)}")
            if extra:
                if not hasattr(args, "overrides"):
                    raise InputError(f"preflight {args.command}: unrecognized arguments: {' '.join(extra)}")
                args.overrides = [*args.overrides, *extra]
            return int(args.func(args)), False
        except PreflightError as e:
            print(f"preflight: error: {e}", file=sys.stderr)
            return e.exit_code, False
        except Interrupted as e:
            print(f"preflight: {e.message}", file=sys.stderr)
            return e.exit_code, True
        except KeyboardInterrupt:
            print("preflight: interrupted by SIGINT", file=sys.stderr)
            return 130, True
