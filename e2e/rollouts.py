"""Rollout helpers for the e2e tests: phases seen while a rollout runs, its Jobs and Deployments."""
from __future__ import annotations

from e2e import models
from e2e.support import gone, wait_for
from rankops.render import names

ROLLOUT_TIMEOUT = 120


def phase(rm: dict) -> str | None:
    return ((rm.get("status") or {}).get("rollout") or {}).get("phase")


def watch_phases(k8s, namespace: str, name: str, version: str, until: set[str],
                 timeout: float = ROLLOUT_TIMEOUT) -> tuple[list[str], dict, set[str]]:
    """Poll the phase of the rollout to `version` until it is in `until`; returns the phases seen,
    in order, the object, and the phases in which a canary pod was behind the serving Service."""
    seen: list[str] = []
    serving: set[str] = set()

    def check():
        # Pods before status: the operator records a phase before it moves traffic, so the phase
        # read after seeing a serving canary pod is the one traffic was switched on in, or later.
        on = canary_serving(k8s, namespace, name)
        rm = models.get(k8s, namespace, name)
        if ((rm.get("status") or {}).get("rollout") or {}).get("version") != version:
            return None
        now = phase(rm)
        if now and (not seen or seen[-1] != now):
            seen.append(now)
        if now and on:
            serving.add(now)
        return rm if now in until else None

    try:
        rm = wait_for(check, timeout, f"rollout of {name} reaching {sorted(until)}", interval=0.2)
    except AssertionError as exc:  # wait_for's timeout
        raise AssertionError(f"{exc}; phases seen {seen}; status {models.get(k8s, namespace, name).get('status')}") from None
    return seen, rm, serving


def canary_serving(k8s, namespace: str, model: str) -> bool:
    """A canary pod behind the serving Service: labelled for traffic, Ready, not going. (A pod of
    the previous rollout's canary finishing its requests after a promotion keeps its label but is
    out of the Service.)"""
    pods = k8s.core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_MODEL}={model},"
                                                                  f"{names.LABEL_TRACK}={names.CANARY}").items
    return any((p.metadata.labels or {}).get(names.LABEL_TRAFFIC) == "on" and p.metadata.deletion_timestamp is None
               and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])) for p in pods)


def gate_jobs(k8s, namespace: str, model: str) -> list:
    return k8s.batch.list_namespaced_job(namespace, label_selector=f"{names.LABEL_MODEL}={model},"
                                                                    "app.kubernetes.io/name=rankops-gate").items


def stable(k8s, namespace: str, model: str):
    return k8s.apps.read_namespaced_deployment(names.deployment_name(model, names.STABLE), namespace)


def canary_gone(k8s, namespace: str, model: str) -> bool:
    return gone(lambda: k8s.apps.read_namespaced_deployment(names.deployment_name(model, names.CANARY), namespace))
