"""preflight's mesh test: run on every host at once, it proves the paths the job will use before torchrun does.

Sent to each host as text, joined after the shared helpers (preflight.bundle.MESH), and run as ``python3 - CONFIG_JSON``
(standard library only). Every host listens on an ephemeral TCP and UDP port of each of its ``networks`` (the job's
interface, or with rails each rail's interface), as gloo and NCCL do; the master also serves a registry on the
rendezvous port, as torchrun's c10d store does, where every host registers and gets the table of all. Then each host,
at once and on every network (rail r to its peers' rail r): connects over TCP to ``tcp_peers`` (ok, filtered, refused,
no route); sends do-not-fragment datagrams at
its MTU, at common smaller sizes and at the loss datagrams' size to ``tcp_peers``, and searches between the largest
that passes and the smallest that does not for the size the path carries (a path-MTU blackhole hangs NCCL on large
messages only); sends small datagrams to ``loss_peers`` and counts the echoes.

It listens until the master says every host is done, prints one JSON object and exits 0; it reports and never judges
(preflight.connectivity does). Every wait has a deadline inside ``total_s``.
"""


from __future__ import annotations

import contextlib
import errno
import sys
import threading

from preflight.connectivity.mesh.prober import Prober, on_network, probe_peers
from preflight.connectivity.mesh.registry import Listeners, Registry, Served, register
from preflight.connectivity.mesh.sockets import connect_all, now, read_line
from preflight.hostlib.wire import read_config, write_output

# The types, for the type checker only: typing is not imported (see sockets.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from preflight.connectivity.mesh.sockets import Key
    from preflight.connectivity.wire import LossRow, MeshConfig, MeshOutput, MtuRow


def main(argv: list[str]) -> int:
    config: MeshConfig = read_config(argv)
    began = now()
    end_deadline = began + config["total_s"]
    join_deadline = began + config["join_s"]
    out: MeshOutput = {"host": config["host"], "address": config["address"], "serving": None, "registry": None, "joined": [],
                       "listening": [], "tcp": [], "loss": [], "mtu": [], "error": None, "elapsed_s": 0.0}
    served: list[Served] = []
    try:
        for network in config["networks"]:
            listeners = Listeners(network["address"])
            served.append(listeners)
            tcp_port, udp_port = listeners.ports()
            out["listening"].append({"rail": network["rail"], "address": network["address"], "tcp": tcp_port, "udp": udp_port})
        if config["is_master"]:
            master = config["master"]
            try:
                Registry(config["address"], master["port"], config["nonce"], config["expected"], join_deadline, end_deadline - 1.0)
                out["serving"] = {"result": "ok", "detail": ""}
            except OSError as e:
                # Someone holds the rendezvous port: the collective says who; there is nothing to test here.
                out["serving"] = {"result": "in-use" if e.errno == errno.EADDRINUSE else "error", "detail": e.strerror or str(e)}
                return finish(out, began)
        answer, table, channel = register(config, out["listening"], join_deadline)
        out["registry"] = answer
        if table is None or channel is None:
            return finish(out, began)
        out["joined"] = sorted(table)
        targets: list[tuple[Key, str, int]] = []
        senders = []
        rows: dict[int | None, tuple[list[LossRow], list[MtuRow]]] = {}
        for network in config["networks"]:
            peers = on_network(table, network["rail"])
            targets += [((p, network["rail"]), peers[p]["address"], peers[p]["tcp"]) for p in config["tcp_peers"] if p in peers]
            prober = Prober(network["address"])
            served.append(prober)
            # The UDP probes run while the TCP connects wait on silent peers, every network's at once: rails cost
            # threads, not time.
            senders.append(threading.Thread(target=probe_peers, args=(config, network, peers, prober, rows), daemon=True))
            senders[-1].start()
        outcome = connect_all(targets, config["connect_s"])
        for (peer, rail), address, port in targets:
            result, detail, ms, sock = outcome[(peer, rail)]
            if sock is not None:
                sock.close()
            out["tcp"].append({"peer": peer, "rail": rail, "address": address, "port": port, "result": result, "detail": detail,
                               "ms": ms})
        for sender in senders:
            sender.join(max(0.0, end_deadline - now() - 1.0))
        for network in config["networks"]:
            loss, mtu = rows.get(network["rail"], ([], []))
            out["loss"] += loss
            out["mtu"] += mtu
        with contextlib.suppress(OSError):
            channel.sendall(b"done\n")
        # Listen on until every host is done testing this one.
        read_line(channel, end_deadline - 0.5)
        channel.close()
    except OSError as e:
        out["error"] = f"{e.strerror or e}"
    finally:
        for part in reversed(served):
            part.close()
    return finish(out, began)


def finish(out: MeshOutput, began: float) -> int:
    out["elapsed_s"] = round(now() - began, 3)
    return write_output(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
