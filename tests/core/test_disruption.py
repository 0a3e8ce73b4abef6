"""spec.disruption and what it renders (issue 25 items 1-2): each track's PodDisruptionBudget from
planning.failureTolerance, topology spread, priority class, lost-node tolerations, and a Triton
pod that finishes its requests before it goes (preStop delay, exit timeout, grace period)."""
from __future__ import annotations

import pathlib

import pytest
import yaml
from pydantic import ValidationError

from rankops.api import crdgen
from rankops.api.rankingmodel import RankingModel
from rankops.render import names
from rankops.render.desired import ServingState, desired_objects, resolve_shape, track_objects
from rankops.model_status import track_children

HERE = pathlib.Path(__file__).parent
MODEL = "ctr-ranker"


def doc(**spec) -> dict:
    found = yaml.safe_load((HERE / "cases" / "onnx-fp16-pooled.yaml").read_text())
    found["spec"].update(spec)
    found["metadata"] = {"name": MODEL, "namespace": "reco"}
    return found


def model(**spec) -> RankingModel:
    return RankingModel.model_validate(doc(**spec))


def objects(rm: RankingModel, state: ServingState | None = None) -> dict[tuple[str, str], dict]:
    found = desired_objects(rm, state or ServingState(rm.spec.version), resolve_shape(rm.spec))
    return {(o["kind"], o["metadata"]["name"]): o for o in found}


def pdb(found: dict, track: str = names.STABLE) -> dict:
    return found[("PodDisruptionBudget", f"{MODEL}-{track}")]


def pod(found: dict, track: str = names.STABLE) -> dict:
    return found[("Deployment", f"{MODEL}-{track}")]["spec"]["template"]["spec"]


def two_versions(**spec) -> RankingModel:
    return model(version="4", versions=[{"name": "3", "modelUri": "s3://m/3", "format": "onnx"},
                                        {"name": "4", "modelUri": "s3://m/4", "format": "onnx"}], **spec)


# --- PodDisruptionBudgets ----------------------------------------------------------------------------

@pytest.mark.parametrize("replicas,tolerance,min_available", [
    (2, None, 1),   # no planning: a tolerance of 1, as the planner
    (3, 1, 2),
    (3, 2, 1),
    (1, 1, 0),      # the model said it may lose its only replica
    (2, 5, 0),
    (3, 0, 3),      # no loss allowed: a drain waits until another pod stands in
])
def test_the_stable_budget_keeps_replicas_minus_the_failure_tolerance(replicas, tolerance, min_available):
    spec = {"replicas": replicas}
    if tolerance is not None:
        spec["planning"] = {"failureTolerance": tolerance}
    budget = pdb(objects(model(**spec)))
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["minAvailable"] == min_available
    assert "maxUnavailable" not in budget["spec"]
    assert budget["spec"]["selector"] == {"matchLabels": {names.LABEL_MODEL: MODEL, names.LABEL_TRACK: "stable"}}
    # A replica that is not Ready (crash-looping, on a failing GPU) never holds up a drain.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget["metadata"]["labels"][names.LABEL_MODEL] == MODEL


def test_replicas_lent_to_a_canary_count_against_the_tolerance_not_twice():
    rm = two_versions(replicas=3, planning={"failureTolerance": 1},
                      rollout={"canary": {"capacity": "replace"}})
    found = objects(rm, ServingState("3", "4", True, 1, 25, stable_lent=1))
    assert found[("Deployment", f"{MODEL}-stable")]["spec"]["replicas"] == 2
    assert pdb(found)["spec"]["minAvailable"] == 2


def test_canary_and_reference_budgets_never_hold_up_a_drain():
    rm = two_versions()
    found = objects(rm, ServingState("3", "4", True, 1, 25))
    assert pdb(found, names.CANARY)["spec"]["minAvailable"] == 0
    reference = {(o["kind"], o["metadata"]["name"]): o
                 for o in track_objects(rm, "reference", "3", 1, False, resolve_shape(rm.spec).shape)}
    assert reference[("PodDisruptionBudget", f"{MODEL}-reference")]["spec"]["minAvailable"] == 0


def test_a_track_that_goes_takes_its_budget_with_it():
    assert ("PodDisruptionBudget", f"{MODEL}-canary") in track_children(MODEL, names.CANARY)


# --- placement ----------------------------------------------------------------------------------------

def test_replicas_spread_over_nodes_preferred_and_zones_always_preferred():
    spread = pod(objects(model()))["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in spread] == [
        ("kubernetes.io/hostname", "ScheduleAnyway"), ("topology.kubernetes.io/zone", "ScheduleAnyway")]
    for constraint in spread:
        assert constraint["maxSkew"] == 1
        assert constraint["labelSelector"] == {"matchLabels": {names.LABEL_MODEL: MODEL, names.LABEL_TRACK: "stable"}}
        # Per ReplicaSet: a rolling update's old pods do not skew where the new ones go.
        assert constraint["matchLabelKeys"] == ["pod-template-hash"]
        assert constraint["nodeTaintsPolicy"] == "Honor"
    assert spread[0]["labelSelector"] is not spread[1]["labelSelector"]


