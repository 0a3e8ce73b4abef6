"""Every phase honours the guards the machine applies once before dispatching to it: `paused`
(no phase change, whatever the observations say; only a serving canary is still judged) and
`abort` (rolled back now, paused or not)."""
from __future__ import annotations

import pytest

from rankops.rollout.machine import ABORT_ANNOTATION

from tests.core.test_rollout_machine import _serving, _to_verifying, drive, model, passed, up

RM = model("2")


def _in_phase(phase: str) -> tuple[dict, int, dict]:
    """A status of `phase`, the time of its last step, and the observations that would move it on."""
    if phase == "CanaryStarting":
        _, s = drive(RM, {"stableVersion": "1"})
        return s, 0, up()
    if phase == "Warming":
        _, s = drive(RM, {"stableVersion": "1"})
        _, s = drive(RM, s, 1, **up())
        return s, 1, {**up(), "gates": {"warmup": passed("warmup")}}
    if phase == "Verifying":
        return _to_verifying(RM), 2, {**up(), "gates": {"equivalence": passed("equivalence")}}
    s = _serving(RM)                                     # Canary, its hold from t=4 (300 s)
    if phase == "Canary":
        return s, 4, up()
    _, s = drive(RM, s, 4 + 300, **up())
    assert s["rollout"]["phase"] == "Promoting"
    return s, 304, {**up(), "stable_template_version": "2", "stable_updated_ready": 4, "stable_desired": 4}


PHASES = ["CanaryStarting", "Warming", "Verifying", "Canary", "Promoting"]


@pytest.mark.parametrize("phase", PHASES)
def test_unpaused_the_observations_move_each_phase_on(phase):
    s, t, moving = _in_phase(phase)
    assert s["rollout"]["phase"] == phase
    later = 4 + 300 if phase == "Canary" else t + 1
    _, after = drive(RM, s, later, **moving)
    assert after["rollout"]["phase"] != phase, "the fixture must be one that moves"


@pytest.mark.parametrize("phase", PHASES)
def test_paused_no_phase_changes_in_any_phase_even_past_its_deadline(phase):
    paused = model("2", paused=True)
    s, t, moving = _in_phase(phase)
    for later in (t + 1, 4 + 300, t + 5000):      # moving on, the hold's end, every deadline passed
        d, after = drive(paused, s, later, **moving)
        assert after["rollout"]["phase"] == phase, (later, after["rollout"]["message"])
        assert d.outcome is None


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("pause", [False, True])
def test_abort_rolls_back_in_every_phase_paused_or_not(phase, pause):
    rm = model("2", paused=pause)
    s, t, moving = _in_phase(phase)
    d, after = drive(rm, s, t + 1, annotations={ABORT_ANNOTATION: "2"}, **moving)
    assert after["rollout"]["phase"] == "RolledBack" and after["rollout"]["failedGate"] == "manual"
    assert after["stableVersion"] == "1" and d.serving.canary_version is None
