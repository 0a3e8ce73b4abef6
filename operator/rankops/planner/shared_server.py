"""Which models a named shared server holds (issue 42): admission, in arrival order, never evicting.

`planner/pack.py` chooses the servers for a set of models. A server that users name
(several RankingModels pointing at one tritonserver) is packed the other way round: its members
arrive one at a time, and each is admitted when the server still holds with it, on the pack's two
checks: every card's memory (each member's instances + the runtime reserve once + the margin, +
room for one in-place switch when asked) and every member's P99 beside the others' load
(pack._fails: the device's time shared across the members' batches, each model at its per-card
rate under both of its headroom and failureTolerance rules). The server grows by whole cards, up to
`card.max_cards`; a member that would need more waits, with the arithmetic, and names itself.

Never evicting: members already admitted are placed first (in arrival order), then the rest in
arrival order. A newcomer cannot push out a member that serves; one removed frees room for the
first waiting member that fits, not for a reshuffle. An admitted member whose own needs grew past
what is left (its spec changed) is reported with its arithmetic in `over`; it keeps its place, and
the caller keeps what serves (its change waits), as with any bad edit. While an admitted member
cannot be counted (over, or refused), no newcomer is admitted: its room is still taken on the cards.

A member the planner cannot read (no spec.planning.memory, no SLO, no plan alone) is `refused`,
with the reason: it is its spec's problem, and it never blocks the others.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from rankops.planner.pack import (Card, ModelToPack, PackError, Server, _Alone, _fails_confirmed, _memory,
                                  _plan_alone, _server, server_json)


@dataclass(frozen=True)
class Admission:
    admitted: tuple[str, ...]               # in placement order: members already admitted first
    cards: int                              # cards (replicas of one card each) the admitted members need
    waiting: tuple[tuple[str, str], ...]    # (member, why it waits: the arithmetic that does not hold)
    refused: tuple[tuple[str, str], ...]    # (member, why the planner cannot place it at all)
    over: tuple[tuple[str, str], ...]       # (admitted member, why its current needs no longer fit)
    server: Server | None                   # the admitted members as pack reports a server

    def to_json(self) -> dict:
        return {"admitted": list(self.admitted), "cards": self.cards,
                "waiting": [{"name": n, "why": w} for n, w in self.waiting],
                "refused": [{"name": n, "why": w} for n, w in self.refused],
                "over": [{"name": n, "why": w} for n, w in self.over],
                "server": server_json(self.server) if self.server else None}

    def why(self, member: str) -> str | None:
        """Why `member` is not (fully) served, or None when it is admitted and fits."""
        return dict(self.waiting + self.refused + self.over).get(member)


def server_card(spec) -> Card:
    """The card a SharedServer admits its members on (`spec`: api.sharedserver.SharedServerSpec): its
    memory, its replicas as the most cards, and its burst rule. The operator and `rankops plan` both."""
    return Card(memory_mib=spec.gpu_memory_mib, max_cards=spec.max_replicas, burst_proof=spec.burst_proof)


def admit(members: Sequence[ModelToPack], card: Card, already_admitted: Collection[str] = ()) -> Admission:
    """`members` in arrival order (creationTimestamp, then name); `already_admitted`: those the server
    holds now. Pure: the same members and the same `already_admitted` give the same Admission."""
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise PackError(f"member names must differ: {', '.join(sorted(names))}")
    placed: list[_Alone] = []
    cards = 0
    waiting, refused, over = [], [], []
    first = [m for m in members if m.name in already_admitted]
    rest = [m for m in members if m.name not in already_admitted]
    for member in first + rest:
        unplaced = [n for n, _ in over + refused if n in already_admitted]
        if member.name not in already_admitted and unplaced:
            # an admitted member this round could not count still holds its room on the cards:
            # a newcomer placed without it could overfill them
            waiting.append((member.name, f"{member.name} waits: {', '.join(unplaced)} already serve(s) here with "
                                         "needs this plan cannot count now (see their own reason)"))
            continue
        try:
            alone = _plan_alone(member, card)
        except PackError as exc:
            refused.append((member.name, str(exc)))
            continue
        joined, why = _placement(placed, cards, alone, card)
        if joined is not None:
            placed.append(alone)
            cards = joined
        elif member.name in already_admitted:
            over.append((member.name, why))
        else:
            waiting.append((member.name, why))
    server = _server(placed, cards, 1, card, _reserve(card, placed)) if placed else None
    return Admission(tuple(a.name for a in placed), cards, tuple(waiting), tuple(refused), tuple(over), server)


def _reserve(card: Card, group: Sequence[_Alone]) -> float:
    if card.runtime_reserve_mib is not None:
        return card.runtime_reserve_mib
    return max(a.inputs.memory.runtime_reserve_mib for a in group)


def _placement(placed: list[_Alone], cards: int, model: _Alone, card: Card) -> tuple[int | None, str]:
    """(cards the server needs with `model` added, "") or (None, why not), the server growing by whole
    cards up to card.max_cards (without a cap: up to what `model` would take on a server of its own)."""
    group = placed + [model]
    fits, arithmetic = _memory(card, _reserve(card, group), group)
    beside = f" beside {', '.join(a.name for a in placed)}" if placed else ""
    if not fits:
        return None, f"{model.name} does not fit on one {card.name}{beside}: {arithmetic}"
    most = card.max_cards if card.max_cards is not None else cards + model.result.gpus
    least = max(cards, model.result.gpus if not placed else 1)
    why = ""
    for n in range(least, most + 1):
        why = _fails_confirmed(group, n, card.burst_proof)
        if not why:
            return n, ""
    if least > most:
        return None, (f"{model.name} takes {model.result.gpus} {card.name}(s) by itself, over the server's "
                      f"{card.max_cards}")
    return None, f"{model.name} does not hold{beside} on {most} {card.name}(s): {why}"


LOAD_STEP = 1.05         # loads are rounded up to a power of this: readings that move a little reuse the simulations
IDLE_QPS = 0.05          # a member below this rate adds no time to the cards (its memory is on every card anyway)


def rounded_load(qps: float) -> float:
    """`qps` rounded up to the next power of LOAD_STEP (never below): the sizing errs toward a pod more."""
    if qps <= IDLE_QPS:
        return 0.0
    return LOAD_STEP ** math.ceil(math.log(qps) / math.log(LOAD_STEP) - 1e-9)


def cards_for_load(members: Sequence[ModelToPack], card: Card, loads: Mapping[str, float],
                   hint: int | None = None) -> tuple[int | None, str]:
    """(the fewest cards, at most card.max_cards, on which every member's P99 holds beside the others
    at `loads` (member -> req/s, all cards together, the caller's headroom in them), ""), or (None, why
    not even card.max_cards hold). The admission's own time rule (_fails: the device's time shared
    across the members' batches, each member's failureTolerance cards lost), with each member's target
    replaced by its load and its planning.headroom by the caller's (the load is sized with it): the
    members' memory fits on one card whatever the count, so only time decides. A member at no load
    adds no time; every member's failureTolerance holds at any load (at least that many cards + 1).
    `hint`: the cards running now; the search starts there (loads move slowly: two checks, most times)."""
    floor, group, most = _at_load(members, card, loads)
    if floor > most:
        return None, f"failureTolerance {floor - 1} needs {floor} {card.name}(s), over the {most} allowed"
    if not group:
        return floor, ""
    # More cards never hold less (each member's per-card rate only falls): gallop from the hint to a
    # count that holds, then bisect below it; log2(maxReplicas) checks at worst.
    fails = lambda n: _fails_confirmed(group, n, card.burst_proof)  # noqa: E731
    start = min(max(hint or floor, floor), most)
    if fails(start):
        low, step, high = start + 1, 1, None
        while high is None:
            n = min(start + step, most)
            why = fails(n)
            if not why:
                high = n
            elif n == most:
                return None, f"not even {most} {card.name}(s) hold: {why}"
            else:
                low, step = n + 1, step * 2
    else:
        low, high = floor, start
    while low < high:
        middle = (low + high) // 2
        if fails(middle):
            low = middle + 1
        else:
            high = middle
    return high, ""


def holds_on(members: Sequence[ModelToPack], card: Card, loads: Mapping[str, float], cards: int) -> bool:
    """Whether every member's P99 holds on `cards` cards at `loads` (cards_for_load's rule, one check)."""
    floor, group, most = _at_load(members, card, loads)
    return floor <= cards and (not group or not _fails_confirmed(group, cards, card.burst_proof))


def _at_load(members: Sequence[ModelToPack], card: Card, loads: Mapping[str, float]) -> tuple[int, list[_Alone], int]:
    """(the fewest cards every member's failureTolerance allows, the members under load as the rule
    sees them, the most cards)."""
    floor = 1 + max((m.inputs.failure_tolerance for m in members), default=0)
    group = []
    for m in members:
        load = rounded_load(loads.get(m.name, 0.0))
        if load:
            alone = _plan_alone(m, card)
            group.append(dataclasses.replace(alone, inputs=dataclasses.replace(alone.inputs, target_qps=load,
                                                                               headroom=0.0)))
    most = card.max_cards if card.max_cards is not None else max(floor, sum(a.result.gpus for a in group))
    return floor, group, most


def switch_fits(admission: Admission | None, card: Card, member: str) -> tuple[bool | None, str]:
    """(fits, the arithmetic) of `member`'s next version loaded beside every admitted member on each
    of the server's cards: its instances once more, on the card's memory as the admission counts it
    (each member's instances + the runtime reserve once), + the margin. None: the member is not
    counted in the server's pack now (its needs unknown), so nothing can be said."""
    server = admission.server if admission is not None else None
    packed = next((m for m in server.models if m.name == member), None) if server is not None else None
    if packed is None:
        return None, f"{member}'s memory is not counted in the server's pack now"
    used = server.memory_mib + packed.memory_mib
    with_margin = used * (1 + card.margin)
    fits = with_margin <= card.memory_mib
    verdict = (f"fits ({card.memory_mib - with_margin:.0f} MiB spare)" if fits
               else f"does not fit ({with_margin - card.memory_mib:.0f} MiB short)")
    return fits, (f"the card holds {server.memory_mib:.0f} MiB (every member's instances + runtime reserve) + "
                  f"{packed.memory_mib:.0f} MiB ({member}'s next version) = {used:.0f} MiB, + {card.margin:.0%} "
                  f"margin = {with_margin:.0f} MiB of {card.memory_mib:.0f} MiB: {verdict}")