def test_required_node_spread_refuses_a_second_replica_on_a_fuller_node():
    found = objects(two_versions(disruption={"nodeSpread": "required"}), ServingState("3", "4", False, 1))
    for track in (names.STABLE, names.CANARY):
        host, zone = pod(found, track)["topologySpreadConstraints"]
        assert (host["whenUnsatisfiable"], zone["whenUnsatisfiable"]) == ("DoNotSchedule", "ScheduleAnyway")
        assert host["labelSelector"]["matchLabels"][names.LABEL_TRACK] == track


def test_lost_node_tolerations_are_short_and_the_gpu_taint_stays():
    tolerations = pod(objects(model()))["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    lost = {t["key"]: t for t in tolerations if t["effect"] == "NoExecute"}
    assert set(lost) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert {t["tolerationSeconds"] for t in lost.values()} == {30}
    custom = pod(objects(model(disruption={"unreachableTolerationSeconds": 10})))["tolerations"]
    assert {t["tolerationSeconds"] for t in custom if t["effect"] == "NoExecute"} == {10}


def test_priority_class_only_when_asked():
    assert "priorityClassName" not in pod(objects(model()))
    assert pod(objects(model(disruption={"priorityClassName": "ranking-high"})))["priorityClassName"] == "ranking-high"


def test_the_autoscaler_may_move_triton_pods_unless_the_spec_says_otherwise():
    annotations = lambda rm: objects(rm)[("Deployment", f"{MODEL}-stable")]["spec"]["template"]["metadata"][  # noqa: E731
        "annotations"]
    assert annotations(model())["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    kept = model(podAnnotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"})
    assert annotations(kept)["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


# --- graceful exit --------------------------------------------------------------------------------------

def test_triton_leaves_the_service_before_it_stops_and_finishes_its_requests():
    spec = pod(objects(model()))
    triton = spec["containers"][0]
    assert triton["lifecycle"] == {"preStop": {"exec": {"command": ["/bin/sleep", "5"]}}}
    assert "--exit-timeout-secs=15" in triton["args"]
    assert spec["terminationGracePeriodSeconds"] == 5 + 15 + 5
    assert all("lifecycle" not in c for c in spec["containers"][1:]), "only Triton waits"


def test_graceful_exit_settings():
    spec = pod(objects(model(disruption={"preStopDelaySeconds": 0, "exitTimeoutSeconds": 40,
                                         "terminationGracePeriodSeconds": 60})))
    assert "lifecycle" not in spec["containers"][0]
    assert "--exit-timeout-secs=40" in spec["containers"][0]["args"]
    assert spec["terminationGracePeriodSeconds"] == 60


# --- validation -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("disruption,named", [
    ({"priorityClassName": "system-node-critical"}, "priorityClassName"),
    ({"priorityClassName": "Not_A_Name"}, "priorityClassName"),
    ({"unreachableTolerationSeconds": -1}, "unreachableTolerationSeconds"),
    ({"unreachableTolerationSeconds": 86400}, "unreachableTolerationSeconds"),
    ({"nodeSpread": "always"}, "nodeSpread"),
    ({"preStopDelaySeconds": 600}, "preStopDelaySeconds"),
    ({"exitTimeoutSeconds": 0}, "exitTimeoutSeconds"),
    ({"preStopDelaySeconds": 10, "exitTimeoutSeconds": 30, "terminationGracePeriodSeconds": 20},
     "terminationGracePeriodSeconds"),
    ({"maxUnavailable": 1}, "maxUnavailable"),
])
def test_bad_disruption_settings_are_refused_naming_the_field(disruption, named):
    with pytest.raises(ValidationError) as caught:
        model(disruption=disruption)
    assert named in str(caught.value)


def test_the_crd_checks_the_same_at_apply_time():
    crd = crdgen.crd_for(RankingModel)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    disruption = spec["disruption"]
    fields = disruption["properties"]
    assert fields["unreachableTolerationSeconds"]["default"] == 30
    assert (fields["preStopDelaySeconds"]["default"], fields["exitTimeoutSeconds"]["default"]) == (5, 15)
    assert fields["nodeSpread"]["enum"] == ["preferred", "required"]
    assert "default" not in fields["terminationGracePeriodSeconds"]
    rules = [r["rule"] for r in disruption["x-kubernetes-validations"]]
    assert any("priorityClassName.startsWith('system-')" in r for r in rules)
    assert any("terminationGracePeriodSeconds >=" in r for r in rules)
