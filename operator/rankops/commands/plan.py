"""`rankops plan -f rankingmodel.yaml [--profile CSV[:BATCH]] [--slowdown K | --from-status FILE]
[--plot PNG] [-o text|json|yaml]`; with several models (-f a.yaml -f b.yaml, or one file of several
RankingModels) the pack of commands/plan_pack.py.

--slowdown K plans with the profile's compute times x K; --from-status takes K = 1 / factor from a
RankingModel's status.autoscaling.capacityCorrection (the correction the autoscaler applies: what
the serving replicas showed against the plan, smoothed and bounded), and prints the corrected
capacity and replicas beside the uncorrected ones.

Exit codes: 0 a plan without problems; 1 no plan, or a plan/explicit config with problems (SLO
miss, capacity shortfall, OOM); 2 unusable input.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from pydantic import ValidationError

from rankops.commands.output import add_output_flag, print_report
from rankops.commands.plan_pack import add_pack_flags, run_pack, several_models
from rankops.planner.inputs import PlanError, inputs_from_spec, slowed
from rankops.planner.overload import OverloadError, with_queue_policy
from rankops.planner.profile import ProfileError, load_profiles
from rankops.planner.result import PlanResult
from rankops.planner.search import evaluate, plan
from rankops.planner.two_versions import SideBySide
from rankops.rollout.inplace_phase import versions_side_by_side


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="derive batching, instances and GPUs from a latency profile and the SLO",
        description="Plan Triton dynamic batching, instances per GPU and the GPU count for a "
                    "RankingModel from its latency profile, P99 budget and target QPS.")
    p.add_argument("-f", "--file", action="append", default=[],
                   help="RankingModel YAML (spec.slo, spec.planning, spec.batching); default: the --from-status "
                        "file; repeatable, or one file of several RankingModels: the models packed on shared "
                        "cards (GPUs packed vs one model per card)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE[:BATCH]",
                   help="latency profile: YAML/JSON {batch: ms}, Model Analyzer metrics-model-inference.csv, "
                        "or perf_analyzer -f CSV with the -b it ran with (perf.csv:8); repeatable; "
                        "overrides spec.planning.latencyProfile")
    corrected = p.add_mutually_exclusive_group()
    corrected.add_argument("--slowdown", type=float, metavar="K",
                           help="plan with the profile's compute times x K (K > 1: the replicas are slower "
                                "than profiled)")
    corrected.add_argument("--from-status", metavar="FILE",
                           help="a RankingModel (YAML/JSON, e.g. kubectl get -o yaml, a pipe too) whose "
                                "status.autoscaling.capacityCorrection.factor gives K = 1 / factor")
    p.add_argument("--plot", metavar="PNG", help="write latency vs offered load for the top configs (several "
                                                 "models: memory per card and P99 alone vs shared)")
    add_pack_flags(p)
    add_output_flag(p, ("text", "json", "yaml"), "text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        docs_by_file = [(Path(f), read_documents(Path(f), "-f")) for f in args.file]
    except InputError as exc:
        print(f"rankops plan: {exc}", file=sys.stderr)
        return 2
    if len(several_models(docs_by_file)) > 1:
        return run_pack(args, docs_by_file, _load_spec)
    try:
        slowdown = getattr(args, "slowdown", None)
        from_status = getattr(args, "from_status", None)
        notes: list[str] = []
        status_docs = read_documents(Path(from_status), "--from-status") if from_status else None
        if status_docs is not None:
            slowdown, notes = recorded_slowdown(status_docs, Path(from_status))
        if slowdown is not None and not 0.1 <= slowdown <= 10:
            raise InputError(f"slowdown {slowdown:g}: expected 0.1..10 (compute time observed / profiled)")
        if not (args.file or from_status):
            raise InputError("-f FILE is required (or --from-status FILE)")
        spec, note = _load_spec(docs_by_file[0][1] if docs_by_file else status_docs,
                                docs_by_file[0][0] if docs_by_file else Path(from_status), args.profile)
        inputs = inputs_from_spec(spec)
    except (InputError, ProfileError, PlanError) as exc:
        print(f"rankops plan: {exc}", file=sys.stderr)
        return 2
    for line in ([note] if note else []) + notes:
        print(f"note: {line}", file=sys.stderr)
    before = None
    try:
        if slowdown is not None:
            before = plan(inputs) if inputs.auto else evaluate(inputs)
            inputs = slowed(inputs, slowdown)
        result = plan(inputs) if inputs.auto else evaluate(inputs)
    except PlanError as exc:
        print(f"rankops plan: no plan: {exc}", file=sys.stderr)
        return 1
    if before is not None:
        line = correction_line(before, result, slowdown)
        result = dataclasses.replace(result, explanation=[line, *result.explanation])
    try:
        result = with_queue_policy(spec, result)
    except OverloadError as exc:   # the operator refuses such a spec (PlanFailed): say it the same way
        print(f"rankops plan: no plan: {exc}", file=sys.stderr)
        return 1
    from rankops.planner.plot import write_plot
    text = lambda: render_text(result) + render_in_place(spec, result, beside_serving(spec, result))  # noqa: E731
    if not print_report(args, result, text, write_plot):
        return 2
    return 1 if result.problems else 0



class InputError(ValueError):
    pass


def read_documents(path: Path, flag: str) -> list[Any]:
    """The YAML or JSON documents in `path` (a pipe such as <(kubectl get rm x -o yaml) too), read
    once; a List's items are documents of their own."""
    if not path.exists():
        raise InputError(f"{flag} {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
        docs = [json.loads(text)] if text.lstrip().startswith("{") else [d for d in yaml.safe_load_all(text) if d]
    except (ValueError, yaml.YAMLError, OSError) as exc:
        raise InputError(f"{flag} {path}: not YAML or JSON: {exc}") from None
    return [item for doc in docs
            for item in (doc["items"] if isinstance(doc, dict) and isinstance(doc.get("items"), list) else [doc])]


def recorded_slowdown(docs: list[Any], path: Path) -> tuple[float, list[str]]:
    """(K, notes) from status.autoscaling.capacityCorrection: K = 1 / factor, the correction the
    autoscaler applies (smoothed and bounded), not the last reading's raw slowdown; the notes say
    what the plan should not be read as (measured only, a raise still pending)."""
    for item in docs:
        status = item.get("status") if isinstance(item, dict) else None
        corr = ((status or {}).get("autoscaling") or {}).get("capacityCorrection") or {}
        factor = corr.get("factor")
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0 or not corr.get("readings"):
            continue
        notes = []
        if corr.get("applied") is False:
            notes.append("the correction is measured only (the spec sets autoscaling.capacityPerReplicaQps): "
                         "the autoscaler does not scale against it")
        if corr.get("raiseStreak"):
            notes.append(f"{corr['raiseStreak']} reading(s) in a row say raise: the factor rises at 3; "
                         "this plan uses the factor applied now")
        return 1.0 / float(factor), notes
    raise InputError(f"--from-status {path}: no status.autoscaling.capacityCorrection with readings (the "
                     "operator records it once a reading had enough evidence)")


def correction_line(before: PlanResult, after: PlanResult, slowdown: float) -> str:
    per_replica = before.inputs.gpus_per_replica
    return (f"corrected for a slowdown of {slowdown:g} (compute x {slowdown:g}): capacity "
            f"{after.qps_per_gpu * per_replica:.0f} req/s per replica (uncorrected {before.qps_per_gpu * per_replica:.0f}, "
            f"x {after.qps_per_gpu / before.qps_per_gpu if before.qps_per_gpu else 0:.2f}), replicas {after.replicas} "
            f"(uncorrected {before.replicas})")


def _load_spec(docs: list[Any], path: Path, profiles: list[str]) -> tuple[Any, str | None]:
    """The RankingModel spec of `docs` (read from `path`), validated by the API model; a file that
    is not a complete RankingModel (a planning sketch) is read for slo / planning / batching alone."""
    doc = next((d for d in docs if isinstance(d, dict) and d.get("kind") == "RankingModel"), None)
    if doc is None:
        doc = docs[0] if docs and isinstance(docs[0], dict) else None
    if doc is None or not isinstance(doc.get("spec"), dict):
        raise InputError(f"-f {path}: expected a RankingModel with a spec")
    raw = dict(doc["spec"])
    if profiles:
        planning = dict(raw.get("planning") or {})
        planning.pop("latencyProfileConfigMap", None)
        planning["latencyProfile"] = {str(b): ms for b, ms in load_profiles(profiles).points}
        raw["planning"] = planning
    raw.setdefault("batching", "auto")
    try:
        from rankops.api.rankingmodel import RankingModel
    except ImportError:
        RankingModel = None  # noqa: N806 - the lead's model not in this build
    full_error = None
    if RankingModel is not None:
        try:
            return RankingModel.model_validate({**doc, "spec": raw}).spec, None
        except ValidationError as exc:
            full_error = _first_error(exc, "")
    return _planning_view(raw), (f"not a complete RankingModel ({full_error}); planned from spec.slo, "
                                 "spec.planning and spec.batching alone" if full_error else None)


def _planning_view(raw: dict) -> SimpleNamespace:
    from rankops.api.planning import Planning, Slo
    parsed = {}
    for key, model in (("slo", Slo), ("planning", Planning)):
        try:
            parsed[key] = model.model_validate(raw[key]) if raw.get(key) is not None else None
        except ValidationError as exc:
            raise InputError(_first_error(exc, f"spec.{key}")) from None
    slo, planning = parsed["slo"], parsed["planning"]
    candidates = None
    if raw.get("candidates") is not None:
        from rankops.api.rankingmodel import Candidates
        try:
            candidates = Candidates.model_validate(raw["candidates"])
        except ValidationError as exc:
            raise InputError(_first_error(exc, "spec.candidates")) from None
    batching = raw.get("batching", "auto")
    if batching != "auto":
        if not isinstance(batching, dict) or "maxBatchSize" not in batching:
            raise InputError("spec.batching must be `auto` or {maxBatchSize, preferredBatchSizes, "
                             "maxQueueDelayMicroseconds}")
        batching = SimpleNamespace(
            max_batch_size=_int(batching, "maxBatchSize", 1),
            preferred_batch_sizes=[int(b) for b in batching.get("preferredBatchSizes") or []],
            max_queue_delay_microseconds=_int(batching, "maxQueueDelayMicroseconds", 0, default=1000),
        )
    return SimpleNamespace(
        slo=slo, planning=planning, batching=batching, candidates=candidates,
        gpus_per_replica=_int(raw, "gpusPerReplica", 1, default=1),
        instances_per_gpu=_int(raw, "instancesPerGpu", 1, default=None),
        replicas=_int(raw, "replicas", 0, default=None),
    )


def _int(raw: dict, key: str, minimum: int, default: Any = ...) -> Any:
    if key not in raw or raw[key] is None:
        if default is ...:
            raise InputError(f"spec.{key} is required")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"spec.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _first_error(exc: ValidationError, prefix: str) -> str:
    errors = exc.errors()
    lines = []
    for err in errors[:3]:
        # drop union-member tags (model class names) pydantic puts in the location
        loc = ".".join(str(p) for p in err.get("loc", ()) if not (isinstance(p, str) and p[:1].isupper()))
        lines.append(f"{prefix + '.' if prefix and loc else prefix}{loc}: {err.get('msg')}")
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(lines) + more


def beside_serving(spec: Any, result: PlanResult) -> list[tuple[str, SideBySide]]:
    """Each other version of spec.versions loaded beside spec.version on one GPU, with this plan's
    batch and instances (issue 41's arithmetic, as the rollout machine decides on it); empty for a
    planning sketch without versions."""
    versions = list(getattr(spec, "versions", None) or [])
    serving = getattr(spec, "version", None)
    if serving not in [v.name for v in versions] or len(versions) < 2:
        return []
    return [(v.name, versions_side_by_side(spec, result, serving, v.name)) for v in versions if v.name != serving]


def render_in_place(spec: Any, result: PlanResult, pairs: list[tuple[str, SideBySide]]) -> str:
    if not pairs:
        return ""
    lines = ["", "", f"Two versions on one GPU (a version loaded beside {spec.version} in its running pods):"]
    if result.inputs.memory is not None:
        lines.append("  (spec.planning.memory is one figure per instance for every version)")
    for name, pair in pairs:
        verdict = "can load in place" if pair.in_place else \
            "cannot load in place" if pair.problems else "memory not known"
        lines.append(f"  {name}: {verdict}")
        lines.append(f"    {pair.arithmetic}")
        lines += [f"    ! {p}" for p in pair.problems if not p.startswith("GPU memory: ")]
    return "\n".join(lines)


def render_text(result: PlanResult) -> str:
    head = "Recommended config" if result.mode == "auto" else "Explicit config (evaluated)"
    pref = ", ".join(map(str, result.preferred_batch_sizes)) or "none"
    lines = [
        f"{head}:",
        f"  max_batch_size               {result.max_batch_size}",
        f"  preferred_batch_size         {pref}",
        f"  max_queue_delay_microseconds {result.max_queue_delay_microseconds}",
        f"  instance_group count         {result.instances_per_gpu} (KIND_GPU)",
        f"  replicas x GPUs              {result.replicas} x {result.inputs.gpus_per_replica} = {result.gpus} GPU(s)",
        f"  sustainable per GPU          {result.qps_per_gpu:.0f} req/s within the P99 budget",
        f"  at target load               P50 {result.predicted_p50_ms:.2f} ms, P99 {result.predicted_p99_ms:.2f} ms, "
        f"avg batch {result.avg_batch_size:.1f}",
    ]
    if result.memory_mib is not None:
        lines.append(f"  GPU memory                   {result.memory_mib:.0f} MiB")
    lines += ["", "Predicted latency vs load (one GPU):",
              f"  {'req/s':>8}  {'P50 ms':>7}  {'P99 ms':>7}  {'avg batch':>9}  {'GPU busy':>8}"]
    for p in result.table:
        lines.append(f"  {p.per_gpu_qps:8.0f}  {p.p50_ms:7.2f}  {p.p99_ms:7.2f}  {p.avg_batch_size:9.1f}  "
                     f"{p.gpu_busy_fraction:8.0%}")
    lines += ["", "Why:"] + [f"  - {line}" for line in result.explanation]
    policy = result.queue_policy
    if policy is not None:
        lines += ["", f"Queue policy (slo.overload {'shed' if policy.shed else 'queue'}):",
                  f"  timeout_action               {policy.timeout_action}",
                  f"  default_timeout_microseconds {policy.timeout_us}",
                  f"  max_queue_size               {policy.max_queue_size}",
                  f"  allow_timeout_override       {str(policy.allow_timeout_override).lower()}"]
        lines += [f"  - {line}" for line in policy.explanation]
    warnings = list(result.warnings) + list(policy.warnings if policy is not None else ())
    if warnings:
        lines += ["", "Warnings:"] + [f"  ~ {w}" for w in warnings]
    if result.problems:
        lines += ["", "Problems:"] + [f"  ! {p}" for p in result.problems]
    return "\n".join(lines)
