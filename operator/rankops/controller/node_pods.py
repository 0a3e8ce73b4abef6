"""Which RankingModels have pods on which node, from the pod watch, and which nodes look like
they are leaving (rollout/disruption.node_leaving, read broadly: the model's pool may keep its
replicas on failing nodes, which the reconcile decides). A node that starts or stops leaving
wakes the models with pods on it; a reconcile reads its stable pods only while some are on such
a node, so a model at rest costs no request for this."""
from __future__ import annotations

import threading
from typing import Any

from rankops.render.names import LABEL_MODEL, LABEL_TRACK
from rankops.rollout.disruption import node_leaving


class NodePods:
    """Kept by model: a reconcile asks for its own pods only (at N=1000 a scan of every pod, twice
    per reconcile, was O(models x pods))."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], dict[str, tuple[str, str | None]]] = {}   # (namespace, model) -> pod -> (node, track while not going)
        self._model_of: dict[tuple[str, str], str] = {}   # (namespace, pod) -> its model, as last seen
        self._leaving: dict[str, str] = {}                 # node -> why

    def pod_event(self, pod: dict[str, Any], deleted: bool) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        node, model = (pod.get("spec") or {}).get("nodeName"), (meta.get("labels") or {}).get(LABEL_MODEL)
        track = (meta.get("labels") or {}).get(LABEL_TRACK)
        with self._lock:
            before = self._model_of.pop((namespace, name), None)
            if before is not None:
                pods = self._models.get((namespace, before), {})
                pods.pop(name, None)
                if not pods:
                    self._models.pop((namespace, before), None)
            if not deleted and node and model:
                self._model_of[(namespace, name)] = model
                self._models.setdefault((namespace, model), {})[name] = \
                    (node, track if track and not meta.get("deletionTimestamp") else None)

    def node_event(self, node: dict[str, Any], deleted: bool) -> set[tuple[str, str]] | None:
        """The (namespace, model) with pods on this node when whether it is leaving changed; else None."""
        name = node["metadata"]["name"]
        why = None if deleted else node_leaving(node)
        with self._lock:
            before = self._leaving.pop(name, None) if why is None else self._leaving.get(name)
            if why is not None:
                self._leaving[name] = why
            if before == why:
                return None
            return {key for key, pods in self._models.items() if any(on == name for on, _ in pods.values())}

    def leaving_nodes(self, namespace: str, model: str) -> frozenset[str]:
        """The leaving nodes this model has pods on."""
        with self._lock:
            if not self._leaving:
                return frozenset()
            return frozenset(node for node, _ in self._models.get((namespace, model), {}).values()
                             if node in self._leaving)

    def track_nodes(self, namespace: str, model: str, track: str) -> tuple[tuple[str, int], ...]:
        """(node, pods) of a track's scheduled pods that are not going, by node name."""
        counts: dict[str, int] = {}
        with self._lock:
            for node, pod_track in self._models.get((namespace, model), {}).values():
                if pod_track == track:
                    counts[node] = counts.get(node, 0) + 1
        return tuple(sorted(counts.items()))

    def clear(self) -> None:
        with self._lock:
            self._models.clear()
            self._model_of.clear()
            self._leaving.clear()
