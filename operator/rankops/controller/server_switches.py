"""The shell of the members' version switches on a shared server (server_switch.py): what each
switch in flight reads from the server's pods, and carrying out what it asks of them.

One controller.inplace_pods.Executor per member switching (ServerMemory.switches), the model
path's own: its loads are the member's config at the incoming version with a version policy
listing exactly the versions kept, sent through the server's restricted repository API; its gates
(warm-up on the incoming version, equivalence against the held one in the same pod) run from the
operator against the gate pod by version, with the member's own rollout settings. Each pod's index
of the member is the server's read of that pod this round (ServerPods.read: bounded, on its own
threads), not read again (a pod the server does not ask, not Ready, is read by the executor); the
held version's P99 is the
worst of the pods' latency windows for that version, and every other member's P99 likewise
(ServerPods.read_p99s: each page read once). A switch that ends, or a member that leaves, lets its
executor go, and with it its verdicts: a switch begun again is gated anew.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankops import server_switch
from rankops.api.rankingmodel import RankingModel
from rankops.controller.inplace_pods import Executor, PodGates, PodTarget, no_gates
from rankops.controller.shared_pods import ServerPod, ServerPods
from rankops.serverplan import PodView
from rankops.render.serving import config_hash
from rankops.render.tritonconfig import triton_version
from rankops.rollout import inplace
from rankops.rollout.record import parse_time
from rankops.triton.repository import config_json


# The operator runs a member's warm-up itself, against a pod every member shares: bounded below
# the API's bounds (a gate Job's are the tenant's own pod's cost, not the operator's or the others').
MAX_GATE_REQUESTS, MAX_GATE_CONCURRENCY = 2000, 8


def gate_spec(spec: Any) -> Any:
    """The member's spec with its warm-up held to what the operator sends on a shared pod."""
    warmup = spec.rollout.warmup
    bounded = warmup.model_copy(update={"requests": min(warmup.requests, MAX_GATE_REQUESTS),
                                        "concurrency": min(warmup.concurrency, MAX_GATE_CONCURRENCY)})
    return spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"warmup": bounded})})


def member_index(member: str, target: PodTarget, view: PodView) -> inplace.PodIndex:
    """`member`'s entries of a pod's index as the server read it (the switch's PodIndex)."""
    if view.index is None:
        return inplace.PodIndex(target.name, target.uid, target.serving, None,
                                unread=view.index_error or f"{target.name}: index not read")
    return inplace.PodIndex(target.name, target.uid, target.serving,
                            {e.version: inplace.VersionState(e.state, e.reason) for e in view.index if e.name == member})


def with_drain(index: inplace.PodIndex, answer: Any, record: inplace.Record) -> inplace.PodIndex:
    """The pod's index with its router's last drain answer (a swap's): the version directories it listed,
    and, for the pod taken, the member's connections still open, only from an ask to drain sent after
    the pod was taken (an older answer, or one to an ask not to drain, says nothing of this drain)."""
    if answer is None:
        return index
    drain_open = None
    if index.name == record.load_pod and record.load_since and answer.seconds > 0 \
            and answer.asked_at >= parse_time(record.load_since):
        drain_open = answer.open
    return dataclasses.replace(index, drain_open=drain_open, staged=answer.staged)


class Switches:
    """The executors of one server's switches in flight, by member (kept in ServerMemory)."""

    def __init__(self, load_config: Callable[[str], dict[str, Any]] = config_json) -> None:
        self.load_config = load_config      # a config text -> the load's override (the server shell's own)
        self._held: dict[str, tuple[tuple[str, str], Executor]] = {}   # member -> ((version, from), executor)
        self._sent: dict[str, str] = {}     # member -> digest of the config its switch's loads were last sent with

    def seen(self, views: Sequence[Any], pods: Sequence[ServerPod], pods_read: Sequence[PodView], read_began: float,
             shell: ServerPods, namespace: str, headers: Mapping[str, str],
             route_port: Callable[[str, str], int | None] = lambda pod, member: None,
             ) -> dict[str, server_switch.SwitchSeen]:
        """What each switch in flight reads this round (`views`: the plan's MemberViews; `pods_read`: the
        server's read of its pods, begun at `read_began` (time.monotonic)); `route_port`: (pod, member) ->
        the member's port on the pod's router (a swap's drain asks)."""
        seen = {}
        switching = {v.name: v for v in views if v.switch is not None and v.switch.phase in server_switch.IN_FLIGHT}
        for member in [m for m in self._held if m not in switching]:
            self.forget(member)
        read = {p.name: p for p in pods_read}
        for name, view in switching.items():
            record = view.switch
            executor = self._executor(name, record)
            executor.pods = {p.name: PodTarget(p.name, p.uid, p.ip, p.port, None, p.metrics_port, headers,
                                               serving=p.reachable, route_port=route_port(p.name, name))
                             # every pod: a switch loads in each (their indexes are the server's read)
                             for p in sorted((p for p in pods if p.ip), key=lambda p: p.name)}
            executor.gates = PodGates(RankingModel.model_construct(metadata={"name": name, "namespace": namespace},
                                                                   spec=gate_spec(view.spec)), window_wait_s=0.0)
            executor.load_deadline_s = float(view.spec.rollout.in_place.load_timeout_seconds)
            own, others = shell.read_p99s(pods, name, triton_version(record.from_version),
                                          [v.name for v in views if v.name != name and v.held_version])
            known = {target.name: member_index(name, target, read[target.name]) for target in executor.pods.values()
                     if target.name in read and (read[target.name].index is not None or target.serving)}
            answers = executor.drain_answers()   # one copy, under the executor's lock
            known = {pod: with_drain(index, answers.get(pod), record) for pod, index in known.items()}
            seen[name] = server_switch.SwitchSeen(executor.read(known, read_began),
                                                  executor.gate_verdicts(record.version), own, others)
        return seen

    def execute(self, switches: Mapping[str, server_switch.MemberSwitch], configs: Mapping[str, str]) -> None:
        """Start what each switch asks (`configs`: member -> its config at the incoming version)."""
        for name, switch in switches.items():
            if not switch.in_flight:
                self.forget(name)
                continue
            if not switch.actions or name not in configs:
                continue
            executor = self._executor(name, switch.record, configs[name])
            executor.submit(switch.actions, switch.record)

    def _executor(self, name: str, record: inplace.Record, config_text: str | None = None) -> Executor:
        """The member's executor for this switch (another switch's, its verdicts with it, is let go)."""
        key = (record.version, record.from_version)
        held = self._held.get(name)
        if held is None or held[0] != key:
            self.forget(name)
            held = self._held[name] = (key, Executor(name, {}, None, gates=no_gates))
        if config_text is not None:
            held[1].config = self.load_config(config_text)
            self._sent[name] = config_hash(config_text)
        return held[1]

    def confirmed(self, adopted: Mapping[tuple[str, str], str]) -> dict[tuple[str, str], str]:
        """Of a plan's `adopted` ((pod, member) -> the digest of the config wanted now, its switch just
        ended), those whose switch's loads this process sent with that very config: one edited since
        (or sent by a process before this one) is loaded again, never taken as loaded."""
        return {key: digest for key, digest in adopted.items() if self._sent.get(key[1]) == digest}

    def forget(self, member: str) -> None:
        self._sent.pop(member, None)
        held = self._held.pop(member, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        for member in list(self._held):
            self.forget(member)
