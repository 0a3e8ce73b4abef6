"""Issue 41: rollout.strategy inPlace through the rollout machine (pure): the InPlace phase, its
ends (Promoted, RolledBack, Superseded, Canceled, the pods strategy), status as a restarted
operator reads it."""
from __future__ import annotations

import datetime as dt

from rankops.planner.two_versions import SideBySide
from rankops.rollout import inplace
from rankops.rollout.inplace import GateVerdict, Load, PodIndex, RunGate, Unload, VersionState
from rankops.rollout.machine import ABORT_ANNOTATION, Observed, step
from test_rollout_machine import model as pods_model
from tests import wire

T0 = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.timezone.utc)
FITS = SideBySide(True, "1 x 3000 MiB (v1) + 1 x 3000 MiB (v2) + 0 MiB runtime reserve = 6000 MiB, + 10% margin "
                        "= 6600 MiB of 16384 MiB per GPU: fits (9784 MiB spare)")
SHORT = SideBySide(False, "2 x 6000 MiB (v1) + 2 x 6000 MiB (v2) ...: does not fit (8000 MiB short)",
                   ("GPU memory: 2 x 6000 MiB (v1) + 2 x 6000 MiB (v2) ...: does not fit (8000 MiB short)",))
PODS = ("ctr-stable-a", "ctr-stable-b", "ctr-stable-c", "ctr-stable-d")


def model(version="2", **rollout):
    return pods_model(version, strategy="inPlace", **rollout)


def index(name, **versions):
    """A pod's repository index: version number -> state (v1 READY unless said)."""
    held = {1: VersionState("READY")}
    for key, state in versions.items():
        number = int(key[1:])
        if state is None:
            held.pop(number, None)
        else:
            held[number] = VersionState(state, "unloaded" if state == "UNAVAILABLE" else "")
    return PodIndex(name, f"{name}-uid", True, held)


def pods(**by_pod):
    """Every stable pod's index; by_pod: {"a": {"v2": "READY"}} for ctr-stable-a."""
    return tuple(index(name, **by_pod.get(name[-1], {})) for name in PODS)


def seen(at, pod_indexes, gates=None, p99=12.0):
    return inplace.Observed(T0 + dt.timedelta(seconds=at), pod_indexes, gates or {}, p99)


def drive(rm, status, at=0, fit=FITS, in_place=None, annotations=None):
    decision = step(rm.spec, wire.status(status), Observed(
        now=T0 + dt.timedelta(seconds=at), in_place_fit=fit, in_place=in_place, replicas=4,
        annotations=annotations or {}))
    return decision, {"stableVersion": decision.stable_version, "rollout": wire.stored(decision.rollout),
                      "gates": wire.stored(decision.gates)}


PASS = {"warmup": GateVerdict("pass", "warm P99 3 ms", "ctr-stable-a-uid"),
        "equivalence": GateVerdict("pass", "top-10 overlap 1.000", "ctr-stable-a-uid")}


def gating(rm):
    """Drive a switch to Gating on ctr-stable-a: the status then."""
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, in_place=seen(1, pods()))
    _, s = drive(rm, s, 30, in_place=seen(30, pods(a={"v2": "READY"})))
    assert s["rollout"]["inPlace"]["phase"] == "Gating"
    return s


def test_in_place_starts_without_a_canary_and_holds_the_new_version_beside_the_stable():
    d, s = drive(model(), {"stableVersion": "1"})
    assert s["rollout"]["phase"] == "InPlace" and s["rollout"]["strategy"] == "inPlace"
    assert s["rollout"]["inPlace"]["phase"] == "Loading" and s["rollout"]["inPlace"]["fromVersion"] == "1"
    assert d.serving.canary_version is None and d.serving.stable_version == "1"
    assert d.serving.staged_versions == ("2",) and d.gate_jobs == ()
    assert [e.reason for e in d.events] == ["InPlaceSwitchStarted"]


