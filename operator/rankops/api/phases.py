"""The words a RankingModel's status is made of: the rollout's phases, the model's phase, and the
reasons its Degraded condition gives.

StrEnums: a member is its string (equal to it, hashed as it, formatted as it), so the status dicts
the code passes around and the comparisons with stored values keep working; the status models
(api.rankingmodel) type their fields with them, and so the CRD schema lists the values.
"""
from __future__ import annotations

from enum import StrEnum


class RolloutPhase(StrEnum):
    """status.rollout.phase (rollout/machine.py): the active phases in their order, then the ends."""
    IN_PLACE = "InPlace"               # rollout.strategy inPlace: status.rollout.inPlace says where the switch is
    CANARY_STARTING = "CanaryStarting"
    WARMING = "Warming"
    VERIFYING = "Verifying"
    CANARY = "Canary"
    PROMOTING = "Promoting"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    SUPERSEDED = "Superseded"
    CANCELED = "Canceled"


# The phases of a rollout in flight (a canary is up, the machine moves it on).
ACTIVE_PHASES = (RolloutPhase.IN_PLACE, RolloutPhase.CANARY_STARTING, RolloutPhase.WARMING, RolloutPhase.VERIFYING,
                 RolloutPhase.CANARY, RolloutPhase.PROMOTING)


class ModelPhase(StrEnum):
    """status.phase: the active rollout's phase while one is in flight, RolledBack while spec.version
    stays rolled back, Degraded while a generation cannot be applied, else Ready or Pending."""
    PENDING = "Pending"
    READY = "Ready"
    DEGRADED = "Degraded"
    IN_PLACE = RolloutPhase.IN_PLACE.value
    CANARY_STARTING = RolloutPhase.CANARY_STARTING.value
    WARMING = RolloutPhase.WARMING.value
    VERIFYING = RolloutPhase.VERIFYING.value
    CANARY = RolloutPhase.CANARY.value
    PROMOTING = RolloutPhase.PROMOTING.value
    ROLLED_BACK = RolloutPhase.ROLLED_BACK.value


class DegradedReason(StrEnum):
    """The Degraded condition's reasons, most serious first: the definition order is the precedence
    (DEGRADED_PRECEDENCE below). The first ones mean this generation is not applied (what
    served before serves on, Ready says SpecNotApplied); the others are found while it serves.
    AS_EXPECTED, last, is the reason while nothing is wrong (Degraded False), no problem."""
    # Not applied:
    INVALID_SPEC = "InvalidSpec"
    NOT_ALLOWED_ON_THIS_CLUSTER = "NotAllowedOnThisCluster"
    TENSORRT_VERSION_MISMATCH = "TensorRTVersionMismatch"
    CREDENTIALS_SECRET_NOT_FOUND = "CredentialsSecretNotFound"
    NODE_POOL_NOT_FOUND = "NodePoolNotFound"
    NODE_POOL_INVALID = "NodePoolInvalid"
    # A member of a SharedServer (spec.server) that the server does not hold:
    SHARED_SERVER_NOT_FOUND = "SharedServerNotFound"
    NOT_SHAREABLE = "NotShareable"          # it needs what the server's pods do not give
    CANNOT_PACK = "CannotPack"              # its needs cannot be counted (no memory figures, no SLO)
    SERVER_FULL = "ServerFull"              # it waits: it does not fit beside the members that serve
    PLAN_FAILED = "PlanFailed"
    RENDER_FAILED = "RenderFailed"
    CHILD_REFUSED = "ChildRefused"
    # Serving:
    ROLLED_BACK = "RolledBack"
    MEMBER_LOAD_FAILED = "MemberLoadFailed"  # a SharedServer's pod refused to load it (Triton's words)
    PODS_UNSCHEDULABLE = "PodsUnschedulable"
    CANARY_NOT_JUDGED = "CanaryNotJudged"
    NO_READY_NODES = "NoReadyNodes"
    DRIVER_TOO_OLD = "DriverTooOld"
    WARMUP_FAILING = "WarmupFailing"
    REQUESTS_NOT_BATCHED = "RequestsNotBatched"
    PLAN_PREDICTS_PROBLEM = "PlanPredictsProblem"
    # Nothing wrong:
    AS_EXPECTED = "AsExpected"


# Every problem reason, most serious first (the enum's order, AS_EXPECTED left out): one list, split
# after the last reason of the not-applied group.
DEGRADED_PRECEDENCE = tuple(r for r in DegradedReason if r is not DegradedReason.AS_EXPECTED)
_SPLIT = DEGRADED_PRECEDENCE.index(DegradedReason.CHILD_REFUSED) + 1
NOT_APPLIED_REASONS, SERVING_REASONS = DEGRADED_PRECEDENCE[:_SPLIT], DEGRADED_PRECEDENCE[_SPLIT:]
