"""The plan a status records: the digest of its inputs, and the shape it gives back unplanned.

Planning (`batching: auto`, or an explicit shape evaluated against the SLO) costs a tenth of a
second or more of CPU per model. `status.plan.inputsDigest` is the sha256 of everything
resolve_shape() reads to plan: the planner's inputs (SLO, profile, planning knobs, the replicas
and instances the spec sets), the tensors and candidates the shape is checked against, and the
planner's own code. A reconcile whose inputs match the recorded digest takes the shape from
status.plan instead of planning again, also in a restarted operator. status is written by the
operator alone (the chart's status admission policy), and the recorded shape still passes the
same bounds a fresh plan does.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from rankops.api.planning import PlanStatus
from rankops.api.rankingmodel import Batching, RankingModelSpec
from rankops.render.desired import ResolvedShape, unbatched_problems
from rankops.render.tritonconfig import ServingShape


@functools.cache
def _planner_code() -> str:
    """Digest of the planner's source: a changed planner plans every model again."""
    import rankops.planner

    root = Path(rankops.planner.__file__).parent
    sources = sorted(root.glob("*.py")) + [Path(__file__), root.parent / "render" / "desired.py"]
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()


def inputs_digest(spec: RankingModelSpec, profile: dict[int, float] | None = None) -> str | None:
    """sha256 of what resolve_shape(spec, profile) plans or evaluates from; None when it plans
    nothing (explicit batching without an SLO and a profile) or cannot plan (it says why)."""
    from rankops import planner  # numpy: only where a plan is made anyway

    has_profile = profile or (spec.planning and spec.planning.latency_profile)
    if isinstance(spec.batching, Batching) and (spec.slo is None or not has_profile):
        return None
    try:
        inputs = planner.inputs_from_spec(spec, profile=profile)
    except planner.PlanError:
        return None
    checked = [t.model_dump(mode="json", by_alias=True) for t in (*spec.inputs, *spec.outputs)]
    candidates = spec.candidates.model_dump(mode="json", by_alias=True) if spec.candidates else None
    # slo.overload and slo.queuePolicy are no planner input, but the queue policy recorded beside the
    # plan (status.plan.queuePolicy) is derived from them: a change derives it again.
    overload = spec.slo.model_dump(mode="json", by_alias=True, include={"overload", "queue_policy"}) \
        if spec.slo else None
    # PlanInputs is a frozen dataclass of numbers, tuples and dataclasses: its repr is its value.
    return hashlib.sha256(repr((_planner_code(), inputs, checked, candidates, overload)).encode()).hexdigest()


def plan_status(resolved: ResolvedShape, digest: str | None = None) -> PlanStatus | None:
    """status.plan of a resolved shape (None: nothing was planned), with the digest of its inputs."""
    if resolved.plan is None:
        return None
    return PlanStatus.model_validate({**resolved.plan.to_status(), **({"inputsDigest": digest} if digest else {})})


def from_status(spec: RankingModelSpec, plan: PlanStatus | None, digest: str | None) -> ResolvedShape | None:
    """The shape status.plan records when it was planned from these inputs (`digest`), or None:
    plan again (no record, other inputs, a record that fails the bounds)."""
    if plan is None or not digest or plan.inputs_digest != digest:
        return None
    from rankops.planner.overload import QueuePolicy

    policy = QueuePolicy.from_status(plan.queue_policy)
    wanted = spec.slo is not None and (spec.slo.overload.value == "shed" or spec.slo.queue_policy is not None)
    if wanted != (policy is not None):   # recorded by an operator that did not derive it: derive it now
        return None
    if isinstance(spec.batching, Batching):
        if plan.mode != "explicit":
            return None
        shape, replicas = ServingShape.explicit(spec.batching, spec.instances_per_gpu, policy), spec.replicas
    else:
        if plan.mode != "auto" or spec.tensor_size_problems(plan.max_batch_size) or plan.replicas < 1 \
                or plan.instances_per_gpu < 1 or plan.max_batch_size < 1:
            return None
        shape = ServingShape(plan.max_batch_size, tuple(plan.preferred_batch_sizes),
                             plan.max_queue_delay_microseconds, plan.instances_per_gpu, policy)
        replicas = plan.replicas
    return ResolvedShape(shape, replicas, None, tuple(plan.problems), tuple(unbatched_problems(spec, shape)))
