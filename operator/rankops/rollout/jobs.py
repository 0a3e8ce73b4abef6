"""Pure builders of the gate Jobs (warmup, equivalence) a rollout runs against its canary."""
from __future__ import annotations

import posixpath
from typing import Any
from urllib.parse import urlparse

from rankops.api.rankingmodel import LatencyJudge, RankingModel, SamplesSource, TorchscriptReference
from rankops.api.bounds import quantity
from rankops.render import gate_requests, names
from rankops.render.gate_requests import CANDIDATE_COUNTS, SAMPLES_DIR, WARMUP_SAMPLES_PER_BATCH_SIZE  # noqa: F401
from rankops.render.policy import TenantPolicy
from rankops.render.serving import HTTP_PORT, METRICS_PORT, RANKOPS_TMP, fetcher_resources, read_only_root

REFERENCE_DIR = "/reference"
# Generated requests, when no samples ConfigMap is given (render/gate_requests.py). Equivalence
# compares each one as a ranked list: 64 lists steady the mean top-K overlap and rank correlation.
# Every request is held encoded in the gate pod (up to maxBatchSize x maxDims each): keep both small.
EQUIVALENCE_SAMPLES = 64


def _service_url(model: str, namespace: str, track: str, port: int = HTTP_PORT) -> str:
    return f"{names.track_service_name(model, track)}.{namespace}.svc:{port}"


def _batch_sizes(rm: RankingModel) -> list[int]:
    return gate_requests.batch_sizes(rm.spec)


def _samples_args(rm: RankingModel, source: SamplesSource, count: int) -> tuple[list[str], list, list]:
    return gate_requests.samples_args(rm.spec, source, count)


def reference_artifact(spec: Any, uri: str, image: str | None = None) -> tuple[list, list, list]:
    """Volumes, gate mounts and init containers that put the TorchScript reference at
    /reference/model.pt. Like a serving modelUri: fetched with spec.modelCredentialsSecret and the
    spec's fetch bounds, or, for file:// (which the tenant policy has allowed before any rendering,
    policy.spec_problems), the node's file mounted read-only; never a file of the gate pod itself."""
    target = f"{REFERENCE_DIR}/model.pt"
    if uri.startswith("file:"):
        path = "/" + posixpath.normpath(urlparse(uri).path).lstrip("/")
        return ([{"name": "reference", "hostPath": {"path": path, "type": "File"}}],
                [{"name": "reference", "mountPath": target, "readOnly": True}], [])
    fetch = {"name": "fetch-reference", "image": image or spec.rollout.gate_jobs.image,
             "command": ["rankops", "fetch-model", "--uri", uri, "--dest", target, "--max-bytes",
                         str(int(quantity(spec.storage.model_volume_size))), *spec.fetch.args()],
             "terminationMessagePolicy": "FallbackToLogsOnError",
             "resources": fetcher_resources(spec.storage.model_volume_size),
             "volumeMounts": [{"name": "reference", "mountPath": REFERENCE_DIR},
                              {"name": "tmp", "mountPath": "/tmp"}]}
    if spec.model_credentials_secret:
        fetch["envFrom"] = [{"secretRef": {"name": spec.model_credentials_secret}}]
    # The download is capped like the serving pods' (spec.storage.modelVolumeSize).
    return ([{"name": "reference", "emptyDir": {"sizeLimit": spec.storage.model_volume_size}}],
            [{"name": "reference", "mountPath": REFERENCE_DIR}], [fetch])


