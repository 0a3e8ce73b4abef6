"""One model's in-place switch in a reconcile (rollout.strategy inPlace, issue 41): what the
InPlace phase reads from the pods, and carrying out what it asks of them.

- Which pods: the stable track's serving pods exactly as the metrics reader trusts them
  (pod_metrics.serving_targets: Ready, owned through a ReplicaSet by the model's own stable
  Deployment, an address inside --pod-metrics-network); a pod that only carries the labels is
  never loaded into or gated.
- Their repository indexes, read at once, each bounded (triton/repository INDEX_DEADLINE_S): a
  pod that stalls costs this model's reconcile that deadline, never another model's.
- The stable version's server P99: the worst of its pods' Triton summaries (the metrics reader's
  last round); None until one is read, and no load starts without it (rollout/inplace).
- The repository API answers only the model's key (render/serving RESTRICTED_APIS): the operator
  reads it back from the model's key Secret once per process.
- The stager sees a new versions.json when the kubelet syncs the pod: each stable pod is annotated
  with the file's digest (names.ANNOTATION_STAGED_VERSIONS) as the ConfigMap changes, which makes
  the kubelet sync it at once instead of within its periodic sync (a minute).
- Actions run on the model's Executor (controller/inplace_pods, cluster mode: the pods' stager
  fetches and removes files as the ConfigMap's versions.json lists them), kept in ModelMemory
  while the switch lasts; a load's config is the one the pod's Triton has the model loaded with
  (what the pod started with), its version policy replaced.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import Any

from rankops.api.rankingmodel import RankingModel, RankingModelStatus
from rankops.controller import pod_metrics
from rankops.controller.inplace_pods import Executor, PodGates, PodTarget, no_gates
from rankops.controller.kube import ApiError
from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY, HTTP_PORT, METRICS_PORT
from rankops.rollout import inplace
from rankops.rollout.readiness import pod_ready


def observe(kube: Any, memory: Any, rm: RankingModel, status: RankingModelStatus, stable_dep: dict | None,
            snapshot: pod_metrics.Snapshot | None, networks: Sequence[str], now: dt.datetime) -> inplace.Observed:
    """What the InPlace phase steps on: the stable pods' indexes, the gate verdicts on them, the stable P99."""
    meta = rm.metadata
    namespace, model, uid = meta["namespace"], meta["name"], meta.get("uid", "")
    pods = kube.list("Pod", namespace, labels={names.LABEL_MODEL: model})
    # Every pod of the stable track, Ready or not: one that is not Ready may still hold a version
    # (a rollback waits for it; a promotion is not done without it).
    targets, _, _ = pod_metrics.serving_targets(pods, {names.STABLE: stable_dep},
                                                memory.metrics.replica_set_owner(kube, namespace), networks,
                                                ready_only=False)
    by_name = {p["metadata"]["name"]: p for p in pods}
    headers = _key_header(kube, memory, rm)
    switch = status.rollout.in_place if status.rollout else None
    executor = executor_of(memory, uid, model, status.rollout.attempt if status.rollout else None)
    executor.pods = {t.pod: PodTarget(t.pod, by_name[t.pod]["metadata"].get("uid", ""), t.address, HTTP_PORT, None,
                                      METRICS_PORT, headers, serving=pod_ready(by_name[t.pod]))
                     for t in targets if t.track == "stable" and t.pod in by_name}
    # No wait for Triton's latency window: in place the new version takes its pod's share of the
    # production traffic from READY on, so the window never holds the gate's requests alone (70 s
    # lost each gate); the warm run is judged on its own client P99, and the verdict says so.
    executor.gates = PodGates(rm, window_wait_s=0.0)
    executor.load_deadline_s = float(rm.spec.rollout.in_place.load_timeout_seconds)
    verdicts = executor.gate_verdicts(switch.version) if switch else {}
    indexes = executor.read()
    if any(i.key_refused for i in indexes):
        memory.in_place_keys.pop(uid, None)   # the key Secret was made again: read it next time
    return inplace.Observed(now, indexes, verdicts, stable_p99_ms(snapshot))


