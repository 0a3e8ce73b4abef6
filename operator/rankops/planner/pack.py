"""Several ranking models on the fewest GPUs (issue 42): which models share a tritonserver, on how
many cards, so that each card's memory holds them all and each model's P99 holds beside the others.

A *server* is one shared tritonserver Deployment of R replicas, one card each; every card of a
server holds the same models, and each model's traffic is spread over the R cards.

Memory, per card (two_versions.on_one_gpu, the in-place switch's arithmetic): the sum of each
model's instances x (weights + GPU embeddings + activations at its max batch), + the runtime
reserve paid once (one tritonserver, one CUDA context), x (1 + margin); with `switch_room`, + one
more copy of the largest model's instances: room for one in-place version switch at a time on a
server, whichever model it is (concurrent switches on one server must queue).

Time, per card: the models' batches share the device. Each model keeps the batching and instances
its own plan chose (search.plan); on a shared card its compute times are stretched by
1 + s x B, B the sum of the other models' busy fractions on that card and s its
planning.sharedGpuSlowdown. This is the simulator's own rule for concurrent executions on one GPU
(an execution that starts while k others run takes compute x (1 + s x k), s measured for the card),
applied to the other models' executions with k their expected number in flight. The busy fractions
are a fixed point, simulated: each model is simulated at its per-card rate with its stretched
profile, which raises its busy time (and its batches grow), which stretches the others
(SHARING_ROUNDS rounds from the fractions alone). Rejected: 1 / (1 - B), which the issue's brief
offered. It gives a model nothing while another runs (strict priority for every other model);
Triton's models time-slice or overlap instead, so with s = 1 (pure time slicing) an execution
overlapped by another takes twice as long (1 + B on average), not forever, and with B from small
batches at light load (a model 90% busy running batches of 1) it refused packs that the device
holds. Limits: an average, not a joint simulation of the models' batches (bursts of two at once
are only covered by the planner's margins); the busy fraction of several instances is their union.
The check is the planner's own on the stretched profile: meets_budget (LOAD_MARGIN more load,
P99_MARGIN to spare) and the saturation ceiling; and never above the model's own sustainable rate.

Replicas, counted as today (search._size_fleet): a model alone gets its plan's GPUs, max(headroom,
failure tolerance) — a spare card per model. A server of R cards holds when every model meets its
P99 at q / (R x (1 - headroom)) and at q / (R - failureTolerance) per card, all models at once:
the same two rules, so a server keeps its spare card once, not once per model.

Packing is best-fit decreasing by the binding resource: models sorted by the larger of their
memory share of a card and their GPU need (target / sustainable, fractional cards), each joins the
server it adds the fewest cards to (the first such; fewer than its own plan takes alone), or opens
its own server. First-fit put a model on the first server that took it, leaving a server that would
have taken it for free to open cards later (5 stand-ins: 5 cards where 4 do).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from rankops.planner.inputs import PlanError, PlanInputs, slowed
from rankops.planner.memory import _n
from rankops.planner.result import PlanResult
from rankops.planner.search import (LOAD_MARGIN, REPORT_REQUESTS, SEARCH_REQUESTS, VERIFY_REQUESTS, _bound,
                                    _sim, evaluate, meets_budget, plan)
from rankops.planner.two_versions import DEFAULT_MARGIN, VersionOnGpu, on_one_gpu


SHARING_ROUNDS = 3   # fixed-point rounds of the models' busy fractions on one card


class PackError(PlanError):
    """No pack: the message names the model that does not fit and carries the arithmetic."""


@dataclass(frozen=True)
class ModelToPack:
    name: str
    inputs: PlanInputs           # its plan inputs; spec.planning.memory is required to pack


@dataclass(frozen=True)
class Card:
    """The GPU every server's cards are (one kind per pack)."""
    memory_mib: float
    runtime_reserve_mib: float | None = None   # None: the largest of the models' runtimeReserveMiB
    margin: float = DEFAULT_MARGIN
    switch_room: bool = False                  # room for one in-place version switch per server
    max_cards: int | None = None               # None: as many as the pack needs
    name: str = "GPU"
    # every model's P99 must also hold while all the others burst (run all their instances at once)
    burst_proof: bool = False