def gate_command(rm: RankingModel, gate: str, stable_version: str, reference_served: bool,
                 image: str | None = None) -> tuple[list[str], list, list, list]:
    """The `rankops gate ...` command line, plus volumes, mounts and init containers it needs."""
    spec, model, ns = rm.spec, rm.metadata["name"], rm.metadata.get("namespace", "default")
    canary = _service_url(model, ns, names.CANARY)
    if gate == "warmup":
        w = spec.rollout.warmup
        count = gate_requests.warmup_sample_count(spec, w.requests)
        args, volumes, mounts = _samples_args(rm, w.samples, count)
        # Judged on Triton's own P99 (its metrics port); with the response cache on, every request
        # differs, so the gate measures the model and not the cache.
        unique = ["--unique-requests"] if spec.response_cache else []
        judge = ["--judge-on", w.judge_on.value] if w.judge_on != LatencyJudge.server else []
        return (["rankops", "gate", "warmup", "--url", canary, "--model", model,
                 "--metrics-url", _service_url(model, ns, names.CANARY, METRICS_PORT),
                 "--requests", str(w.requests), "--concurrency", str(w.concurrency),
                 "--max-p99-ms", str(w.max_p99_ms), *judge, *unique, *args], volumes, mounts, [])
    e = spec.rollout.equivalence
    args, volumes, mounts = _samples_args(rm, e.samples, EQUIVALENCE_SAMPLES)
    init: list = []
    if isinstance(e.reference, TorchscriptReference):
        reference = ["--reference-torchscript", f"{REFERENCE_DIR}/model.pt"]
        volumes_, mounts_, init_ = reference_artifact(spec, e.reference.torchscript_uri, image)
        volumes += volumes_
        mounts += mounts_
        init += init_
    else:
        track = names.REFERENCE if reference_served else names.STABLE
        reference = ["--reference-url", _service_url(model, ns, track), "--reference-model", model]
    cmd = ["rankops", "gate", "equivalence", *reference, "--candidate-url", canary, "--candidate-model", model,
           "--abs-tolerance", str(e.abs_tolerance), "--rel-tolerance", str(e.rel_tolerance),
           "--top-k", str(e.top_k), "--min-topk-overlap", str(e.min_top_k_overlap),
           "--min-rank-correlation", str(e.min_rank_correlation), *args]
    if e.output:
        cmd += ["--output", e.output]
    return cmd, volumes, mounts, init


def gate_job(rm: RankingModel, gate: str, version: str, attempt: str, stable_version: str,
             reference_served: bool = False, policy: TenantPolicy = TenantPolicy()) -> dict[str, Any]:
    """`policy`: the cluster's gates image, when set, instead of the spec's."""
    model, ns = rm.metadata["name"], rm.metadata.get("namespace", "default")
    jobs = rm.spec.rollout.gate_jobs
    image = policy.gates(rm.spec)
    command, volumes, mounts, init = gate_command(rm, gate, stable_version, reference_served, image)
    gate_spec = rm.spec.rollout.warmup if gate == "warmup" else rm.spec.rollout.equivalence
    labels = {**names.common_labels(model), "app.kubernetes.io/name": names.GATE_APP,
              names.LABEL_GATE: gate, names.LABEL_VERSION: version, names.LABEL_ATTEMPT: attempt}
    # Read-only images: a gate writes only its own sized /tmp (and the termination log).
    restricted = read_only_root({"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                 "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}})
    for c in init:
        c["securityContext"] = restricted
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": names.gate_job_name(model, gate, version, attempt), "namespace": ns,
                     "labels": labels},
        "spec": {
            "backoffLimit": 0,                      # a failing verdict is an answer, not a flake
            "activeDeadlineSeconds": jobs.timeout_seconds,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": labels, "annotations": {**jobs.pod_annotations, **gate_spec.pod_annotations}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    # A gate reads Triton over HTTP, never the Kubernetes API: no token mounted.
                    "automountServiceAccountToken": False,
                    "initContainers": init,
                    "containers": [{
                        "name": "gate", "image": image, "command": command,
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "resources": {"requests": {"cpu": jobs.resources.cpu, "memory": jobs.resources.memory,
                                                   "ephemeral-storage": RANKOPS_TMP},
                                      "limits": {"memory": jobs.resources.memory_limit, "ephemeral-storage": RANKOPS_TMP}},
                        "securityContext": restricted,
                        "volumeMounts": [*mounts, {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [*volumes, {"name": "tmp", "emptyDir": {"sizeLimit": RANKOPS_TMP}}],
                },
            },
        },
    }


def is_gate_job_of(job: dict[str, Any], model: str, uid: str | None, gate: str, version: str, attempt: str) -> bool:
    """True when `job` is this attempt's gate Job: its labels name the model, gate, version and
    attempt, and (given the model's uid) the RankingModel is its controller. Only such a Job's
    verdict may move a rollout; a name is not proof (another Job may hold it)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    want = {names.LABEL_MODEL: model, names.LABEL_GATE: gate, names.LABEL_VERSION: version,
            names.LABEL_ATTEMPT: attempt}
    if any(labels.get(key) != value for key, value in want.items()):
        return False
    return uid is None or any(ref.get("uid") == uid and ref.get("controller")
                              for ref in meta.get("ownerReferences") or [])