def test_when_it_does_not_fit_the_rollout_uses_pods_and_says_the_arithmetic():
    d, s = drive(model(), {"stableVersion": "1"}, fit=SHORT)
    assert s["rollout"]["phase"] == "CanaryStarting" and s["rollout"]["strategy"] == "pods"
    assert s["rollout"]["inPlace"]["phase"] == "FellBack" and "8000 MiB short" in s["rollout"]["inPlace"]["reason"]
    assert "8000 MiB short" in s["rollout"]["message"]
    assert d.serving.canary_version == "2" and d.serving.staged_versions == ()
    assert [e.reason for e in d.events] == ["InPlaceNotPossible", "CanaryStarting"]
    # no arithmetic at all (no memory figure): the same, said so
    _, s = drive(model(), {"stableVersion": "1"}, fit=None)
    assert s["rollout"]["strategy"] == "pods" and "no memory arithmetic" in s["rollout"]["inPlace"]["reason"]


def test_the_pods_strategy_is_recorded_as_such():
    _, s = drive(pods_model("2"), {"stableVersion": "1"})
    assert s["rollout"]["strategy"] == "pods" and "inPlace" not in s["rollout"]


def test_loaded_gated_switched_pod_by_pod_then_promoted_on_recorded_verdicts():
    rm = model()
    _, s = drive(rm, {"stableVersion": "1"})
    d, s = drive(rm, s, 1, in_place=seen(1, pods()))
    assert d.in_place_actions == (Load("ctr-stable-a", "2", ("1", "2")),)
    d, s = drive(rm, s, 2, in_place=None)                      # nothing read (a new operator): nothing moves
    assert d.in_place_actions == () and s["rollout"]["inPlace"]["phase"] == "Loading"
    d, s = drive(rm, s, 30, in_place=seen(30, pods(a={"v2": "READY"})))
    assert d.in_place_actions == (RunGate("warmup", "ctr-stable-a", "2"),)
    d, s = drive(rm, s, 60, in_place=seen(60, pods(a={"v2": "READY"}), gates=PASS))
    assert s["rollout"]["inPlace"]["servedBy"] == "2 on 1/4 pods, 1 on 4/4"   # kubectl get rm: In-Place
    # both verdicts are recorded under this attempt, as a gate Job's would be
    assert {(g["gate"], g["outcome"], g["attempt"]) for g in s["gates"]} == \
        {("warmup", "pass", s["rollout"]["attempt"]), ("equivalence", "pass", s["rollout"]["attempt"])}
    assert s["rollout"]["inPlace"]["phase"] == "Promoting"
    assert d.in_place_actions == (Load("ctr-stable-b", "2", ("1", "2")),)
    everyone = pods(**{p: {"v2": "READY"} for p in "abcd"})
    d, s = drive(rm, s, 90, in_place=seen(90, everyone, gates=PASS))
    assert s["rollout"]["inPlace"]["phase"] == "Unloading"
    assert set(d.in_place_actions) == {Unload(p, "1", ("2",)) for p in PODS}
    done = pods(**{p: {"v2": "READY", "v1": "UNAVAILABLE"} for p in "abcd"})
    d, s = drive(rm, s, 120, in_place=seen(120, done, gates=PASS))
    assert s["rollout"]["phase"] == "Promoted" and s["stableVersion"] == "2" and d.outcome == "Promoted"
    assert d.serving.stable_version == "2" and d.serving.staged_versions == ()
    # the running pods serve 2 already: they were started for 1, and stay (no roll)
    assert d.stable_pods_version == d.serving.started_for == "1"
    s["stablePodsVersion"] = d.stable_pods_version
    # the next reconcile trusts it: both verdicts of the attempt stand behind the promotion
    d, s = drive(rm, s, 150)
    assert d.stable_version == "2" and d.rollout.phase == "Promoted" and not d.events
    assert d.serving.started_for == "1"


def test_a_promotion_by_pods_rolls_the_stable_pods_to_it_and_back_if_it_fails():
    from rankops.api.rankingmodel import RankingModelStatus, RolloutStatus
    from rankops.render.desired import ServingState
    from rankops.rollout.machine import Decision, _started_for

    before = RankingModelStatus(stable_version="1", stable_pods_version="1")
    promoting = Decision("1", ServingState("2", canary_version="2"),
                         RolloutStatus(version="2", phase="Promoting", strategy="pods"), [])
    assert _started_for(before, promoting) == ("1", "2")          # the template moves: the pods roll
    by_pods = Decision("2", ServingState("2"), RolloutStatus(version="2", phase="Promoted", strategy="pods"), [],
                       outcome="Promoted")
    assert _started_for(before, by_pods) == ("2", "2")
    failed = Decision("1", ServingState("1"), RolloutStatus(version="2", phase="RolledBack", strategy="pods"), [],
                      outcome="RolledBack")
    assert _started_for(before, failed) == ("1", "1")              # back: the pods roll to 1 again
    in_place = Decision("2", ServingState("2"), RolloutStatus(version="2", phase="Promoted", strategy="inPlace"), [],
                        outcome="Promoted")
    assert _started_for(before, in_place) == ("1", "1")            # the running pods serve 2: no roll
    after = RankingModelStatus(stable_version="2", stable_pods_version="1")
    assert _started_for(after, Decision("2", ServingState("2"), None, [])) == ("1", "1")
    # a model new to inPlace (nothing recorded): its pods were started for the stable version
    assert _started_for(RankingModelStatus(stable_version="1"), Decision("1", ServingState("1"), None, [])) == \
        ("1", "1")