@dataclass(frozen=True)
class PackedModel:
    name: str
    config: str                  # the batching and instances of its own plan
    target_qps: float
    per_card_qps: float          # at target, spread over the server's cards
    memory_mib: float            # its instances on one card (no runtime reserve)
    gpu_need: float              # target / its sustainable rate alone: fractional cards
    gpus_alone: int              # what its own plan takes (today's count)
    busy_fraction: float         # of the device at per_card_qps, beside the others
    compute_stretch: float       # its compute x this beside the others (1 alone)
    p99_budget_ms: float
    p99_alone_ms: float          # its own plan's prediction, on gpus_alone cards
    p99_shared_ms: float         # on the shared card at target, slowed by the others
    # at target with every other model saturating its instances (a burst): compute x burst_stretch
    p99_burst_ms: float = 0.0
    burst_stretch: float = 1.0


@dataclass(frozen=True)
class Server:
    models: tuple[PackedModel, ...]
    cards: int
    first_card: int              # cards are numbered across the pack from 1
    memory_mib: float            # per card, reserve and switch room included, before the margin
    memory_arithmetic: str

    @property
    def card_numbers(self) -> range:
        return range(self.first_card, self.first_card + self.cards)


@dataclass(frozen=True)
class Pack:
    card: Card
    runtime_reserve_mib: float
    servers: tuple[Server, ...]
    explanation: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> int:
        return sum(s.cards for s in self.servers)

    @property
    def gpus_one_per_card(self) -> int:
        return sum(m.gpus_alone for s in self.servers for m in s.models)

    @property
    def gpu_need(self) -> float:
        return sum(m.gpu_need for s in self.servers for m in s.models)

    def to_json(self) -> dict:
        return {
            "card": {"name": self.card.name, "memoryMiB": self.card.memory_mib,
                     "runtimeReserveMiB": self.runtime_reserve_mib, "margin": self.card.margin,
                     "switchRoom": self.card.switch_room, "maxCards": self.card.max_cards},
            "gpus": self.gpus, "gpusOnePerCard": self.gpus_one_per_card, "gpuNeed": round(self.gpu_need, 3),
            "servers": [server_json(s) for s in self.servers],
            "explanation": list(self.explanation),
        }


def server_json(s: Server) -> dict:
    return {
        "cards": list(s.card_numbers), "memoryMiB": s.memory_mib, "memory": s.memory_arithmetic,
        "models": [{
            "name": m.name, "config": m.config, "targetQps": m.target_qps,
            "perCardQps": round(m.per_card_qps, 1), "memoryMiB": m.memory_mib,
            "gpuNeed": round(m.gpu_need, 3), "gpusAlone": m.gpus_alone,
            "busyFraction": round(m.busy_fraction, 3), "computeStretch": round(m.compute_stretch, 3),
            "p99BudgetMs": m.p99_budget_ms, "p99AloneMs": round(m.p99_alone_ms, 3),
            "p99SharedMs": round(m.p99_shared_ms, 3), "p99BurstMs": round(m.p99_burst_ms, 3),
            "burstStretch": round(m.burst_stretch, 3),
        } for m in s.models],
    }


