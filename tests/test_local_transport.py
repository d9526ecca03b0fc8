"""The local transport's started commands: their input is fed when they start, so work overlaps them for real, and
their deadline counts from the start; a command that never reads its input still ends at its deadline."""

from __future__ import annotations

import sys
import threading
import time

from preflight.transport.local import finish_local, start_local

# More than a pipe holds (64 KiB on Linux): a command that never reads it leaves the feeding thread blocked in write.
LARGE_INPUT = "#" * (1 << 20) + "\n"


def feeders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "preflight-local-stdin"]


def test_a_command_started_early_runs_while_its_caller_is_busy() -> None:
    """`python -` reads its program from its input: the program runs while the caller works for longer than the
    command's whole deadline (as the agent composes its config while its probe runs), and the result is in time."""
    started = start_local([sys.executable, "-"], "import time\nprint(repr(time.time()))\n")
    time.sleep(2.0)
    result = finish_local(started, "localhost", 1.5)
    assert result.reached and result.exit_code == 0, result
    assert float(result.stdout) - started.sent_unix_s < 1.5, "the program ran only once its caller waited for it"


def test_a_command_that_never_reads_its_input_ends_at_its_deadline() -> None:
    started = start_local(["sleep", "30"], LARGE_INPUT)
    began = time.monotonic()
    result = finish_local(started, "localhost", 1.0)
    assert not result.reached and "timed out after 1 s" in result.reason, result
    assert time.monotonic() - began < 5.0
    deadline = time.monotonic() + 5.0
    while feeders() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not feeders(), "the thread feeding a killed command's input is left behind"


def test_a_command_that_exits_before_reading_its_input_is_a_plain_result() -> None:
    result = finish_local(start_local(["true"], LARGE_INPUT), "localhost", 10.0)
    assert result.reached and result.exit_code == 0, result
