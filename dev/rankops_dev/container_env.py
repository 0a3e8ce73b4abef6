"""A container's environment as the kubelet gives it (test harness, pure): envFrom, then env with
`$(VAR)` expansion, downward-API fieldRefs and Secret / ConfigMap keys. The real-Triton fixture
(`triton.TritonServer.for_rendered`) starts a rendered Deployment's Triton container with it, so
the arguments it expands are the ones a node would run.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class ContainerConfigError(ValueError):
    """A container the kubelet would refuse (CreateContainerConfigError); the message says why."""

    reason = "CreateContainerConfigError"


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, unknown ones kept, $$ is a $."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _VAR.sub(replace, value)


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str, node_name: str) -> str:
    """A downward-API fieldRef of the pod."""
    meta = pod.get("metadata", {})
    simple = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": node_name,
              "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", "default"),
              "status.podIP": pod_ip, "status.hostIP": pod_ip}
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise ContainerConfigError(f"fieldRef {path!r} is not supported here")


def container_env(container: Mapping[str, Any], pod: Mapping[str, Any], base: Mapping[str, str],
                  config_maps: Mapping[str, Mapping[str, str]], secrets: Mapping[str, Mapping[str, str]],
                  pod_ip: str, node_name: str) -> dict[str, str]:
    """`base` (the image's and the pod's defaults), then envFrom, then env, in the kubelet's order.

    `config_maps` / `secrets`: name -> data (decoded). A missing required source is a
    CreateContainerConfigError, as on a real node.
    """
    env = dict(base)
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef") or source.get("configMapRef")
        store, kind = (secrets, "secret") if "secretRef" in source else (config_maps, "configmap")
        data = store.get(ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(f'{kind} "{ref["name"]}" not found')
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        if "valueFrom" not in item:
            env[item["name"]] = expand(item.get("value", ""), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, node_name)
            continue
        ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
        if ref is None:
            raise ContainerConfigError(
            f"env {item['name']}: only value, fieldRef, secretKeyRef and configMapKeyRef are supported")
        store, kind = (secrets, "secret") if "secretKeyRef" in source else (config_maps, "configmap")
        data = store.get(ref["name"])
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                continue
            missing = f'{kind} "{ref["name"]}" not found' if data is None else \
                f"couldn't find key {ref['key']} in {kind} {ref['name']}"
            raise ContainerConfigError(missing)
        env[item["name"]] = data[ref["key"]]
    return env
