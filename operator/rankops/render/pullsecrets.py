"""Image pull secrets on every pod the operator creates (validators, Triton, gate Jobs).

The chart's `imagePullSecrets` reach the operator as `rankops run --image-pull-secret`; a
private registry that serves the operator image usually serves the operands' images too. A pod
refers to a Secret in its own namespace: model namespaces need a Secret of that name.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable

POD_TEMPLATE_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job")


def with_pull_secrets(objects: Iterable[dict[str, Any]], names: Iterable[str]) -> list[dict[str, Any]]:
    """`objects` with `names` added to each pod template's imagePullSecrets (kept once, in order)."""
    names = list(dict.fromkeys(names))
    out = []
    for obj in objects:
        if names and obj.get("kind") in POD_TEMPLATE_KINDS:
            obj = copy.deepcopy(obj)
            pod = obj["spec"]["template"]["spec"]
            have = [s.get("name") for s in pod.get("imagePullSecrets") or []]
            pod["imagePullSecrets"] = [{"name": n} for n in dict.fromkeys(have + names)]
        out.append(obj)
    return out
