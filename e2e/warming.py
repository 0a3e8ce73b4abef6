"""Watching a model's pods warm: every state seen, and the warm container's own log (e2e helpers)."""
from __future__ import annotations

import datetime
import json
import threading
import time

from e2e.support import wait_for
from rankops.render import names


class PodWatch(threading.Thread):
    """Every state of the model's pods as seen (poll), with the wall time it was seen at."""

    def __init__(self, k8s, namespace: str, model: str):
        super().__init__(daemon=True)
        self.k8s, self.namespace, self.selector = k8s, namespace, f"{names.LABEL_MODEL}={model}"
        self.seen: list[tuple[float, str, bool, dict[str, bool]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            for pod in self.k8s.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items:
                ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
                containers = {s.name: bool(s.ready) for s in pod.status.container_statuses or []}
                self.seen.append((time.time(), pod.metadata.name, ready, containers))

    def first_ready(self, pod: str) -> float:
        return min(t for t, name, ready, _ in self.seen if name == pod and ready)

    def states(self, pod: str) -> list[tuple[float, bool, dict[str, bool]]]:
        return [(t, ready, containers) for t, name, ready, containers in self.seen if name == pod]


def watched_until(warm: dict) -> float:
    """When the warm container's replay ended (its summary's stamp), as a Unix time."""
    return _at(warm["at"])


def _at(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _warm_events(logs_source, namespace: str, pod: str) -> list[dict]:
    """The warm container's JSON lines; `logs_source.pod_logs` is a real cluster's."""
    text = logs_source.pod_logs(namespace, pod).get("warm", "")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def check_warmed_before_ready(watch: PodWatch, logs_source, namespace: str, pod: str, max_p99_ms: float) -> dict:
    """The pod's warm summary, after checking it was Ready only once its warm container replayed."""
    wait_for(lambda: any(ready for _, ready, _ in watch.states(pod)), 30, f"the watch to see {pod} Ready")
    events = _warm_events(logs_source, namespace, pod)
    states = watch.states(pod)
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["start", "waiting"] and "coldPass" in kinds and "round" in kinds, (kinds, states[-8:])
    [warm] = [e for e in events if e["event"] == "warm"]
    assert warm["ready"] == "warm", warm
    assert warm["errors"] == 0 and 0 < warm["p99Ms"] <= max_p99_ms, warm
    assert warm["warmRequests"] > 0 and warm["coldRequests"] == warm["samples"] > 0, warm
    assert len(warm["batchSizes"]) > 1, "the candidate counts production sends"
    rounds = [e for e in events if e["event"] == "round"]
    assert rounds[-1]["withinBound"] and rounds[-1]["server"]["requests"] == rounds[-1]["requests"], rounds[-1]
    # Ready only after the replay: never seen Ready (nor its warm container ready) before it ended.
    warmed_at = _at(warm["at"])
    assert watch.first_ready(pod) >= warmed_at, (warm["at"], states[:5])
    assert not [s for s in states if s[0] < warmed_at and (s[1] or s[2].get("warm"))], states
    # It was seen running and not Ready while it warmed.
    assert any(not ready and "warm" in containers for _, ready, containers in states), states
    return warm
