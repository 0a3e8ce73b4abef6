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
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], tuple[str, str]] = {}   # (namespace, pod) -> (model, node)
        self._tracks: dict[tuple[str, str], str] = {}              # (namespace, pod) -> track, while not going
        self._leaving: dict[str, str] = {}                          # node -> why

    def pod_event(self, pod: dict[str, Any], deleted: bool) -> None:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        node, model = (pod.get("spec") or {}).get("nodeName"), (meta.get("labels") or {}).get(LABEL_MODEL)
        track = (meta.get("labels") or {}).get(LABEL_TRACK)
        with self._lock:
            if deleted or not node or not model:
                self._pods.pop(key, None)
                self._tracks.pop(key, None)
            else:
                self._pods[key] = (model, node)
                if track and not meta.get("deletionTimestamp"):
                    self._tracks[key] = track
                else:
                    self._tracks.pop(key, None)

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
            return {(ns, model) for (ns, _), (model, on) in self._pods.items() if on == name}

    def leaving_nodes(self, namespace: str, model: str) -> frozenset[str]:
        """The leaving nodes this model has pods on."""
        with self._lock:
            return frozenset(node for (ns, _), (m, node) in self._pods.items()
                             if ns == namespace and m == model and node in self._leaving)

    def track_nodes(self, namespace: str, model: str, track: str) -> tuple[tuple[str, int], ...]:
        """(node, pods) of a track's scheduled pods that are not going, by node name."""
        counts: dict[str, int] = {}
        with self._lock:
            for key, (m, node) in self._pods.items():
                if key[0] == namespace and m == model and self._tracks.get(key) == track:
                    counts[node] = counts.get(node, 0) + 1
        return tuple(sorted(counts.items()))

    def clear(self) -> None:
        with self._lock:
            self._tracks.clear()
            self._pods.clear()
            self._leaving.clear()