@dataclass(frozen=True)
class _Alone:
    """A model and its own plan, on the pack's card."""
    name: str
    inputs: PlanInputs
    result: PlanResult
    memory_mib: float            # its instances on one card

    @property
    def holder(self) -> VersionOnGpu:
        per_instance = self.inputs.memory.per_instance_mib(self.result.max_batch_size)
        return VersionOnGpu(self.name, 1, "", per_instance_mib=per_instance,
                            instances=self.result.instances_per_gpu)

    @property
    def gpu_need(self) -> float:
        return self.inputs.target_qps / self.result.qps_per_gpu

    def card_rate(self, cards: int) -> float:
        """The per-card rate its P99 must hold at on `cards` cards: the larger of the headroom
        rule and the rule with failureTolerance cards lost (search._size_fleet's two rules)."""
        lost = self.inputs.failure_tolerance
        if cards <= lost:
            return math.inf
        return self.inputs.target_qps * max(1.0 / (cards * (1.0 - self.inputs.headroom)), 1.0 / (cards - lost))

    def busy(self, inputs: PlanInputs, rate: float, requests: int) -> float:
        """Busy fraction of the device at `rate` with `inputs` (its own, or stretched)."""
        return _sim(inputs, self.result.config, rate, requests).gpu_busy_fraction


def pack(models: list[ModelToPack], card: Card) -> Pack:
    """The models on the fewest cards of `card`; raises PackError naming the model that does not fit."""
    if not models:
        raise PackError("nothing to pack: give at least one model")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise PackError(f"model names must differ to share a server: {', '.join(sorted(names))}")
    alone = [_plan_alone(m, card) for m in models]
    reserve = card.runtime_reserve_mib if card.runtime_reserve_mib is not None else \
        max(a.inputs.memory.runtime_reserve_mib for a in alone)
    for a in alone:
        fits, arithmetic = _memory(card, reserve, [a])
        if not fits:
            raise PackError(f"{a.name} does not fit on one {card.name} by itself: {arithmetic}")
    usable = max(card.memory_mib / (1 + card.margin) - reserve, 1e-9)
    order = sorted(alone, key=lambda a: (-max(a.memory_mib / usable, a.gpu_need), a.name))
    servers: list[tuple[list[_Alone], int]] = []
    for model in order:
        refusals, best = [], None
        for i, (members, cards) in enumerate(servers):
            joined, why = _join(members, cards, model, card, reserve)
            if joined is None:
                refusals.append(f"server {i + 1} ({', '.join(a.name for a in members)}): {why}")
            elif best is None or joined - cards < best[1] - servers[best[0]][1]:
                best = (i, joined)
                if joined == cards:
                    break   # it joins at no cost: no server can do better
        if best is not None:
            members, _ = servers[best[0]]
            servers[best[0]] = (members + [model], best[1])
        else:
            used = sum(c for _, c in servers)
            if card.max_cards is not None and used + model.result.gpus > card.max_cards:
                raise PackError(
                    f"{model.name} does not fit in {card.max_cards} {card.name}(s): "
                    + "; ".join(refusals + [f"a server of its own takes {model.result.gpus} card(s), "
                                            f"{used} + {model.result.gpus} > {card.max_cards}"]))
            servers.append(([model], model.result.gpus))
    built, first = [], 1
    for members, cards in servers:
        built.append(_server(members, cards, first, card, reserve))
        first += cards
    result = Pack(card, reserve, tuple(built))
    return dataclasses.replace(result, explanation=tuple(_explain(result)))


def _plan_alone(model: ModelToPack, card: Card) -> _Alone:
    inputs = model.inputs
    if inputs.memory is None:
        raise PackError(f"{model.name}: no spec.planning.memory; packing needs each model's GPU memory")
    if inputs.p99_budget_ms is None or inputs.target_qps is None:
        raise PackError(f"{model.name}: no spec.slo {{p99LatencyMs, targetQps}}; packing needs both")
    inputs = dataclasses.replace(inputs, gpu_memory_mib=card.memory_mib)
    try:
        result = plan(inputs) if inputs.auto else evaluate(inputs)
    except PlanError as exc:
        raise PackError(f"{model.name}: no plan alone: {exc}") from None
    if result.problems or result.qps_per_gpu <= 0:
        raise PackError(f"{model.name}: its own plan has problems: {'; '.join(result.problems)}")
    per_card = inputs.memory.per_gpu_mib(result.max_batch_size, result.instances_per_gpu) \
        - inputs.memory.runtime_reserve_mib
    return _Alone(model.name, inputs, result, per_card)