def test_a_failing_gate_rolls_back_after_the_version_is_unloaded_everywhere():
    rm = model()
    s = gating(rm)
    failing = {"warmup": PASS["warmup"],
               "equivalence": GateVerdict("fail", "top-10 overlap 0.40 < 0.90", "ctr-stable-a-uid")}
    d, s = drive(rm, s, 60, in_place=seen(60, pods(a={"v2": "READY"}), gates=failing))
    assert s["rollout"]["phase"] == "InPlace" and s["rollout"]["inPlace"]["phase"] == "RollingBack"
    assert d.in_place_actions == (Unload("ctr-stable-a", "2", ("1",)),)
    assert {g["gate"]: g["outcome"] for g in s["gates"]} == {"warmup": "pass", "equivalence": "fail"}
    d, s = drive(rm, s, 90, in_place=seen(90, pods(a={"v2": "UNAVAILABLE"}), gates=failing))
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "equivalence"
    assert s["stableVersion"] == "1" and d.serving.staged_versions == () and d.outcome == "RolledBack"


def test_a_version_change_mid_switch_unloads_first_then_supersedes_and_starts_the_next():
    s = gating(model("2"))
    rm3 = model("3")
    d, s = drive(rm3, s, 60, in_place=seen(60, pods(a={"v2": "READY"})))
    assert s["rollout"]["version"] == "2" and s["rollout"]["inPlace"]["phase"] == "RollingBack"
    assert d.in_place_actions == (Unload("ctr-stable-a", "2", ("1",)),)
    assert d.serving.staged_versions == ("2",)           # its files stay until no pod holds it
    d, s = drive(rm3, s, 90, in_place=seen(90, pods(a={"v2": "UNAVAILABLE"})))
    assert s["rollout"]["phase"] == "Superseded" and d.outcome == "Superseded" and d.serving.staged_versions == ()
    d, s = drive(rm3, s, 91)
    assert s["rollout"]["version"] == "3" and s["rollout"]["phase"] == "InPlace"
    assert d.serving.staged_versions == ("3",)


def test_back_to_the_stable_version_mid_switch_cancels_once_unloaded():
    s = gating(model("2"))
    d, s = drive(model("1"), s, 60, in_place=seen(60, pods(a={"v2": "READY"})))
    assert s["rollout"]["inPlace"]["phase"] == "RollingBack"
    d, s = drive(model("1"), s, 90, in_place=seen(90, pods(a={"v2": "UNAVAILABLE"})))
    assert s["rollout"]["phase"] == "Canceled" and d.outcome == "Canceled" and s["stableVersion"] == "1"
    d, s = drive(model("1"), s, 91)
    assert d.rollout.phase == "Canceled" and not d.events


def test_abort_goes_through_the_switch_and_acts_once():
    rm = model("2")
    s = gating(rm)
    d, s = drive(rm, s, 60, in_place=seen(60, pods(a={"v2": "READY"})), annotations={ABORT_ANNOTATION: "2"})
    assert s["rollout"]["inPlace"]["phase"] == "RollingBack" and s["rollout"]["aborted"] == "2"
    d, s = drive(rm, s, 90, in_place=seen(90, pods(a={"v2": "UNAVAILABLE"})), annotations={ABORT_ANNOTATION: "2"})
    assert s["rollout"]["phase"] == "RolledBack" and s["rollout"]["failedGate"] == "manual"


