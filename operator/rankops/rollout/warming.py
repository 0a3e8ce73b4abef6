"""Which pods a model's warm containers keep out of service because the model fails its requests.

A pod's `warm` container (gates/warm.py) exits 1 when its rounds fail more than
spec.warmReplicas.maxErrorRatio of their requests, its reason in the termination message; the
kubelet restarts it with its back-off, so the pod stays un-Ready. These pure functions read that
back from the pods the controller listed, for the model's Degraded condition (WarmupFailing) and
its Event: without them the reason was only in a container log.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

from rankops.rollout.readiness import pod_ready

WARM_CONTAINER = "warm"
WARMUP_FAILING = "WarmupFailing"   # gates.warm's reason (not imported: it brings the client and numpy)
SHOWN = 3    # pods named in the message; the rest are counted


def _failing_message(terminated: dict[str, Any] | None) -> str | None:
    """The warm container's own message when it exited on failing requests (else None)."""
    text = (terminated or {}).get("message") or ""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("reason") != WARMUP_FAILING:
        return None
    return str(data.get("message") or "its warm requests failed")


def warm_failure(pod: dict[str, Any]) -> str | None:
    """Why this pod is un-Ready because its model fails the warm requests: "pod NAME: 75% of 600
    warm requests failed ...", with the restarts; None for a Ready pod, one being deleted, or one
    whose warm container has not exited on failures (it is still waiting or warming)."""
    meta = pod.get("metadata") or {}
    if pod_ready(pod) or meta.get("deletionTimestamp"):
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != WARM_CONTAINER or cs.get("ready"):
            continue
        state = cs.get("state") or {}
        # Exited just now, or restarted since (warming again, or in the kubelet's back-off).
        message = _failing_message(state.get("terminated")) or _failing_message((cs.get("lastState") or {}).get("terminated"))
        if message is None:
            return None
        restarts = cs.get("restartCount") or 0
        waiting = (state.get("waiting") or {}).get("reason")
        after = f" (warm container restarted {restarts}x" + (f", {waiting}" if waiting else "") + ")" if restarts else ""
        return f"pod {meta.get('name', '?')}: {message}{after}"
    return None


def warm_failures(pods: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """`warm_failure` of each pod that has one, by pod name."""
    found = (((p.get("metadata") or {}).get("name", ""), warm_failure(p)) for p in pods)
    return tuple(message for _, message in sorted(f for f in found if f[1]))


def describe(failures: tuple[str, ...]) -> str:
    """Degraded's message: the first pods' reasons, the others counted."""
    shown = "; ".join(failures[:SHOWN])
    more = f"; and {len(failures) - SHOWN} more pod(s)" if len(failures) > SHOWN else ""
    return (f"{shown}{more}: the model fails its warm-up requests, so these pods stay un-Ready "
            "(spec.warmReplicas.maxErrorRatio)")


# How long the stable Deployment is un-Available before its pods are listed too: a pod warms in
# seconds, and failing needs 3 rounds; a new model's first reconciles need no extra request.
UNAVAILABLE_FOR_S = 15.0


def reads_all_pods(deployment: dict[str, Any] | None, now: dt.datetime) -> bool:
    """Whether a reconcile lists the model's pods besides the canary's (one request): only while
    the stable Deployment has said Available=False for UNAVAILABLE_FOR_S, where a warm container
    may be what holds it back."""
    status = (deployment or {}).get("status") or {}
    if not deployment or status.get("readyReplicas", 0) >= (deployment.get("spec") or {}).get("replicas", 1):
        return False
    available = next((c for c in status.get("conditions") or [] if c.get("type") == "Available"), None)
    if not available or available.get("status") != "False":
        return False
    try:
        since = dt.datetime.fromisoformat(available.get("lastTransitionTime", "").replace("Z", "+00:00"))
    except ValueError:
        return True    # cannot tell since when: read them
    return (now - since).total_seconds() >= UNAVAILABLE_FOR_S