def _memory(card: Card, reserve: float, members: list[_Alone]) -> tuple[bool, str]:
    holders = [a.holder for a in members]
    if card.switch_room:
        largest = max(members, key=lambda a: (a.memory_mib, a.name))
        holders.append(dataclasses.replace(largest.holder, name=f"{largest.name}'s next version"))
    return on_one_gpu(holders, card.memory_mib, reserve, card.margin)


def _join(members: list[_Alone], cards: int, model: _Alone, card: Card,
          reserve: float) -> tuple[int | None, str]:
    """(cards, "") for the server with `model` added, on fewer cards than apart; else (None, why)."""
    fits, arithmetic = _memory(card, reserve, members + [model])
    if not fits:
        return None, f"memory: {arithmetic}"
    group = members + [model]
    why = ""
    for n in range(max(cards, model.result.gpus), cards + model.result.gpus):
        why = _fails_confirmed(group, n, card.burst_proof)
        if not why:
            return n, ""
    return None, f"time: on {cards + model.result.gpus - 1} card(s), {why}"


def _sharing(group: list[_Alone], rates: dict[str, float], requests: int) -> dict[str, tuple[float, float]]:
    """name -> (busy fraction, compute stretch) of each model at `rates` per card beside the others."""
    busy = {a.name: a.busy(a.inputs, rates[a.name], requests) for a in group}
    stretch = {a.name: 1.0 for a in group}
    for _ in range(SHARING_ROUNDS if len(group) > 1 else 0):
        stretch = {a.name: 1 + a.inputs.shared_gpu_slowdown * sum(b for n, b in busy.items() if n != a.name)
                   for a in group}
        busy = {a.name: a.busy(slowed(a.inputs, stretch[a.name]), rates[a.name], requests) for a in group}
    return {a.name: (busy[a.name], stretch[a.name]) for a in group}


def _fails(group: list[_Alone], cards: int, requests: int = SEARCH_REQUESTS, burst_proof: bool = False) -> str:
    """Why the group does not hold on `cards` cards (every model at its card_rate), or "";
    `burst_proof`: each model's P99 also holds with the others saturated (burst_stretch)."""
    rates = {a.name: a.card_rate(cards) for a in group}
    if any(math.isinf(r) for r in rates.values()):
        return f"{cards} card(s) leave none after failureTolerance"
    for a in group:
        if rates[a.name] > a.result.qps_per_gpu:
            return (f"{a.name} needs {rates[a.name]:.0f} req/s per card, above the {a.result.qps_per_gpu:.0f} "
                    "it sustains even alone")
    sharing = _sharing(group, {n: r * (1 + LOAD_MARGIN) for n, r in rates.items()}, requests)
    for a in group:
        rate, (_, stretch) = rates[a.name], sharing[a.name]
        stretched = slowed(a.inputs, stretch)
        if rate > _bound(stretched, a.result.config) or not meets_budget(stretched, a.result.config, rate, requests):
            p99 = _sim(stretched, a.result.config, rate * (1 + LOAD_MARGIN), requests).p99_ms
            others = ", ".join(f"{n} {b:.0%} busy" for n, (b, _) in sharing.items() if n != a.name)
            return (f"{a.name}'s P99 at {rate:.0f} req/s per card beside {others} (compute x {stretch:.2f}) "
                    f"is {p99:.2f} ms at {LOAD_MARGIN:.0%} more load, over its {a.inputs.p99_budget_ms:g} ms budget")
        if burst_proof and len(group) > 1:
            burst = burst_stretch(a, group)
            stretched = slowed(a.inputs, burst)
            if rate > _bound(stretched, a.result.config) or not meets_budget(stretched, a.result.config, rate, requests):
                p99 = _sim(stretched, a.result.config, rate * (1 + LOAD_MARGIN), requests).p99_ms
                return (f"{a.name}'s P99 at {rate:.0f} req/s per card while the others burst (compute x "
                        f"{burst:.2f}) is {p99:.2f} ms at {LOAD_MARGIN:.0%} more load, over its "
                        f"{a.inputs.p99_budget_ms:g} ms budget")
    return ""