def test_interference_falls_back_to_pods_with_a_new_attempt():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, in_place=seen(1, pods()))
    first = s["rollout"]["attempt"]
    d, s = drive(rm, s, 20, in_place=seen(20, pods(a={"v2": "LOADING"}), p99=1500.0))
    assert s["rollout"]["inPlace"]["phase"] == "FallingBack"
    assert d.in_place_actions == (Unload("ctr-stable-a", "2", ("1",)),)
    d, s = drive(rm, s, 40, in_place=seen(40, pods(a={"v2": "UNAVAILABLE"}), p99=40.0))
    assert s["rollout"]["phase"] == "CanaryStarting" and s["rollout"]["strategy"] == "pods"
    assert s["rollout"]["attempt"] != first and "1500.0 ms" in s["rollout"]["message"]
    assert s["rollout"]["inPlace"]["phase"] == "FellBack"
    assert d.serving.canary_version == "2" and d.serving.staged_versions == ()
    # from here it is the pods rollout: the next step does not go back in place
    d, s = drive(rm, s, 41)
    assert s["rollout"]["phase"] == "CanaryStarting" and d.in_place_actions == ()


def test_paused_holds_the_switch_where_it_is():
    rm = model("2", paused=True)
    _, s = drive(rm, {"stableVersion": "1"})
    d, s2 = drive(rm, s, 1, in_place=seen(1, pods()))
    assert d.in_place_actions == () and s2["rollout"]["inPlace"] == s["rollout"]["inPlace"]


def test_a_verdict_is_recorded_once_when_it_comes():
    rm = model()
    s = gating(rm)
    _, s = drive(rm, s, 60, in_place=seen(60, pods(a={"v2": "READY"}), gates={"warmup": PASS["warmup"]}))
    first = {g["gate"]: g["finishedAt"] for g in s["gates"]}
    d, s = drive(rm, s, 90, in_place=seen(90, pods(a={"v2": "READY"}), gates={"warmup": PASS["warmup"]}))
    assert {g["gate"]: g["finishedAt"] for g in s["gates"]} == first and d.gates == wire.status(s).gates


def test_promoting_without_recorded_verdicts_goes_back_to_the_gates():
    rm = model()
    _, s = drive(rm, {"stableVersion": "1"})
    s["rollout"]["inPlace"].update(phase="Promoting", gatePod="ctr-stable-a", gatePodUid="ctr-stable-a-uid")
    d, s = drive(rm, s, 5, in_place=seen(5, pods(a={"v2": "READY"})))
    assert s["rollout"]["inPlace"]["phase"] == "Gating" and "GateVerdictMissing" in [e.reason for e in d.events]
    assert d.in_place_actions == (RunGate("warmup", "ctr-stable-a", "2"),)


def test_an_abort_or_a_new_version_while_falling_back_ends_the_rollout_not_a_canary():
    for rm, annotations, ends in ((model("2"), {ABORT_ANNOTATION: "2"}, "RolledBack"),
                                  (model("3"), {}, "Superseded"), (model("1"), {}, "Canceled")):
        _, s = drive(model("2"), {"stableVersion": "1"})
        _, s = drive(model("2"), s, 1, in_place=seen(1, pods()))
        _, s = drive(model("2"), s, 20, in_place=seen(20, pods(a={"v2": "LOADING"}), p99=1500.0))
        assert s["rollout"]["inPlace"]["phase"] == "FallingBack"
        d, s = drive(rm, s, 40, in_place=seen(40, pods(a={"v2": "UNAVAILABLE"})), annotations=annotations)
        assert s["rollout"]["phase"] == ends and d.serving.canary_version is None, (ends, s["rollout"])


def test_a_reference_other_than_the_serving_version_uses_pods_saying_why():
    d, s = drive(model("2", equivalence={"reference": "3"}), {"stableVersion": "1"})
    assert s["rollout"]["strategy"] == "pods" and "rollout.equivalence.reference is 3" in s["rollout"]["message"]


def test_paused_still_falls_back_when_the_load_interferes():
    rm = model("2")
    _, s = drive(rm, {"stableVersion": "1"})
    _, s = drive(rm, s, 1, in_place=seen(1, pods()))
    d, s = drive(model("2", paused=True), s, 20, in_place=seen(20, pods(a={"v2": "LOADING"}), p99=1500.0))
    assert s["rollout"]["inPlace"]["phase"] == "FallingBack" and d.in_place_actions
