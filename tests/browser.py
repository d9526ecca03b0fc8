"""Debian's headless Chromium, driven over the DevTools protocol with the `websockets` client: load a page, collect
its console errors and every request it makes, measure elements' layout boxes, take a screenshot.

Chromium is started as root with the flags that keep it off the network (no sync, no component updates, no
background requests, no QUIC) and with a fresh profile; the page is a local file.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--remote-debugging-port=0",
         "--remote-allow-origins=*", "--hide-scrollbars"]
START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 30.0


@dataclass
class Page:
    """What the browser saw of one page."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    screenshot: bytes = b""


class Browser:
    """One DevTools session on one page target."""

    def __init__(self, websocket: Any) -> None:
        self.socket = websocket
        self.next_id = 0
        self.events: list[dict[str, Any]] = []  # raw DevTools JSON

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command and wait for its answer, keeping the events that arrive meanwhile."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)
        raise TimeoutError(f"{method}: no answer in {COMMAND_TIMEOUT_S} s")

    def wait_for(self, event: str) -> None:
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while not any(e.get("method") == event for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} in {COMMAND_TIMEOUT_S} s")
            self.events.append(json.loads(self.socket.recv(timeout=max(deadline - time.monotonic(), 0.01))))

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value (JSON-able) in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextlib.contextmanager
def chromium() -> Iterator[str]:
    """Start headless Chromium; yield its DevTools HTTP endpoint (http://127.0.0.1:PORT); stop it."""
    profile = tempfile.mkdtemp(prefix="preflight-chromium-")
    # TMPDIR inside the profile: Chromium's process singleton makes /tmp/org.chromium.Chromium.* (its socket and cookie)
    # in the temporary folder and removes it only on a clean exit, which the SIGKILL below never is; one was left in /tmp
    # per suite run. Inside the profile, the rmtree below takes it.
    process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "TMPDIR": profile})
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        endpoint = None
        while endpoint is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                raise RuntimeError(f"chromium exited with {process.returncode} before DevTools listened")
            found = re.search(r"DevTools listening on ws://([\d.]+:\d+)/", line)
            endpoint = f"http://{found.group(1)}" if found else None
        if endpoint is None:
            raise TimeoutError(f"chromium's DevTools did not listen within {START_TIMEOUT_S} s")
        yield endpoint
    finally:
        # Its whole process group, and the profile only once the group is gone: a child (the network service) that
        # outlived the main process wrote into it after rmtree, leaving /tmp/preflight-chromium-*/Default behind.
        with contextlib.suppress(ProcessLookupError):  # none left: Chromium exited by itself (it failed to start)
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        _wait_group_gone(process.pid, within_s=10)
        shutil.rmtree(profile, ignore_errors=True)


def _wait_group_gone(pgid: int, *, within_s: float) -> None:
    """Until no process of the group is left (killed members end at once), or within_s has passed."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@contextlib.contextmanager
def open_page(endpoint: str, path: Path, width: int = 1200, height: int = 900) -> Iterator[tuple[Browser, Page]]:
    """Load a local file in a new tab; yield the session and the page (filled by `seen`)."""
    from websockets.sync.client import connect

    request = urllib.request.Request(f"{endpoint}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(request, timeout=COMMAND_TIMEOUT_S) as answer:  # the local DevTools endpoint only
        target = json.load(answer)
    with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=COMMAND_TIMEOUT_S) as socket:
        browser = Browser(socket)
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable")
        browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        browser.call("Page.navigate", url=path.resolve().as_uri())
        browser.wait_for("Page.loadEventFired")
        yield browser, Page()


def seen(browser: Browser, page: Page) -> Page:
    """Fill the page's console errors and requests from the events so far."""
    for event in browser.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            page.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            page.console_errors.append(str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            page.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            page.requests.append(str(params.get("request", {}).get("url")))
    return page


def screenshot(browser: Browser) -> bytes:
    """The whole page as PNG, beyond the viewport."""
    metrics = browser.call("Page.getLayoutMetrics")
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
    return base64.b64decode(shot["data"])