def _fails_confirmed(group: list[_Alone], cards: int, burst_proof: bool = False) -> str:
    """_fails with short simulations, confirmed by long ones (as search.verified_qps does)."""
    return _fails(group, cards, burst_proof=burst_proof) or _fails(group, cards, VERIFY_REQUESTS, burst_proof=burst_proof)


def _server(members: list[_Alone], cards: int, first: int, card: Card, reserve: float) -> Server:
    at_target = {a.name: a.inputs.target_qps / cards for a in members}
    sharing = _sharing(members, at_target, REPORT_REQUESTS)
    packed = []
    for a in members:
        busy, stretch = sharing[a.name]
        shared = _sim(slowed(a.inputs, stretch), a.result.config, at_target[a.name], REPORT_REQUESTS)
        burst = burst_stretch(a, members)
        burst_p99 = _sim(slowed(a.inputs, burst), a.result.config, at_target[a.name], REPORT_REQUESTS).p99_ms
        packed.append(PackedModel(
            name=a.name, config=a.result.config.describe(), target_qps=a.inputs.target_qps,
            per_card_qps=at_target[a.name], memory_mib=a.memory_mib, gpu_need=a.gpu_need,
            gpus_alone=a.result.gpus, busy_fraction=busy, compute_stretch=stretch,
            p99_budget_ms=a.inputs.p99_budget_ms, p99_alone_ms=a.result.predicted_p99_ms,
            p99_shared_ms=shared.p99_ms, p99_burst_ms=burst_p99, burst_stretch=burst))
    _, arithmetic = _memory(card, reserve, members)
    used = sum(a.memory_mib for a in members) + reserve + \
        (max(a.memory_mib for a in members) if card.switch_room else 0.0)
    return Server(tuple(packed), cards, first, used, arithmetic)


def burst_stretch(model: _Alone, members: list[_Alone]) -> float:
    """`model`'s compute stretch when every other member runs all its instances at once (a burst of
    theirs): 1 + s x their instances. What bounds one member's burst is its instance count, not
    Triton's rate limiter: measured (benchmarks/shared_server_bench.py), the rate limiter's one
    execution at a time made the others' P99 worse under a burst, not better (no preemption: a
    small batch waits out the bursting model's whole batch)."""
    others = sum(a.result.instances_per_gpu for a in members if a.name != model.name)
    return 1 + model.inputs.shared_gpu_slowdown * others


def _explain(result: Pack) -> list[str]:
    card = result.card
    lines = [
        f"{result.gpus} {card.name}(s) packed vs {result.gpus_one_per_card} with one model per card "
        f"({result.gpus / result.gpus_one_per_card:.0%}); the models' fractional need is "
        f"{result.gpu_need:.2f} card(s) at their target QPS",
        "one model per card: each model's own plan (max of the headroom and failureTolerance rules: a spare "
        "card per model)",
        f"memory per card: each model's instances + runtime reserve {_n(result.runtime_reserve_mib)} MiB once "
        f"per card, + {card.margin:.0%} margin"
        + (", + the largest model's instances again (one in-place version switch at a time)"
           if card.switch_room else ""),
        "time per card: each model's compute x (1 + sharedGpuSlowdown x the other models' busy fractions at "
        f"their per-card rates, {LOAD_MARGIN:.0%} more load while packing); each server keeps its "
        "failureTolerance spare card(s) once",
    ]
    return lines
