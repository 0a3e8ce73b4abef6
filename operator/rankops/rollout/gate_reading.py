"""What a gate Job shows, from the Job and its pods as the shell read them (pure): finished or
not, succeeded or failed and why, and the verdict its gate container wrote as its termination
message (gates/verdict.py)."""
from __future__ import annotations

from typing import Any

from rankops.render import names
from rankops.rollout.record import RETRY_ANNOTATION, GateObservation


def finished(job: dict[str, Any] | None) -> bool:
    """The Job says Complete or Failed."""
    return any(c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
               for c in ((job or {}).get("status") or {}).get("conditions") or [])


def observation(job: dict[str, Any] | None, pods: list[dict[str, Any]] = ()) -> GateObservation:
    """`pods`: the Job's own pods (read once it finished), the newest's termination message read."""
    from rankops.gates.verdict import parse_verdict

    if job is None:
        return GateObservation()
    conds = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    failed, complete = conds.get("Failed"), conds.get("Complete")
    if not failed and not complete:
        return GateObservation(job_exists=True)
    gate = job["metadata"]["labels"].get(names.LABEL_GATE, "unknown")
    message = _termination_message(pods)
    verdict = parse_verdict(message, gate=gate).to_dict() if message else None
    return GateObservation(job_exists=True, finished=True, succeeded=bool(complete),
                           failure_reason=(failed or {}).get("reason"), verdict=verdict)


def _termination_message(pods: list[dict[str, Any]]) -> str | None:
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if cs.get("name") == "gate" and terminated and terminated.get("message"):
                return terminated["message"]
    return None


def foreign(job_name: str, gate: str, version: str, attempt: str) -> GateObservation:
    """A Job under the gate's name that is not this attempt's: its result is not read."""
    return GateObservation(
        job_exists=True, finished=True, failure_reason="ForeignJob",
        detail=f"Job {job_name} is not the {gate} gate of version {version} attempt {attempt} of this "
               f"RankingModel (its labels or owner say otherwise): its result was not read; delete "
               f"that Job, then retry the version (annotation {RETRY_ANNOTATION})")