def execute(memory: Any, rm: RankingModel, record: Any, actions: Sequence[Any], attempt: str | None) -> None:
    """Start what the switch asks (at most one request in flight per pod and version); a switch
    that ended lets its executor go."""
    uid = rm.metadata.get("uid", "")
    if record is None or record.phase in inplace.TERMINAL:
        forget(memory, uid)   # ended: what is left of its actions (files) is the stagers'
        return
    if not actions:
        return
    executor = executor_of(memory, uid, rm.metadata["name"], attempt)
    executor.submit(actions, inplace.Record.from_status(record.to_wire()))


def nudge_stagers(kube: Any, rm: RankingModel, applies: Sequence[dict]) -> None:
    """Annotate each stable pod whose annotation is not the applied versions.json's digest (see the
    module's docstring): a metadata patch, no restart."""
    text = _stable_config_map(rm, applies, "versions.json")
    if text is None:
        return
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    namespace, model = rm.metadata["namespace"], rm.metadata["name"]
    for pod in kube.list("Pod", namespace, labels={names.LABEL_MODEL: model, names.LABEL_TRACK: names.STABLE}):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get(
                names.ANNOTATION_STAGED_VERSIONS) == digest:
            continue
        try:
            kube.merge_patch("Pod", namespace, meta["name"],
                             {"metadata": {"annotations": {names.ANNOTATION_STAGED_VERSIONS: digest}}})
        except ApiError as exc:
            if exc.status != 404:   # gone meanwhile: its replacement starts with the file as it is
                raise


def executor_of(memory: Any, uid: str, model: str, attempt: str | None) -> Executor:
    """The model's executor for this rollout attempt: another attempt's (its verdicts, its requests in
    flight) is let go, so no verdict outlives the attempt it was given in."""
    held = memory.in_place.get(uid)
    if held is not None and held[0] == attempt:
        return held[1]
    forget(memory, uid)
    executor = Executor(model, {}, None, gates=no_gates)
    memory.in_place[uid] = (attempt, executor)
    return executor


def forget(memory: Any, uid: str) -> None:
    """Let the model's executor go (a switch ended, another attempt began, the model was deleted)."""
    held = memory.in_place.pop(uid, None)
    if held is not None:
        held[1].close()


def stable_p99_ms(snapshot: pod_metrics.Snapshot | None) -> float | None:
    """The worst P99 (ms) of the stable version's pods over Triton's last window; None: none read."""
    if snapshot is None:
        return None
    p99s = [c.quantiles_us[0.99] / 1000 for c, _ in snapshot.readings["stable"].values()
            if c.quantiles_us.get(0.99) is not None]
    return max(p99s) if p99s else None


def _stable_config_map(rm: RankingModel, applies: Sequence[dict], key: str) -> str | None:
    """A key of the stable ConfigMap as applied (None: not applied, or no such key)."""
    name = names.config_map_name(rm.metadata["name"], names.STABLE)
    for obj in applies:
        if obj.get("kind") == "ConfigMap" and obj["metadata"]["name"] == name:
            return (obj.get("data") or {}).get(key)
    return None


def _key_header(kube: Any, memory: Any, rm: RankingModel) -> dict[str, str] | None:
    """The model's restricted-API key, as the header its Triton wants (None: not readable yet)."""
    uid = rm.metadata.get("uid", "")
    key = memory.in_place_keys.get(uid)
    if key is None:
        try:
            secret = kube.get("Secret", rm.metadata["namespace"], names.api_key_secret_name(rm.metadata["name"]))
        except ApiError:
            return None
        data = (secret or {}).get("data") or {}
        if API_KEY_SECRET_KEY not in data:
            return None
        key = memory.in_place_keys[uid] = base64.b64decode(data[API_KEY_SECRET_KEY]).decode()
    return {API_KEY_HEADER: key}
