"""The agents' channel (preflight.transport.agent_channel), on loopback: the store rank 0's agent serves in the standard
library, so that no agent imports torch (a host's third torch process ran a 64-host launch out of memory)."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_architecture import _imports, _modules

from preflight.agent import CHANNEL_PORTS, channel_ports
from preflight.transport.agent_channel import ChannelError, ChannelServer, connect, serve_channel

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    serving = serve_channel([0], "run-a")
    try:
        yield serving
    finally:
        serving.close()


def test_set_get_check_and_a_wait_that_another_client_ends(server: ChannelServer) -> None:
    with connect("127.0.0.1", [server.port], "run-a", 5, 5) as one, connect("127.0.0.1", [server.port], "run-a", 5, 5) as two:
        one.set("a", "1")
        assert (two.get("a"), two.get("b"), two.check(["a"]), two.check(["a", "b"])) == ("1", None, True, False)
        began = time.monotonic()
        assert two.wait(["a", "b"], 0.3) is False
        assert 0.3 <= time.monotonic() - began < 3

        def later() -> None:
            time.sleep(0.2)
            one.set("b", "2")

        setter = threading.Thread(target=later)
        setter.start()
        began = time.monotonic()
        assert two.wait(["a", "b"], 20) is True
        assert time.monotonic() - began < 5
        setter.join()
        assert two.get("b") == "2"


def test_another_launch_and_a_stranger_are_turned_away_without_disturbing_the_others(server: ChannelServer) -> None:
    with connect("127.0.0.1", [server.port], "run-a", 5, 5) as ours:
        ours.set("k", "v")
        with pytest.raises(ChannelError, match="this is run run-a's preflight-agents/1"):
            connect("127.0.0.1", [server.port], "run-b", 0.5, 1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as stranger:
            stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert stranger.recv(100) == b""  # a length no frame has: closed
        assert ours.get("k") == "v"


def test_closing_the_server_ends_a_waiting_client_at_once(server: ChannelServer) -> None:
    waiter = connect("127.0.0.1", [server.port], "run-a", 5, 5)
    failed: list[float] = []

    def wait() -> None:
        began = time.monotonic()
        with pytest.raises(ChannelError):
            waiter.wait(["never"], 60)
        failed.append(time.monotonic() - began)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    server.close()
    thread.join(timeout=10)
    assert failed and failed[0] < 5


def test_a_taken_port_is_passed_over_by_rank_0_and_by_the_others() -> None:
    """Rank 0 serves on the first of its ports that is free; a client finds it past a port where another program
    listens (and answers what is no frame of this protocol)."""
    with socket.create_server(("127.0.0.1", 0)) as foreign:
        taken = foreign.getsockname()[1]

        def answer_badly() -> None:
            for _ in range(20):  # bounded: the client tries this port once a round until it finds ours
                try:
                    connection, _address = foreign.accept()
                except OSError:
                    return
                with connection:
                    connection.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

        foreign.settimeout(10)
        threading.Thread(target=answer_badly, daemon=True).start()
        with socket.create_server(("", 0)) as probe:
            free = probe.getsockname()[1]
        serving = serve_channel([taken, free], "run-a")
        try:
            assert serving.port == free
            began = time.monotonic()
            with connect("127.0.0.1", [taken, free], "run-a", 10, 5) as client:
                client.set("x", "y")
                assert client.get("x") == "y"
            assert time.monotonic() - began < 5
        finally:
            serving.close()
    with socket.create_server(("", 0)) as holder, pytest.raises(OSError, match="taken on this host"):
        serve_channel([holder.getsockname()[1]], "run-a")


def test_a_channel_no_one_serves_fails_by_its_deadline() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        nobody = probe.getsockname()[1]
    began = time.monotonic()
    with pytest.raises(ChannelError, match=f"no agents' channel at 127.0.0.1 port {nobody} within 0.5 s"):
        connect("127.0.0.1", [nobody], "run-a", 0.5, 1)
    assert time.monotonic() - began < 3


def test_the_channel_s_ports_beside_torchrun_s_store() -> None:
    assert channel_ports(29500, launcher_holds_it=False) == (29500,)
    assert channel_ports(29500, launcher_holds_it=True) == tuple(range(29501, 29501 + CHANNEL_PORTS))
    assert channel_ports(65533, launcher_holds_it=True) == (65534, 65535, *range(65532, 65532 - CHANNEL_PORTS + 2, -1))
    assert len(set(channel_ports(65535, launcher_holds_it=True))) == CHANNEL_PORTS


def test_no_module_the_agent_reaches_imports_torch() -> None:
    """The agent's process holds no torch: no module it can reach (by an import at the top or inside a function) names
    torch, and all of them imported at once load none."""
    modules = _modules()
    reached, todo = set(), ["preflight.agent"]
    while todo:
        if (module := todo.pop()) not in reached:
            reached.add(module)
            todo += _imports(modules[module], set(modules))
    naming = [module for module in sorted(reached) for node in ast.walk(ast.parse(modules[module].read_text(encoding="utf-8")))
              if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names))
              or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch")]
    assert "preflight.pipeline" in reached and "preflight.collective.run" in reached
    assert naming == []
    code = f"import sys\nfor m in {sorted(reached)!r}:\n    __import__(m)\nprint('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert (loaded.returncode, loaded.stdout.strip()) == (0, "False"), loaded.stderr[-2000:]
