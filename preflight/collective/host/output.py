"""A rank's output and its bounds: event lines written whole, the per-phase watchdog, the watch on failed peers."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from preflight.collective.host.events import EXIT_TIMEOUT, event_line

if TYPE_CHECKING:
    from preflight.collective.wire import (
        Event,
        PeerFailure,
    )


_PARENT_POLL_S = 0.5
_OUTPUT_LOCK_WAIT_S = 5.0




class Output:
    """Writes event lines whole, even when several local ranks share one stdout pipe."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path

    def emit(self, event: Event) -> None:
        """Write one event line and flush it."""
        data = event_line(event)
        with self._locked():
            sys.stdout.flush()
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(sys.stdout.fileno(), view):]
            except OSError:
                # The reader is gone (the orchestrator was cut): nobody is left to tell, and the watchdog still bounds the run.
                return

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # A pipe write longer than PIPE_BUF (4 KiB; rank 0's result with every identity) can be interleaved with the other
        # local ranks' writes: all ranks of a host take a lock beside worker.py. Bounded, so a stuck writer cannot stop a
        # timeout event.
        try:
            fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            yield
            return
        try:
            give_up = time.monotonic() + _OUTPUT_LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > give_up:
                        break
                    time.sleep(0.002)
                except OSError:
                    break  # a filesystem without locks: lines short enough are still whole
            yield
        finally:
            os.close(fd)


class Watchdog:
    """Ends the process when a phase overruns its deadline, or when the process that started it is gone."""

    def __init__(self, parent_pid: int, on_timeout: Callable[[str, float], None]) -> None:
        self.parent_pid = parent_pid
        self.on_timeout = on_timeout
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._phase: str | None = None
        self._deadline_s = 0.0
        self._expires: float | None = None
        self._exit_code = EXIT_TIMEOUT
        self._thread = threading.Thread(target=self._watch, name="preflight-watchdog", daemon=True)

    def start(self) -> None:
        """Start watching; no deadline until arm()."""
        self._thread.start()

    def arm(self, phase: str | None, deadline_s: float, *, exit_code: int = EXIT_TIMEOUT) -> None:
        """From now, deadline_s for phase; phase None overruns silently (cleanup after an event that already stands)."""
        with self._lock:
            self._phase = phase
            self._deadline_s = deadline_s
            self._expires = time.monotonic() + deadline_s
            self._exit_code = exit_code
        self._changed.set()

    def _watch(self) -> None:
        while True:
            with self._lock:
                phase, deadline_s, expires, exit_code = self._phase, self._deadline_s, self._expires, self._exit_code
            now = time.monotonic()
            if expires is not None and now >= expires:
                if phase is not None:
                    self.on_timeout(phase, deadline_s)
                os._exit(exit_code)
            if os.getppid() != self.parent_pid:
                # torchrun is gone, and with it whoever would read our output or stop us.
                os._exit(EXIT_TIMEOUT)
            wait = _PARENT_POLL_S if expires is None else min(_PARENT_POLL_S, expires - now)
            self._changed.wait(wait)
            self._changed.clear()


class PeerWatch:
    """Tells the other ranks of the launch when this one fails, and stops this one when another does.

    A rank whose init fails (a missing interface, an unreachable peer) never joins gloo's or NCCL's rendezvous, and its
    peers would wait there until their init deadline: once per launch, so once per round when splitting a failing set.
    The first rank to fail writes its error under a key of torchrun's agent store; every rank keeps a second client
    of that store blocked on the key (no polling: the store answers when the key is set), and ends the moment it is.
    Only under torchrun's shared agent store (TORCHELASTIC_USE_AGENT_STORE): without it the store lives in rank 0's
    process, and the phase deadlines alone bound the wait."""

    def __init__(self, run_id: str, wait_s: float, post_s: float) -> None:
        self.key = f"preflight/{run_id}/failed"
        self.wait_s = wait_s
        self.post_s = post_s

    @staticmethod
    def _endpoint() -> tuple[str, int] | None:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not host or not port.isdigit():
            return None
        return host, int(port)

    def _client(self, timeout_s: float) -> Any:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # torch's stub leaves it out of __all__

        endpoint = self._endpoint()
        if endpoint is None:
            return None
        return TCPStore(endpoint[0], endpoint[1], is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)

    def start(self, on_peer_failed: Callable[[PeerFailure], None]) -> None:
        """Call on_peer_failed(what the failing rank posted) from a thread of its own once any rank posts."""
        if self._endpoint() is not None:
            threading.Thread(target=self._watch, args=(on_peer_failed,), name="preflight-peers", daemon=True).start()

    def _watch(self, on_peer_failed: Callable[[PeerFailure], None]) -> None:
        try:
            store = self._client(self.wait_s)
            store.wait([self.key], timedelta(seconds=self.wait_s))
            failed = _peer_failure(json.loads(store.get(self.key)))
        except Exception:
            # The store is gone (the launch is over) or never answered: the phase deadlines still bound this rank.
            return
        if failed is not None:
            on_peer_failed(failed)

    def post(self, failed: PeerFailure) -> None:
        """Tell the peers; the first rank to fail is the one they hear of. Best effort, within post_s."""
        try:
            store = self._client(self.post_s)
            if store is not None and store.add(self.key + "/count", 1) == 1:
                store.set(self.key, json.dumps(failed))
        except Exception:
            traceback.print_exc()


def _peer_failure(posted: object) -> PeerFailure | None:
    """What a peer posted, when it has the shape post() gives it."""
    if not isinstance(posted, dict):
        return None
    rank, host, phase, error = posted.get("rank"), posted.get("host"), posted.get("phase"), posted.get("error")
    if isinstance(rank, int) and isinstance(host, str) and isinstance(phase, str) and isinstance(error, str):
        return {"rank": rank, "host": host, "phase": phase, "error": error}
    return None


def die_with_parent() -> None:
    """On Linux, have the kernel SIGKILL this process when its parent dies.

    torch elastic starts workers in a new session, so killing torchrun's process group does not reach them."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
