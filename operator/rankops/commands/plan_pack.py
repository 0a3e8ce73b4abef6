"""`rankops plan -f a.yaml -f b.yaml ...` (or one file of several RankingModels): the models packed on
the fewest cards of one GPU kind (planner/pack.py), printed per server and card, GPUs packed vs one
model per card. Exit codes as `rankops plan`: 0 a pack, 1 no pack, 2 unusable input."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rankops.commands.output import print_report
from rankops.planner.inputs import PlanError, inputs_from_spec
from rankops.planner.pack import Card, ModelToPack, Pack, PackError, pack
from rankops.planner.profile import ProfileError


class PackInputError(ValueError):
    pass


def add_pack_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several models (packed on shared cards)")
    g.add_argument("--gpu-memory-mib", type=float, metavar="MIB",
                   help="memory of one card; default: the models' spec.planning.gpuMemoryMiB (they must agree)")
    g.add_argument("--runtime-reserve-mib", type=float, metavar="MIB",
                   help="CUDA context + tritonserver, paid once per card; default: the largest of the models' "
                        "planning.memory.runtimeReserveMiB")
    g.add_argument("--margin", type=float, default=None, metavar="FRACTION",
                   help="kept free on top of the sum (default 0.1)")
    g.add_argument("--switch-room", action="store_true",
                   help="keep room on each card for one in-place version switch (the largest model's instances)")
    g.add_argument("--max-cards", type=int, metavar="N", help="refuse a pack that needs more cards")
    g.add_argument("--burst-proof", action="store_true",
                   help="each model's P99 must also hold while the others burst (all their instances busy)")
    g.add_argument("--one-server", action="store_true",
                   help="the models are members of one shared server, arriving in the order given: print which "
                        "are admitted and why each other waits (exit 1 when one waits or is refused)")


def shared_server(docs_by_file: list[tuple[Path, list[Any]]]) -> tuple[str, Any] | None:
    """(name, SharedServerSpec) of the one SharedServer among the files, if any: its members are
    then admitted as the operator admits them, on its cards."""
    from pydantic import ValidationError

    from rankops.api.errors import describe
    from rankops.api.sharedserver import SharedServer

    found = [(path, d) for path, docs in docs_by_file for d in docs if isinstance(d, dict) and d.get("kind") == "SharedServer"]
    if not found:
        return None
    if len(found) > 1:
        raise PackInputError(f"{len(found)} SharedServers in the files: plan one server's members at a time")
    path, doc = found[0]
    try:
        server = SharedServer.model_validate(doc)
    except ValidationError as exc:
        raise PackInputError(f"{path}: SharedServer: {'; '.join(describe(exc))}") from None
    return server.name, server.spec


def several_models(docs_by_file: list[tuple[Path, list[Any]]]) -> list[tuple[str, Path, dict]]:
    """(name, file, document) of each model: a file's RankingModels, or its first document (a sketch).
    With a SharedServer among the files: the RankingModels naming it (spec.server)."""
    out = []
    server = next((d["metadata"].get("name") for _, docs in docs_by_file for d in docs if isinstance(d, dict)
                   and d.get("kind") == "SharedServer" and isinstance(d.get("metadata"), dict)), None)
    for path, docs in docs_by_file:
        models = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RankingModel"
                  and (server is None or (d.get("spec") or {}).get("server") == server)]
        if not models and server is None and docs and isinstance(docs[0], dict):
            models = [docs[0]]
        for i, doc in enumerate(models):
            name = (doc.get("metadata") or {}).get("name") or (path.stem if len(models) == 1 else f"{path.stem}-{i + 1}")
            out.append((str(name), path, doc))
    return out


def run_pack(args: argparse.Namespace, docs_by_file: list[tuple[Path, list[Any]]], load_spec) -> int:
    """`load_spec(docs, path, profiles)` -> (spec, note): the one-model command's reader."""
    try:
        if args.profile or args.slowdown is not None or args.from_status:
            raise PackInputError("--profile, --slowdown and --from-status are for one model; give each model "
                                 "its spec.planning.latencyProfile to pack several")
        server = shared_server(docs_by_file)
        models, gpu_mib, not_shareable = [], set(), []
        for name, path, doc in several_models(docs_by_file):
            spec, note = load_spec([doc], path, [])
            if note:
                print(f"note: {name}: {note}", file=sys.stderr)
            if server is not None:      # who may join, as the operator says (render.shared_server)
                from rankops.render.shared_server import ServerMember, member_problems
                problems = member_problems(server[1], ServerMember(name, spec, spec.version))
                if problems:
                    not_shareable.append((name, "; ".join(problems)))
                    continue
            inputs = inputs_from_spec(spec, gpu_memory_mib=server[1].gpu_memory_mib if server else None)
            if inputs.gpu_memory_mib is not None:
                gpu_mib.add(inputs.gpu_memory_mib)
            models.append(ModelToPack(name, inputs))
        if server is not None and not models and not not_shareable:
            raise PackInputError(f"no RankingModel in the files names SharedServer {server[0]} (spec.server)")
        card = _server_card(args, server[1]) if server else _card(args, gpu_mib)
    except (PackInputError, ProfileError, PlanError) as exc:
        print(f"rankops plan: {exc}", file=sys.stderr)
        return 2
    if args.one_server or server is not None:
        return _run_one_server(args, models, card, server[0] if server else None, tuple(not_shareable))
    try:
        result = pack(models, card)
    except PackError as exc:
        print(f"rankops plan: no pack: {exc}", file=sys.stderr)
        return 1
    from rankops.planner.plot import write_pack_plot
    return 0 if print_report(args, result, lambda: render_pack(result), write_pack_plot) else 2


