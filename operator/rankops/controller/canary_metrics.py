"""Read the serving pods' own Triton metrics during Canary (the shell of rollout/canary_analysis.py).

Each Ready pod of the model that takes traffic is read on its metrics port (8002) by pod IP:
Prometheus is not needed. `networks` limits which pod IPs are read (`rankops run
--pod-metrics-network`): the local test cluster reads only its process nodes' loopback pods, never
kwok's made-up addresses. A pod that does not answer within a second is left out of this reading.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from rankops.controller.kube import Kube
from rankops.triton.metrics import MetricsUnavailable, scrape
from rankops.render import names
from rankops.render.serving import METRICS_PORT

TRACKS = {names.CANARY: "canary", names.STABLE: "stable"}


def readable(address: str | None, networks: Sequence[str]) -> bool:
    if not address:
        return False
    if not networks:
        return True
    ip = ipaddress.ip_address(address)
    return any(ip in ipaddress.ip_network(net, strict=False) for net in networks)


def serving_pods(pods: list[dict[str, Any]], networks: Sequence[str]
                 ) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """track -> (pod name, pod IP) of the Ready pods behind the serving Service, and those of them
    that may not be read (outside `networks`), each as "pod (ip): why" (pure)."""
    found: dict[str, list[tuple[str, str]]] = {"canary": [], "stable": []}
    refused: list[str] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        track = TRACKS.get(labels.get(names.LABEL_TRACK, ""))
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if not (track and ready and labels.get(names.LABEL_TRAFFIC) == "on" and not meta.get("deletionTimestamp")):
            continue
        if readable(status.get("podIP"), networks):
            found[track].append((meta["name"], status["podIP"]))
        else:
            refused.append(f"{meta['name']} ({status.get('podIP') or 'no IP'}): outside the networks the operator "
                           f"may read (rankops run --pod-metrics-network {','.join(networks)})")
    return found, refused


def _scrape_serving(kube: Kube, namespace: str, model: str, networks: Sequence[str]
                    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """track -> pod -> (ModelCounters, when it was read) of the serving pods that answered, and the
    pods that could not be read, each "pod (ip): cause" (refused, timeout, outside the networks, no
    series for the model). One pod list and one scrape per serving pod."""
    import datetime as dt

    pods = kube.list("Pod", namespace, labels={names.LABEL_MODEL: model})
    readings: dict[str, dict[str, Any]] = {"canary": {}, "stable": {}}
    found, problems = serving_pods(pods, networks)
    for track, located in found.items():
        for pod, address in located:
            try:
                counters = scrape(f"{address}:{METRICS_PORT}", model, timeout_s=1.0)
            except MetricsUnavailable as exc:
                problems.append(f"{pod} ({address}): {exc}")
                continue
            if not counters.seen:
                problems.append(f"{pod} ({address}): Triton's metrics have no series for model {model} "
                                "(metrics off for it, or the model is not loaded)")
                continue
            readings[track][pod] = (counters, dt.datetime.now(dt.timezone.utc))
    return readings, problems


def read(kube: Kube, namespace: str, model: str, networks: Sequence[str] = ()
         ) -> tuple[dict[str, dict[str, Any]] | None, tuple[str, ...]]:
    """(track -> pod -> ModelCounters, for the machine's Observed.track_metrics, None without a
    canary reading; the pods that could not be read, for its Observed.metrics_problems)."""
    readings, problems = _scrape_serving(kube, namespace, model, networks)
    counters = {track: {pod: c for pod, (c, _) in pods.items()} for track, pods in readings.items()}
    return (counters if counters["canary"] else None), tuple(problems)


def read_load(kube: Kube, namespace: str, model: str, networks: Sequence[str] = ()
              ) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """spec.autoscaling (mode rankops): each serving pod's request and queue-time counters now,
    {pod: rankops.autoscale.pod_reading} (each at the time it was read), of both tracks, and the
    pods that could not be read ("pod (ip): cause")."""
    from rankops.autoscale import pod_reading

    readings, problems = _scrape_serving(kube, namespace, model, networks)
    return {pod: pod_reading(c.values.get("success", 0.0) + c.values.get("failure", 0.0), c.values.get("queue_us", 0.0),
                             at)
            for pods in readings.values() for pod, (c, at) in pods.items()}, tuple(problems)
