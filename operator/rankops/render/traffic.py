"""Exact canary weights through Gateway API HTTPRoute or an OpenShift Route (pure builders).

In the default `replicas` mode no object is needed: the serving Service spreads requests over
the Ready pods that carry traffic=on, so the weight follows the pod ratio.
"""
from __future__ import annotations

from typing import Any

from rankops.api.rankingmodel import RankingModel, TrafficMode
from rankops.render import names
from rankops.render.desired import ServingState
from rankops.render.serving import HTTP_PORT


def weights(weight: int, canary_version: str | None, canary_traffic: bool) -> tuple[int, int]:
    canary = weight if canary_version and canary_traffic else 0
    return 100 - canary, canary


def traffic_objects(rm: RankingModel, state: ServingState) -> list[dict[str, Any]]:
    """The route objects of the traffic mode, at the weight of the canary step being held."""
    canary_cfg = rm.spec.rollout.canary
    model, ns = rm.metadata["name"], rm.metadata.get("namespace", "default")
    canary_version = state.canary_version
    stable_w, canary_w = weights(state.canary_weight or canary_cfg.weight, canary_version, state.canary_traffic)
    stable_svc = names.track_service_name(model, names.STABLE)
    canary_svc = names.track_service_name(model, names.CANARY)
    labels = names.common_labels(model)
    if canary_cfg.traffic is TrafficMode.gateway_api:
        parent = canary_cfg.parent_ref or "rankops-gateway"
        parent_ns, _, parent_name = parent.rpartition("/")
        parent_ref = {"name": parent_name, **({"namespace": parent_ns} if parent_ns else {})}
        backends = [{"name": stable_svc, "port": HTTP_PORT, "weight": stable_w}]
        if canary_version:
            backends.append({"name": canary_svc, "port": HTTP_PORT, "weight": canary_w})
        return [{
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": model, "namespace": ns, "labels": labels},
            "spec": {"parentRefs": [parent_ref], "rules": [{"backendRefs": backends}]},
        }]
    if canary_cfg.traffic is TrafficMode.openshift_route:
        route_spec: dict[str, Any] = {
            "to": {"kind": "Service", "name": stable_svc, "weight": stable_w},
            "port": {"targetPort": "http"},
        }
        if canary_version:
            route_spec["alternateBackends"] = [{"kind": "Service", "name": canary_svc, "weight": canary_w}]
        return [{
            "apiVersion": "route.openshift.io/v1", "kind": "Route",
            "metadata": {"name": model, "namespace": ns, "labels": labels},
            "spec": route_spec,
        }]
    return []
