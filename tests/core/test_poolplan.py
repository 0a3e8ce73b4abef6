"""A GpuNodePool's plan, pure (issue 39, item 3): what one reconcile applies, the status and the
Events, from the pool and the nodes the shell read; the Event-on-flip rule is the models' own."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from rankops import model_status, poolplan
from rankops.api.conditions import Condition, flipped
from rankops.api.rankingmodel import RankingModelStatus
from rankops.commands.render import render_documents
from rankops.nodelabels import ANNOTATION_REPORT, LABEL_POOL, LABEL_READY
from rankops.validator.report import requirements_digest

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
INTERVAL = 120


def pool_body(status: dict | None = None, **spec) -> dict:
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "GpuNodePool",
            "metadata": {"name": "t4", "uid": "u1", "generation": 2},
            "spec": {"nodeSelector": {"pool": "t4"}, "validator": {"intervalSeconds": INTERVAL}, **spec}}
    return {**body, "status": status} if status is not None else body


def node(name: str, ready: bool = True, age_s: float = 10) -> dict:
    digest = requirements_digest(poolplan.parse(pool_body()).pool.spec.requirements)
    report = {"ready": ready, "requirementsDigest": digest, "blocking": [] if ready else ["nouveau"], "checks": [],
              "generatedAt": (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return {"metadata": {"name": name, "labels": {"pool": "t4", LABEL_POOL: "t4", LABEL_READY: str(ready).lower()},
                         "annotations": {ANNOTATION_REPORT: json.dumps(report)}},
            "status": {"capacity": {"nvidia.com/gpu": "1"}}}


def planned(body: dict, nodes: list[dict], settings: poolplan.PoolSettings = poolplan.PoolSettings(),
            now: datetime = NOW) -> poolplan.PoolPlan:
    return poolplan.plan(body, poolplan.parse(body), nodes, [body], settings, now)


def again(body: dict, done: poolplan.PoolPlan) -> dict:
    """The body as the next reconcile reads it: the status this plan wrote."""
    return {**body, "status": done.status.to_wire()}


def events(done: poolplan.PoolPlan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in done.events]


def test_the_plan_applies_the_validator_as_the_operator_was_started():
    settings = poolplan.PoolSettings(namespace="gpu-ops", validator_service_account="checker",
                                     validator_image="registry.example/validator@sha256:" + "a" * 64,
                                     validator_priority_class="", pull_secrets=("regcred",))
    (daemonset,) = planned(pool_body(), [node("gpu-1")], settings).applies
    pod = daemonset["spec"]["template"]["spec"]
    assert (daemonset["kind"], daemonset["metadata"]["namespace"]) == ("DaemonSet", "gpu-ops")
    assert pod["serviceAccountName"] == "checker" and "priorityClassName" not in pod
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert {c["image"] for c in pod["containers"]} == {settings.validator_image}
    (owner,) = daemonset["metadata"]["ownerReferences"]   # deleting the pool removes its validator
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("GpuNodePool", "t4", "u1", True)


def test_a_pool_being_deleted_applies_nothing_and_still_counts_its_nodes():
    body = pool_body()
    body["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:00Z"
    done = planned(body, [node("gpu-1"), node("gpu-2", ready=False)])
    assert done.applies == ()
    assert (done.status.nodes, done.status.ready, done.status.failing) == (2, 1, 1)


def test_each_condition_that_flips_is_one_event_and_the_same_observation_again_is_none():
    first = planned(pool_body(), [node("gpu-1", ready=False)])
    assert events(first) == [("Warning", "NoReadyNodes"), ("Warning", "NodesFailing"),
                             ("Normal", "AllNodesHaveGpus"), ("Normal", "NoOverlap")]
    assert planned(again(pool_body(), first), [node("gpu-1", ready=False)]).events == ()
    healed = planned(again(pool_body(), first), [node("gpu-1")])
    assert events(healed) == [("Normal", "NodesReady"), ("Normal", "NoFailingNodes")]
    assert healed.status.observed_generation == 2 and healed.status.ready == 1


def test_an_invalid_spec_is_degraded_said_once_and_the_rest_of_the_status_is_kept():
    before = planned(pool_body(), [node("gpu-1")])
    body = again(pool_body(nodeSelector={"pool": "t4", "bad key!": "x"}), before)
    done = planned(body, [])
    assert done.applies == () and events(done) == [("Warning", "InvalidSpec")]
    assert [c.type for c in done.status.conditions] == ["Degraded"]
    assert (done.status.ready, done.status.observed_generation) == (1, 2), "the counts stand, at this generation"
    assert planned(again(body, done), []).events == ()
    # Another invalid spec: still InvalidSpec, the condition's message says the new one; no second
    # Event, as for a model (the rule both kinds share says a change of status or reason).
    other = again(pool_body(nodeSelector={"pool": "t4", "other bad!": "y"}), done)
    redone = planned(other, [])
    assert redone.events == () and "other bad!" in redone.status.conditions[0].message


def test_status_fields_this_operator_does_not_know_are_said_once_and_left_out():
    body = pool_body(status={"nodes": 1, "fromTheFuture": 3})
    done = planned(body, [node("gpu-1")])
    assert ("Warning", "StatusFieldsUnknown") in events(done)
    assert "fromTheFuture" not in done.status.to_wire()


def test_the_plan_comes_back_when_the_first_fresh_report_turns_stale():
    done = planned(pool_body(), [node("gpu-1", age_s=100), node("gpu-2", age_s=10)])
    assert done.requeue_after_s == 3 * INTERVAL - 100
    assert planned(pool_body(), []).requeue_after_s is None


def test_render_prints_the_pools_plan_as_new():
    body = pool_body()
    rendered = render_documents([("t4.yaml#1", body)], pull_secrets=["regcred"])
    assert rendered == list(poolplan.as_new(body, poolplan.PoolSettings(pull_secrets=("regcred",))).applies)
    assert [o["kind"] for o in rendered] == ["DaemonSet"]


def _condition(status: str, reason: str, message: str = "") -> Condition:
    return Condition(type="Degraded", status=status, reason=reason, message=message)


def test_one_event_on_flip_rule_for_both_kinds():
    assert flipped(None, _condition("True", "InvalidSpec"))
    assert flipped(_condition("False", "AsExpected"), _condition("True", "InvalidSpec"))
    assert flipped(_condition("True", "InvalidSpec"), _condition("True", "PlanFailed"))
    assert not flipped(_condition("True", "InvalidSpec", "a"), _condition("True", "InvalidSpec", "b"))
    # A model refused for the same reason twice says it once, as a pool does.
    once = model_status.degraded_only(RankingModelStatus(), 1, "InvalidSpec", "bad", "2026-12-01T12:00:00Z")
    twice = model_status.degraded_only(once.status, 1, "InvalidSpec", "bad again", "2026-12-01T12:01:00Z")
    assert [e.reason for e in once.events] == ["InvalidSpec"] and twice.events == ()
