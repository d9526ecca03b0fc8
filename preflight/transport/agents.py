"""Commands carried to hosts by the agents a launcher started there: no SSH at all.

Under ``preflight agent`` every host already runs one agent, and the agents share a store: their channel
(preflight.transport.agent_channel), served by rank 0. Rank 0 runs the playbook's stages as ``check`` does, through an
``AgentRouter``: each command for a host goes into the store under the next slot of that host's agent
(``<prefix>/cmd/<rank>/<n>``), the agent runs it on its own host as the local transport runs a command (its own
session, killed at its deadline) and puts the result under ``<prefix>/res/<rank>/<n>``.
Rank 0's own host runs its commands here. A slot holding ``{"end": true}`` lets the agent go.

Each slot is served on a thread of its own, so an interrupt's cleanup reaches a host while its earlier command still
runs. Every wait has a bound: an agent waits for its next slot at most the run's whole deadline, and rank 0 waits for a
result at most the command's deadline plus ANSWER_ALLOWANCE_S, after which the host is lost, as a host whose SSH
connection dropped is.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypedDict

from preflight.spec import HostSpec, SshConfig
from preflight.transport import HostRouter
from preflight.transport.agent_channel import ChannelClient, ChannelError
from preflight.transport.base import CommandResult, RemoteCommand
from preflight.transport.local import LocalTransport

# Beyond a command's own deadline: the store's round trips and the agent's python starting the command on a busy host.
ANSWER_ALLOWANCE_S = 10.0
# How long an agent that was let go waits for the commands it still runs (each ends by its own deadline anyway).
DRAIN_S = 5.0

# A new connection to the agents' channel, every call of it waiting at most the seconds given.
StoreClient = Callable[[float], ChannelClient]


class WireCommand(TypedDict):
    """One RemoteCommand as the store carries it to its host's agent (the host is the agent's own)."""

    argv: list[str]
    stdin: str
    timeout_s: float
    group: str | None


class Slot(TypedDict, total=False):
    """What rank 0 puts in one of an agent's slots: commands to run together, or the end."""

    all_at_once: bool
    commands: list[WireCommand]
    end: bool


class WireResult(TypedDict):
    """One CommandResult as the store carries it back (the host is the slot's)."""

    reached: bool
    exit_code: int | None
    stdout: str
    stderr: str
    reason: str | None
    lost: bool
    sent_unix_s: float
    received_unix_s: float
    timings: dict[str, float]


def result_json(result: CommandResult) -> str:
    """A command's result as the store carries it (its host is the slot's)."""
    wire: WireResult = {"reached": result.reached, "exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                       "reason": result.reason, "lost": result.lost, "sent_unix_s": result.sent_unix_s,
                        "received_unix_s": result.received_unix_s, "timings": result.timings}
    return json.dumps(wire)


def result_from_json(host: str, text: str | bytes) -> CommandResult:
    """The result an agent put in the store (raw JSON from a host, read for CommandResult's fields)."""
    data: WireResult = json.loads(text)
    return CommandResult(host=host, reached=data["reached"], exit_code=data["exit_code"], stdout=data["stdout"],
                         stderr=data["stderr"], reason=data["reason"], lost=data["lost"], sent_unix_s=data["sent_unix_s"],
                         received_unix_s=data["received_unix_s"], timings=data["timings"])


