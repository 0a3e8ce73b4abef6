"""Canary steps and analysis bounds at their edges: restarts, edits mid-rollout, the CRD's nulls."""
from __future__ import annotations

from rankops.api.crdgen import openapi_schema
from rankops.api.rankingmodel import RankingModel

from tests.core.test_rollout_machine import STEPS, _counters, _serving, _to_verifying, drive, model, passed, up


def test_gates_passing_after_a_long_verify_do_not_roll_back_the_canary_on_that_phase_age():
    # The equivalence Job passed, but the operator saw it only 970 s into Verifying (it was down):
    # the Canary phase starts now, so its "not Ready after the hold" deadline counts from now, not
    # from when Verifying began (60 s step + 900 s gate timeout < 970 s).
    rm = model("2", canary=STEPS)
    s = _to_verifying(rm)                     # Verifying since t=2
    d, s = drive(rm, s, 2 + 970, **up(), gates={"equivalence": passed("equivalence")})
    assert s["rollout"]["phase"] == "Canary", s["rollout"]["message"]
    d, s = drive(rm, s, 2 + 971, **up())
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_traffic


def test_a_record_of_the_previous_operator_without_step_fields_resumes_its_hold():
    rm = model("2", canary=STEPS)
    s = _serving(rm)                          # traffic on at t=4
    old = {k: v for k, v in s["rollout"].items() if k not in ("step", "stepSince")}
    s = {**s, "rollout": old}
    d, s = drive(rm, s, 4 + 59, **up())
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_weight == 10
    d, s = drive(rm, s, 4 + 60, **up())
    assert s["rollout"]["step"] == 2 and d.serving.canary_weight == 50


def test_steps_shortened_below_the_recorded_step_hold_the_last_one_and_promote():
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 64, **up())
    assert s["rollout"]["step"] == 2
    shorter = model("2", canary={"steps": [{"weight": 30, "durationSeconds": 60}]})
    d, s = drive(shorter, s, 70, **up(2))
    assert s["rollout"]["phase"] == "Canary" and d.serving.canary_weight == 30
    d, s = drive(shorter, s, 70 + 59, **up(2))        # its hold started when its 2 pods served (70)
    assert s["rollout"]["phase"] == "Canary"
    d, s = drive(shorter, s, 70 + 60, **up(2))
    assert s["rollout"]["phase"] == "Promoting"


def test_max_p99_vs_stable_null_is_kept_by_the_api_server():
    # "null: not compared": without `nullable` the API server prunes the null and defaults it to 1.5.
    node = openapi_schema(RankingModel)["properties"]["spec"]["properties"]["rollout"]["properties"]["canary"][
        "properties"]["analysis"]["properties"]["maxP99VsStable"]
    assert node.get("nullable") is True and node["default"] == 1.5, node
    rm = model("2", canary={"analysis": {"maxP99VsStable": None}})
    assert rm.spec.rollout.canary.analysis.max_p99_vs_stable is None


def test_a_new_canary_pod_of_a_step_is_judged_from_its_first_reading_not_its_warm_replay():
    # Step 2 scales the canary to 4 pods (replicas mode); each new pod ran its warm replay
    # (hundreds of requests to its own Triton) before it went Ready. Those are not traffic of the
    # step: counted, they dilute the real failures below the bound. A pod first seen after the
    # window began counts from its first reading.
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    _, s = drive(rm, s, 64, **up(), track_metrics={"canary": {"c0": _counters(200, 0, 4000)},
                                                   "stable": {"s0": _counters(2000, 0, 4000)}})
    assert s["rollout"]["step"] == 2
    # Step 2's window starts while its new pods still warm (only c0 serves and is read).
    _, s = drive(rm, s, 70, canary_pods=up()["canary_pods"], canary_desired=4,
                 track_metrics={"canary": {"c0": _counters(200, 0, 4000)}, "stable": {"s0": _counters(2000, 0, 4000)}})
    warmed = {f"c{i}": _counters(1000, 0, 4000) for i in range(1, 4)}     # their warm replay only
    _, s = drive(rm, s, 75, **up(4), track_metrics={"canary": {"c0": _counters(200, 0, 4000), **warmed},
                                                     "stable": {"s0": _counters(2000, 0, 4000)}})
    assert s["rollout"]["phase"] == "Canary"
    # Then the step's real traffic: 10% of the canary's requests fail, on every pod.
    served = {f"c{i}": _counters(1000 + 45, 5, 4000) for i in range(1, 4)}
    _, s = drive(rm, s, 100, **up(4), track_metrics={"canary": {"c0": _counters(245, 5, 4000), **served},
                                                      "stable": {"s0": _counters(3000, 0, 4000)}})
    assert s["rollout"]["phase"] == "RolledBack", s["rollout"]["message"]
    assert s["gates"][-1]["metrics"]["canary"]["requests"] == 200 and s["gates"][-1]["metrics"]["canary"]["failures"] == 20


def test_a_restarted_canary_pod_counts_from_its_first_reading_after_the_restart():
    rm = model("2")
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(5000)}, "stable": {"s0": _counters(0)}})
    # c0 restarted (its counters went down) and warmed again: 2500 replay requests, none of the step's.
    _, s = drive(rm, s, 60, **up(), track_metrics={"canary": {"c0": _counters(2500)}, "stable": {"s0": _counters(500)}})
    _, s = drive(rm, s, 90, **up(), track_metrics={"canary": {"c0": _counters(2580, 20)},
                                                    "stable": {"s0": _counters(900)}})
    assert s["rollout"]["phase"] == "RolledBack", s["rollout"]["message"]
    assert s["gates"][-1]["metrics"]["canary"]["requests"] == 100


def test_the_next_step_is_judged_from_the_reading_that_closed_the_last_one():
    # Step 2's weight takes effect in the reconcile that closes step 1: failures served before the
    # next reconcile are step 2's, and they count.
    rm = model("2", canary=STEPS)
    s = _serving(rm)
    _, s = drive(rm, s, 10, **up(), track_metrics={"canary": {"c0": _counters(0)}, "stable": {"s0": _counters(0)}})
    _, s = drive(rm, s, 64, **up(), track_metrics={"canary": {"c0": _counters(200, 0, 4000)},
                                                   "stable": {"s0": _counters(2000, 0, 4000)}})
    assert s["rollout"]["step"] == 2 and s["rollout"]["analysisBaseline"]["step"] == 2
    _, s = drive(rm, s, 74, **up(), track_metrics={"canary": {"c0": _counters(380, 20, 4000)},
                                                   "stable": {"s0": _counters(2500, 0, 4000)}})
    assert s["rollout"]["phase"] == "RolledBack", s["rollout"]["message"]
    assert s["gates"][-1]["metrics"]["canary"]["requests"] == 200


def test_an_exact_traffic_canary_has_the_pods_its_step_weight_needs():
    # 50% of a 4-replica model's traffic on one canary pod is 4x a stable pod's load: it overloads
    # (and the P99 comparison rolls a healthy version back). Sized like the stable's share: 2 pods.
    rm = model("2", canary={**STEPS, "traffic": "gatewayAPI", "parentRef": "gw"})
    s = _serving(rm)
    d, s = drive(rm, s, 30, **up())
    assert d.serving.canary_weight == 10 and d.serving.canary_replicas == 1
    d, s = drive(rm, s, 64, **up())
    assert d.serving.canary_weight == 50 and d.serving.canary_replicas == 2
