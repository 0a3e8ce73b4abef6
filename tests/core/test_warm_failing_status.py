"""The operator reads why a pod's warm container keeps it un-Ready (issue 24, 5): its model fails
the warm requests. Pure functions of the pods listed and the Deployment; the Degraded condition
WarmupFailing and its Event name the pods and the failures."""
from __future__ import annotations

import datetime as dt
import json

from rankops import model_status as sd
from rankops.rollout import warming

from tests.core.test_model_status import conds, conds_message, decide, facts, idle, serving, spec

FAILED = json.dumps({"reason": "WarmupFailing", "rounds": 3,
                     "message": "75% of 600 warm requests failed in the last 3 rounds (at most 1% may): HTTP 400: "
                                "index 512 is out of bounds"})


def pod(name="ctr-stable-7d9f-abcde", ready=False, warm=None, deleting=False):
    meta = {"name": name, **({"deletionTimestamp": "2026-12-01T12:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                                         "containerStatuses": [{"name": "triton", "ready": True}, *([warm] if warm else [])]}}


def crashed(restarts=2, message=FAILED, now_running=False):
    state = {"running": {"startedAt": "t"}} if now_running else {"waiting": {"reason": "CrashLoopBackOff"}}
    return {"name": "warm", "ready": False, "restartCount": restarts, "state": state,
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}}


def test_a_pod_whose_warm_container_exited_on_failing_requests_is_named_with_the_failures():
    assert warming.warm_failure(pod(warm=crashed())) == (
        "pod ctr-stable-7d9f-abcde: 75% of 600 warm requests failed in the last 3 rounds (at most 1% may): "
        "HTTP 400: index 512 is out of bounds (warm container restarted 2x, CrashLoopBackOff)")
    # Just exited (not restarted yet): the message is in state.terminated.
    just = {"name": "warm", "ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 1, "message": FAILED}}}
    assert warming.warm_failure(pod(warm=just)).endswith("index 512 is out of bounds")
    # Warming again after the back-off: still not Ready, still failing as far as anyone knows.
    assert "75% of 600" in warming.warm_failure(pod(warm=crashed(now_running=True)))


def test_ready_deleting_still_warming_or_otherwise_crashed_pods_are_not_warm_failures():
    assert warming.warm_failure(pod(ready=True, warm=crashed())) is None, "Ready again: over"
    assert warming.warm_failure(pod(deleting=True, warm=crashed())) is None
    assert warming.warm_failure(pod(warm={"name": "warm", "ready": False, "state": {"running": {}}})) is None
    assert warming.warm_failure(pod(warm=crashed(message="Traceback (most recent call last): ..."))) is None
    assert warming.warm_failure(pod()) is None, "no warm container (warmReplicas off)"


def test_failures_are_sorted_by_pod_and_the_message_counts_what_it_does_not_show():
    pods = [pod(f"p{i}", warm=crashed()) for i in (4, 1, 3, 2)] + [pod("ok", ready=True)]
    found = warming.warm_failures(pods)
    assert [f.split(":")[0] for f in found] == ["pod p1", "pod p2", "pod p3", "pod p4"]
    said = warming.describe(found)
    assert said.count("75% of 600") == 3 and "and 1 more pod(s)" in said and "maxErrorRatio" in said


NOW = dt.datetime(2026, 12, 1, 12, 0, 30, tzinfo=dt.timezone.utc)


def deployment(ready=0, replicas=2, available=("False", "2026-12-01T12:00:00Z")):
    conditions = [{"type": "Available", "status": available[0], "lastTransitionTime": available[1]}] if available else []
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": ready, "conditions": conditions}}


def test_the_models_pods_are_listed_only_once_the_stable_has_been_unavailable_a_while():
    assert warming.reads_all_pods(deployment(), NOW), "un-Available for 30 s"
    assert not warming.reads_all_pods(deployment(available=("False", "2026-12-01T12:00:20Z")), NOW), "10 s: warming"
    assert not warming.reads_all_pods(deployment(ready=2), NOW), "all Ready: no request"
    assert not warming.reads_all_pods(deployment(available=None), NOW), "the Deployment controller has not said yet"
    assert not warming.reads_all_pods(None, NOW)


def test_warm_failures_make_the_model_degraded_warmup_failing_with_one_warning_event():
    found = warming.warm_failures([pod(warm=crashed())])
    first = decide(spec("1"), {}, idle(), facts(serving(ready=3), warm_failing=found))
    assert conds(first.status)["Degraded"] == ("True", "WarmupFailing")
    assert "pod ctr-stable-7d9f-abcde: 75% of 600 warm requests failed" in conds_message(first.status, "Degraded")
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "WarmupFailing")]
    again = decide(spec("1"), first.status, idle(), facts(serving(ready=3), warm_failing=found))
    assert again.events == (), "said once, not every reconcile"
    healed = decide(spec("1"), again.status, idle(), facts())
    assert conds(healed.status)["Degraded"] == ("False", "AsExpected")


def test_the_controller_reads_a_stable_pod_failing_its_warm_up_into_degraded_and_an_event():
    import copy

    from rankops.controller import models
    from tests.core.test_rollout_controller import MODEL, T0, Model, gpu_cluster, unavailable_stable

    cluster = gpu_cluster()
    model = Model(cluster, version="1")
    model.reconcile()
    labels = unavailable_stable(cluster, model)
    cluster.put({"kind": "Pod", **pod(f"{MODEL}-stable-0", warm=crashed()),
                 "metadata": {"name": f"{MODEL}-stable-0", "namespace": "reco", "labels": labels}})
    soon = models.reconcile(cluster, copy.deepcopy(model.body), now=T0 + dt.timedelta(seconds=model.t + 5),
                            memory=model.memory)
    assert conds(soon.status)["Degraded"] == ("False", "AsExpected"), "un-Available 5 s: not listed yet"
    later = models.reconcile(cluster, copy.deepcopy({**model.body, "status": soon.status.to_wire()}),
                             now=T0 + dt.timedelta(seconds=model.t + 20), memory=model.memory)
    assert conds(later.status)["Degraded"] == ("True", "WarmupFailing")
    assert f"pod {MODEL}-stable-0: 75% of 600 warm requests failed" in conds_message(later.status, "Degraded")
    assert [(e.type, e.reason) for e in later.events if e.reason == "WarmupFailing"] == [("Warning", "WarmupFailing")]