class AgentRouter(HostRouter):
    """A HostRouter whose every host is reached through its agent: the stages above it cannot tell it from SSH. Its
    hosts are already ranks of one launch, so a collective starts its ranks there without a launcher of its own."""

    in_launch = True

    def __init__(self, ssh: SshConfig, client: StoreClient, prefix: str, ranks: Mapping[str, int], own_rank: int,
                 launch_env: Sequence[str] = ()) -> None:
        super().__init__(ssh)
        # What the agents' own launcher put in their environment: it describes their launch, never the check's (a
        # collective's ranks would take the agents' store for theirs), so no command sees it, as none does over SSH.
        self._unset = [f"--unset={name}" for name in launch_env]
        self._client = client
        self._prefix = prefix
        self._ranks = dict(ranks)  # host -> the rank of the agent running on it
        self._own_rank = own_rank
        self._slots: dict[int, int] = {}
        self._slot_lock = threading.Lock()

    def _next_slot(self, rank: int) -> int:
        with self._slot_lock:
            slot = self._slots.get(rank, 0)
            self._slots[rank] = slot + 1
            return slot

    def _dispatch(self, commands: Sequence[RemoteCommand], all_at_once: bool) -> list[CommandResult]:
        commands = [replace(c, argv=["env", *self._unset, *c.argv]) for c in commands] if self._unset else commands
        here = [c for c in commands if self._ranks.get(c.host.name) == self._own_rank]
        beside = LocalTransport().begin(here, all_at_once=all_at_once)
        by_rank: dict[int, list[RemoteCommand]] = {}
        for command in commands:
            rank = self._ranks.get(command.host.name)
            if rank is not None and rank != self._own_rank:
                by_rank.setdefault(rank, []).append(command)
        results: dict[int, CommandResult] = {}
        try:
            results.update(self._through_store(by_rank, all_at_once))
        except BaseException:
            beside.stop()
            raise
        results.update(zip(map(id, here), beside.results(), strict=True))
        return [results.get(id(c)) or CommandResult(host=c.host.name, reached=False, reason="no agent runs on this host")
                for c in commands]

    def _through_store(self, by_rank: Mapping[int, list[RemoteCommand]], all_at_once: bool) -> dict[int, CommandResult]:
        if not by_rank:
            return {}
        deadline_s = max(c.timeout_s for batch in by_rank.values() for c in batch) + ANSWER_ALLOWANCE_S
        with self._client(deadline_s) as store:
            return self._sent_and_answered(store, by_rank, all_at_once, deadline_s)

    def _sent_and_answered(self, store: ChannelClient, by_rank: Mapping[int, list[RemoteCommand]], all_at_once: bool,
                           deadline_s: float) -> dict[int, CommandResult]:
        answers = {}
        for rank, batch in by_rank.items():
            slot = self._next_slot(rank)
            message: Slot = {"all_at_once": all_at_once, "commands": [
                {"argv": list(c.argv), "stdin": c.stdin, "timeout_s": c.timeout_s, "group": c.group} for c in batch]}
            store.set(f"{self._prefix}/cmd/{rank}/{slot}", json.dumps(message))
            answers[rank] = f"{self._prefix}/res/{rank}/{slot}"
        store.wait_or_gone(list(answers.values()), deadline_s)
        results: dict[int, CommandResult] = {}
        for rank, batch in by_rank.items():
            text = store.get_or_gone(answers[rank])
            if text is not None:
                texts = json.loads(text)
                results.update((id(c), result_from_json(c.host.name, text)) for c, text in zip(batch, texts, strict=True))
            else:
                why = f"the agent on {batch[0].host.name} (rank {rank}) sent no result within {deadline_s:g} s"
                results.update((id(c), CommandResult(host=c.host.name, reached=False, reason=why, lost=True)) for c in batch)
        return results

    def release(self, ranks: Sequence[int]) -> None:
        """Let these ranks' agents go: the next slot of each says the run needs them no more."""
        with self._client(ANSWER_ALLOWANCE_S) as store:
            for rank in ranks:
                if rank != self._own_rank:
                    store.set(f"{self._prefix}/cmd/{rank}/{self._next_slot(rank)}", json.dumps({"end": True}))


def _answer(client: StoreClient, key: str, message: Slot, host: HostSpec) -> None:
    """Run one slot's commands here and put their results where rank 0 waits for them."""
    commands = [RemoteCommand(host=host, argv=c["argv"], stdin=c["stdin"], timeout_s=float(c["timeout_s"]), group=c["group"])
                for c in message.get("commands", [])]
    results = LocalTransport().run(commands, all_at_once=message.get("all_at_once", False))
    try:
        with client(ANSWER_ALLOWANCE_S) as store:
            store.set(key, json.dumps([result_json(r) for r in results]))
    except ChannelError:  # the channel is gone: rank 0 has given up on this answer, and names the host lost
        return


def serve(client: StoreClient, prefix: str, rank: int, host: HostSpec | None, idle_s: float) -> bool:
    """This agent's side: run each command rank 0 sends until it says the end (True), or until no slot came within idle_s
    or the channel went away (False). host: this agent's host in the config (None: not in it, and rank 0 sends it nothing)."""
    running: list[threading.Thread] = []
    try:
        store = client(idle_s)
    except ChannelError:
        return False
    with store:
        slot = 0
        while True:
            key = f"{prefix}/cmd/{rank}/{slot}"
            text = store.get_or_gone(key) if store.wait_or_gone([key], idle_s) else None
            if text is None:
                return False
            message: Slot = json.loads(text)
            if message.get("end"):
                for thread in running:
                    thread.join(timeout=DRAIN_S)
                return True
            if host is not None:
                thread = threading.Thread(target=_answer, args=(client, f"{prefix}/res/{rank}/{slot}", message, host),
                                          name="preflight-agent-command", daemon=True)
                thread.start()
                running.append(thread)
            slot += 1