def _card(args: argparse.Namespace, gpu_mib: set[float]) -> Card:
    memory = args.gpu_memory_mib
    if memory is None:
        if len(gpu_mib) != 1:
            raise PackInputError("the models' spec.planning.gpuMemoryMiB " +
                                 (f"differ ({', '.join(f'{m:g}' for m in sorted(gpu_mib))})" if gpu_mib else "are not set")
                                 + ": one pack is one kind of card; give --gpu-memory-mib")
        memory = gpu_mib.pop()
    if memory <= 0 or (args.margin is not None and not 0 <= args.margin < 1) or \
            (args.max_cards is not None and args.max_cards < 1):
        raise PackInputError("--gpu-memory-mib must be > 0, --margin 0..1, --max-cards >= 1")
    extra = {"margin": args.margin} if args.margin is not None else {}
    return Card(memory, args.runtime_reserve_mib, switch_room=args.switch_room, max_cards=args.max_cards,
                burst_proof=args.burst_proof, **extra)


def _server_card(args: argparse.Namespace, spec: Any) -> Card:
    """The server's own card (serverplan admits on it); a flag given overrides its field."""
    from rankops.planner.shared_server import server_card

    card = server_card(spec)
    if args.gpu_memory_mib is not None or args.max_cards is not None or args.margin is not None \
            or args.runtime_reserve_mib is not None or args.switch_room or args.burst_proof:
        given = _card(args, {card.memory_mib})
        card = Card(given.memory_mib, given.runtime_reserve_mib, margin=given.margin, switch_room=given.switch_room,
                    max_cards=args.max_cards if args.max_cards is not None else card.max_cards,
                    burst_proof=args.burst_proof or card.burst_proof)
    return card


def _run_one_server(args: argparse.Namespace, models: list[ModelToPack], card: Card, server: str | None = None,
                    not_shareable: tuple[tuple[str, str], ...] = ()) -> int:
    from rankops.planner.shared_server import admit

    if args.plot:
        print("rankops plan: --plot draws a pack; --one-server prints the admission only", file=sys.stderr)
        return 2
    try:
        admission = admit(models, card)
    except PackError as exc:
        print(f"rankops plan: {exc}", file=sys.stderr)
        return 2
    if not_shareable:
        import dataclasses
        admission = dataclasses.replace(admission, refused=(*not_shareable, *admission.refused))
    print_report(args, admission, lambda: render_admission(admission, server), lambda *_: None)
    return 0 if not admission.waiting and not admission.refused and not admission.over else 1


def render_admission(admission, server: str | None = None) -> str:
    title = f"SharedServer {server}" if server else "One shared server"
    lines = [f"{title}: {len(admission.admitted)} member(s) admitted on {admission.cards} card(s)"
             + (f": {', '.join(admission.admitted)}" if admission.admitted else "")]
    if admission.server:
        alone = sum(m.gpus_alone for m in admission.server.models)
        lines.append(f"  GPUs: {admission.cards} shared vs {alone} with each admitted member on its own pods")
        lines += [f"  memory per card: {admission.server.memory_arithmetic}",
                  f"  {'model':<16} {'req/s/card':>10} {'P99 shared':>10} {'P99 burst':>9} {'budget':>7}"]
        lines += [f"  {m.name:<16} {m.per_card_qps:10.0f} {m.p99_shared_ms:10.2f} {m.p99_burst_ms:9.2f} "
                  f"{m.p99_budget_ms:7g}" for m in admission.server.models]
    lines += [f"waits: {name}: {why}" for name, why in admission.waiting]
    lines += [f"refused: {name}: {why}" for name, why in admission.refused]
    lines += [f"over: {name}: {why}" for name, why in admission.over]
    return "\n".join(lines)


def render_pack(result: Pack) -> str:
    lines = [f"Pack: {result.gpus} card(s) of {result.card.memory_mib:g} MiB, {len(result.servers)} shared "
             f"server(s); {result.gpus_one_per_card} with one model per card"]
    for i, server in enumerate(result.servers, 1):
        cards = server.card_numbers
        lines += ["", f"Server {i}: card(s) {cards.start}..{cards.stop - 1} ({server.cards} replica(s) of one "
                      "tritonserver, every card the same models)",
                  f"  memory per card: {server.memory_arithmetic}",
                  f"  {'model':<16} {'req/s/card':>10} {'busy':>5} {'compute x':>9} {'P99 alone':>9} "
                  f"{'P99 shared':>10} {'P99 burst':>9} {'budget':>7} {'alone GPUs':>10}"]
        for m in server.models:
            lines.append(f"  {m.name:<16} {m.per_card_qps:10.0f} {m.busy_fraction:5.0%} {m.compute_stretch:9.2f} "
                         f"{m.p99_alone_ms:9.2f} {m.p99_shared_ms:10.2f} {m.p99_burst_ms:9.2f} {m.p99_budget_ms:7g} "
                         f"{m.gpus_alone:10d}")
        lines += [f"    {m.name}: {m.config}" for m in server.models]
    lines += ["", f"GPUs: {result.gpus} packed vs {result.gpus_one_per_card} one model per card", "", "Why:"]
    lines += [f"  - {line}" for line in result.explanation]
    return "\n".join(lines)
