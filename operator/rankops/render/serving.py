"""Pure builders of the Kubernetes objects that serve one track (stable or canary) of a model."""
from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from rankops.api.gpunodepool import LatencyTuning
from rankops.api.rankingmodel import Disruption, ModelVersion, NodeSpread, RankingModelSpec
from rankops.render import isolation, names
from rankops.render.policy import TenantPolicy
from rankops.render.tritonconfig import MODEL_FILENAMES, TRT_ENGINE_CACHE, triton_version
from rankops.render.warm import warm_container
from rankops.triton import image_fit, repository
from rankops.nodelabels import LABEL_LATENCY_TUNED, LABEL_POOL, LABEL_READY, LABEL_TOPOLOGY_ALIGNED, label_value

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_REPOSITORY = "/models"
TRITON_UID = 1000  # the triton-server user of NVIDIA's images
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
HOSTNAME_KEY, ZONE_KEY = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
# Taints the node lifecycle controller puts on a node it has lost (NoExecute: bound pods go).
NODE_LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
# The cluster autoscaler keeps a node holding pods with emptyDir volumes unless told they may go:
# the model repository is refetched anywhere, and the PodDisruptionBudget is what guards capacity.
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# Triton's APIs that change the server rather than ask it (load/unload a model, where it logs or
# traces, shared-memory regions) answer only requests carrying this header (gRPC: metadata key)
# with the model's key. The operator creates the key's Secret (one per model, random) before any
# pod needs it; only rankops' own components are meant to read it. Dynamic loading can lead to
# code execution (Triton's secure-deployment guide): no other pod may load or unload.
RESTRICTED_APIS = ("model-repository", "logging", "trace", "shared-memory")
API_KEY_HEADER = repository.API_KEY_HEADER
API_KEY_ENV = "RANKOPS_TRITON_API_KEY"
API_KEY_SECRET_KEY = "api-key"
TMP_DIR = "/tmp"
# What a rankops container (fetch-model, warm, gates) may write: its own /tmp, never its image.
RANKOPS_TMP = "256Mi"
# rollout.strategy inPlace: the stager reads the versions its pod must hold from the track's
# ConfigMap mounted as a directory, never by subPath: the kubelet brings a directory mount's
# changes into the running pod, a subPath mount never sees them.
VERSIONS_KEY = "versions.json"
VERSIONS_DIR = "/etc/rankops/versions"
# The `stage` sidecar idles between rounds and runs the strict fetcher while a version comes
# (streamed in 1 MiB chunks; a listing is held whole, bounded by --max-listing-bytes). No CPU
# limit, so a fetch uses what is spare; with latencyIsolation (render.isolation) the request
# becomes its limit and it stays off Triton's pinned cores.
STAGE_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": RANKOPS_TMP},
                   "limits": {"memory": "512Mi", "ephemeral-storage": RANKOPS_TMP}}


def restricted_api_args() -> list[str]:
    """Triton's arguments that put RESTRICTED_APIS behind the key ($(VAR) is expanded by the kubelet
    from the container's environment, so the key is in no object but its Secret)."""
    apis, key = ",".join(RESTRICTED_APIS), f"{API_KEY_HEADER}=$({API_KEY_ENV})"
    return [f"--http-restricted-api={apis}:{key}", f"--grpc-restricted-protocol={apis}:{key}"]


def triton_arguments(load_models: Sequence[str], exit_timeout_seconds: int, response_cache: bool) -> list[str]:
    """tritonserver's arguments: explicit model control, `load_models` loaded at start (a shared server
    (render/shared_server.py) starts with none and loads its members through the repository API)."""
    args = [
        f"--model-repository={MODEL_REPOSITORY}", "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in load_models),
        # The config is the rendered one, complete: never let Triton fill in or alter it.
        "--disable-auto-complete-config", "--exit-on-error=true",
        f"--http-port={HTTP_PORT}", f"--grpc-port={GRPC_PORT}", f"--metrics-port={METRICS_PORT}",
        # Latency summaries (off by default) give nv_inference_request_summary_us{quantile="0.99"},
        # the P99 the chart's RankopsP99OverSlo alert holds against the SLO (Triton leaves that
        # summary out for models with the response cache on).
        "--metrics-config=summary_latencies=true",
        # On SIGTERM Triton stops taking requests and finishes those in flight, up to this long.
        f"--exit-timeout-secs={exit_timeout_seconds}",
        *restricted_api_args(),
    ]
    if response_cache:
        args.append("--cache-config=local,size=268435456")
    return args


def api_key_env(model: str) -> dict[str, Any]:
    return {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": names.api_key_secret_name(model), "key": API_KEY_SECRET_KEY}}}


def api_key_secret(model: str, namespace: str, key: str) -> dict[str, Any]:
    """The model's restricted-API key Secret (`key`: random, made once by the operator's shell)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": names.api_key_secret_name(model), "namespace": namespace,
                         "labels": names.common_labels(model)},
            "stringData": {API_KEY_SECRET_KEY: key}}


def quantity_bytes(quantity: str) -> int:
    from rankops.api import bounds
    return int(bounds.quantity(quantity))


def sum_quantities(*quantities: str) -> str:
    """Kubernetes quantities added, rounded up to a whole Mi (the sizes a spec gives are binary or
    decimal bytes), in the API server's canonical spelling (12288Mi is stored as 12Gi): spelled
    otherwise, the stored Deployment never matches what is applied, and each reconcile patches it."""
    from rankops.api import bounds
    return canonical_binary(-(-sum(bounds.quantity(q) for q in quantities) // 2 ** 20) * 2 ** 20)


def canonical_binary(size: int) -> str:
    """A whole number of Ki as the API server writes a binary quantity: the largest suffix that
    divides it (2048Mi -> 2Gi, 2304Mi stays)."""
    if size == 0:
        return "0"
    suffixes, value = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), size // 1024
    index = 0
    while value % 1024 == 0 and index < len(suffixes) - 1:
        value, index = value // 1024, index + 1
    return f"{value}{suffixes[index]}"


def fetcher_resources(volume_size: str) -> dict[str, Any]:
    """A fetch-model container's: the download lands in a volume of `volume_size` plus its own /tmp."""
    disk = sum_quantities(volume_size, RANKOPS_TMP)
    return {"requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": disk},
            "limits": {"memory": "2Gi", "ephemeral-storage": disk}}


def read_only_root(security_context: dict[str, Any]) -> dict[str, Any]:
    return {**security_context, "readOnlyRootFilesystem": True}


def config_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()[:16]


def config_map(model: str, namespace: str, track: str, version: str, config_text: str,
               versions_json: str | None = None) -> dict[str, Any]:
    """`versions_json`: what a track switching versions in place keeps on its pods' volume."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": names.config_map_name(model, track), "namespace": namespace,
            "labels": {**names.common_labels(model), names.LABEL_TRACK: track, names.LABEL_VERSION: version},
        },
        "data": {"config.pbtxt": config_text, **({VERSIONS_KEY: versions_json} if versions_json is not None else {})},
    }


def _artifact_mount(model: str, version: ModelVersion, fetcher_image: str,
                    credentials_secret: str | None, policy: TenantPolicy,
                    fetch_args: list[str] | None = None, volume_size: str = "10Gi") -> tuple[list, list, list]:
    """Volumes, init containers and Triton mounts that put the artifact in the model repository.
    A file:// URI mounts the node's directory only where `policy` allows it (PolicyError if not)."""
    version_dir = f"{MODEL_REPOSITORY}/{model}/{triton_version(version.name)}"
    uri = urlparse(version.model_uri)
    if uri.scheme == "pvc":
        # Mounted straight from the claim: no copy, read-only.
        volume = {"name": "artifact", "persistentVolumeClaim": {"claimName": uri.netloc, "readOnly": True}}
        mount = {"name": "artifact", "mountPath": version_dir, "readOnly": True}
        if uri.path.strip("/"):
            mount["subPath"] = uri.path.strip("/")
        return [volume], [], [mount]
    if uri.scheme == "file":
        volume = {"name": "artifact", "hostPath": {"path": policy.host_path(version.model_uri), "type": "Directory"}}
        return [volume], [], [{"name": "artifact", "mountPath": version_dir, "readOnly": True}]
    fetch = {
        "name": "fetch-model",
        "image": fetcher_image,
        "command": ["rankops", "fetch-model", "--uri", version.model_uri, "--dest", version_dir,
                    "--expect", MODEL_FILENAMES[version.format],
                    # The digest covers the file --expect names (RankingModel: spec.versions[].sha256).
                    *(["--sha256", version.sha256] if version.sha256 else []),
                    # Over the volume's size it stops with its own line, before the kubelet evicts the pod.
                    "--max-bytes", str(quantity_bytes(volume_size)), *(fetch_args or [])],
        # Its one-line error (missing object, bad credentials, truncated download) lands in the
        # pod's status, not only in a log.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "model-repository", "mountPath": MODEL_REPOSITORY},
                         {"name": "fetch-tmp", "mountPath": TMP_DIR}],
        # The download lands in the model volume (its sizeLimit is spec.storage.modelVolumeSize):
        # requested so the pod goes where the disk is free, limited so a growing one is stopped.
        "resources": fetcher_resources(volume_size),
        "securityContext": read_only_root(restricted_container()),
    }
    if credentials_secret:
        fetch["envFrom"] = [{"secretRef": {"name": credentials_secret}}]
    return [{"name": "fetch-tmp", "emptyDir": {"sizeLimit": RANKOPS_TMP}}], [fetch], []


def stage_command(model: str, version: ModelVersion, fetch_args: list[str], volume_size: str,
                  once: bool) -> list[str]:
    """`rankops stage-versions` over the model's directory and the ConfigMap's versions.json. It
    names no version, so the pod template stays the same through an in-place switch; --expect is
    the file of `version`'s format, which every version held in place shares."""
    return ["rankops", "stage-versions", *(["--once"] if once else []),
            "--model", model, "--model-dir", f"{MODEL_REPOSITORY}/{model}",
            "--versions-file", f"{VERSIONS_DIR}/{VERSIONS_KEY}", "--expect", MODEL_FILENAMES[version.format],
            # A version over the volume's size stops with its own line, before the kubelet evicts the pod.
            "--max-bytes", str(quantity_bytes(volume_size)), *fetch_args]


def _staging(model: str, version: ModelVersion, fetcher_image: str, credentials_secret: str | None,
             fetch_args: list[str], volume_size: str) -> tuple[list, list, list]:
    """Volumes, init containers and sidecars that keep the model's directory holding the versions
    the ConfigMap's versions.json lists (fetcher/stager.py), for a track that switches in place.
    The init container runs one round: the list's first version, the serving one, is on the volume
    before Triton starts, and a failed fetch fails it as fetch-model's does. The sidecar runs the
    rounds after: a version the operator lists arrives without a restart."""
    def container(name: str, once: bool, resources: dict[str, Any]) -> dict[str, Any]:
        stage = {
            "name": name,
            "image": fetcher_image,
            "command": stage_command(model, version, fetch_args, volume_size, once),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [{"name": "model-repository", "mountPath": MODEL_REPOSITORY},
                             {"name": "config", "mountPath": VERSIONS_DIR, "readOnly": True},
                             {"name": "fetch-tmp", "mountPath": TMP_DIR}],
            "resources": resources,
            "securityContext": read_only_root(restricted_container()),
        }
        if credentials_secret:
            stage["envFrom"] = [{"secretRef": {"name": credentials_secret}}]
        return stage

    return ([{"name": "fetch-tmp", "emptyDir": {"sizeLimit": RANKOPS_TMP}}],
            [container("stage-versions", True, fetcher_resources(volume_size))],
            [container("stage", False, copy.deepcopy(STAGE_RESOURCES))])


def triton_user(policy: TenantPolicy, fs_group: bool = False) -> dict[str, Any]:
    """NVIDIA's images run as root unless told: the triton-server user (1000), and its group for
    the volumes; none where the platform assigns them (OpenShift restricted-v2 refuses 1000)."""
    if policy.platform_assigns_uids:
        return {}
    return {"runAsUser": TRITON_UID, **({"fsGroup": TRITON_UID} if fs_group else {})}


def restricted_container() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def pool_placement(pool_name: str | None, pool_requirements: Any | None,
                   triton_image: str | None = None) -> dict[str, Any]:
    """nodeSelector, affinity and tolerations that keep pods on the pool's validated GPU nodes,
    and with `triton_image` on those whose validated driver runs that Triton release (nodes
    outside a pool carry no validated driver label, so there is nothing to select on)."""
    placement: dict[str, Any] = {"tolerations": [
        # The common taint of GPU node groups; never the rankops unvalidated taint.
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]}
    # Never onto a node whose driver the GPU Operator is upgrading (its GPU pods are about to be
    # deleted, or its new driver is not validated yet); a node without the label matches.
    not_upgrading = {"key": names.LABEL_DRIVER_UPGRADE_STATE, "operator": "NotIn",
                     "values": list(names.DRIVER_UPGRADE_LEAVING_STATES)}
    if not pool_name:
        placement["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [not_upgrading]}]}}}
        return placement
    # The validator writes the pool label as a label value (63 chars at most): select the same.
    placement["nodeSelector"] = {LABEL_POOL: label_value(pool_name), LABEL_READY: "true"}
    if getattr(pool_requirements, "latency_tuning", None) is LatencyTuning.require:
        # The pool's nodes that its validator found tuned and able to pin CPUs on the GPU's NUMA node.
        placement["nodeSelector"].update({LABEL_LATENCY_TUNED: "true", LABEL_TOPOLOGY_ALIGNED: "true"})
    terms = [not_upgrading]
    products = getattr(pool_requirements, "gpu_products", None) if pool_requirements else None
    if products:
        terms.append({"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(products)})
    min_mem = getattr(pool_requirements, "min_gpu_memory_mib", None) if pool_requirements else None
    if min_mem:
        terms.append({"key": GPU_MEMORY_LABEL, "operator": "Gt", "values": [str(int(min_mem) - 1)]})
    # nodeSelectorTerms are ORed and their expressions ANDed: each way the driver may run the image
    # becomes one term that also carries the pool's own expressions.
    ways = image_fit.driver_affinity(triton_image) if triton_image else None
    selector_terms = [{"matchExpressions": copy.deepcopy(terms) + way} for way in ways] if ways else \
        [{"matchExpressions": terms}]
    placement["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": selector_terms}}}
    return placement


def node_loss_tolerations(seconds: int) -> list[dict[str, Any]]:
    """Replace the API server's default 300 s tolerations (DefaultTolerationSeconds): a replica on a
    lost node is evicted, and replaced elsewhere, `seconds` after the node is marked."""
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in NODE_LOST_TAINTS]


def topology_spread(model: str, track: str, node_spread: NodeSpread) -> list[dict[str, Any]]:
    """One track's replicas over nodes and zones, counted per ReplicaSet (pod-template-hash) so
    that the old pods of a rolling update do not skew where the new ones go; tainted and cordoned
    nodes the pods do not tolerate are no domain (nodeTaintsPolicy), so a drained node does not
    hold the others to its count. Zones are only preferred: most pools are in one, or unlabelled."""
    def spread(key: str, when: str) -> dict[str, Any]:
        return {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": when,
                "labelSelector": {"matchLabels": names.track_selector(model, track)},
                "matchLabelKeys": ["pod-template-hash"], "nodeTaintsPolicy": "Honor"}

    host = "DoNotSchedule" if node_spread is NodeSpread.required else "ScheduleAnyway"
    return [spread(HOSTNAME_KEY, host), spread(ZONE_KEY, "ScheduleAnyway")]


def disruption_budget(model: str, namespace: str, track: str, min_available: int) -> dict[str, Any]:
    """A track's PodDisruptionBudget: evictions (drains, autoscaler scale-down) leave at least
    `min_available` Ready pods. An absolute count, not maxUnavailable: a surge pod beside the
    replicas adds to what may go. Pods that are not Ready may always be evicted, so a broken
    replica never blocks a drain."""
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": names.disruption_budget_name(model, track), "namespace": namespace,
                     "labels": {**names.common_labels(model), names.LABEL_TRACK: track}},
        "spec": {"minAvailable": min_available,
                 "selector": {"matchLabels": names.track_selector(model, track)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def stable_min_available(replicas: int, failure_tolerance: int, serving: int) -> int:
    """Of the model's `replicas`, `failure_tolerance` may go; never more than the stable track's
    `serving` pods (fewer while a canary holds some of its GPUs). With a tolerance of 0 a drain
    waits until another pod stands in."""
    return min(serving, max(0, replicas - failure_tolerance))


def pre_stop(disruption: Disruption) -> dict[str, Any]:
    """Sleep while the endpoint is removed: Triton gets its stop signal only after that.
    exec, not the sleep action (1.30+): NVIDIA's images are Ubuntu, with /bin/sleep."""
    if not disruption.pre_stop_delay_seconds:
        return {}
    return {"lifecycle": {"preStop": {"exec": {"command": ["/bin/sleep", str(disruption.pre_stop_delay_seconds)]}}}}


def triton_probes(startup_s: int) -> dict[str, Any]:
    """Triton's readiness, liveness and startup probes on its HTTP port; `startup_s`: how long it may
    take to become ready (checked every 10 s)."""
    probe = lambda path, **kw: {"httpGet": {"path": path, "port": "http"}, **kw}  # noqa: E731
    return {"readinessProbe": probe("/v2/health/ready", periodSeconds=5, failureThreshold=3),
            "livenessProbe": probe("/v2/health/live", periodSeconds=10, failureThreshold=6),
            "startupProbe": probe("/v2/health/ready", periodSeconds=10, failureThreshold=startup_s // 10)}


def startup_seconds(version: ModelVersion) -> int:
    # ONNX with the TensorRT accelerator builds engines at load: give it far longer to start.
    return 1800 if version.format.value == "onnx" and version.precision.value != "fp32" else 600


def deployment(model: str, namespace: str, spec: RankingModelSpec, track: str, version: ModelVersion,
               replicas: int, config_text: str, traffic_on: bool, placement: dict[str, Any],
               covered_by: int = 0, policy: TenantPolicy = TenantPolicy(),
               in_place_config: str | None = None, started_for: str | None = None) -> dict[str, Any]:
    """`covered_by`: serving pods of another track that stand in while this one rolls (a canary
    taking traffic during promotion), so the rollout frees a GPU before it needs one. `policy`:
    what the cluster admin lets a tenant's spec mount (file:// directories).

    `in_place_config`: the track switches versions in place (rollout.strategy inPlace), and this is
    its version-free config (tritonconfig.version_free_config). The pod template then names no
    version: the pods roll on that text's hash, stage their versions from the ConfigMap's
    versions.json, and the version label is the Deployment's own (changing it restarts nothing)."""
    in_place = in_place_config is not None
    labels = {**names.common_labels(model), names.LABEL_TRACK: track}
    pod_labels = {**labels, **({} if in_place else {names.LABEL_VERSION: version.name}),
                  names.LABEL_TRAFFIC: "on" if traffic_on else "off"}
    deployment_labels = {**labels, names.LABEL_VERSION: version.name} if in_place else labels
    sidecars: list[dict[str, Any]] = []
    if in_place:
        artifact_mounts: list[dict[str, Any]] = []
        volumes, init_containers, sidecars = _staging(
            model, version, policy.fetcher(spec), spec.model_credentials_secret, spec.fetch.args(),
            spec.storage.model_volume_size)
    else:
        volumes, init_containers, artifact_mounts = _artifact_mount(
            model, version, policy.fetcher(spec), spec.model_credentials_secret, policy, spec.fetch.args(),
            spec.storage.model_volume_size)
    gpus = str(spec.gpus_per_replica)
    args = triton_arguments([model], spec.disruption.exit_timeout_seconds, spec.response_cache)
    disk = sum_quantities(spec.storage.model_volume_size, spec.storage.tmp_size)
    triton = {
        "name": "triton",
        "image": spec.triton_image,
        "command": ["tritonserver"],
        "args": args,
        "env": [api_key_env(model)],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT}, {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # In place too: every version held shares the serving one's format and precision, so its start.
        **triton_probes(startup_seconds(version)),
        # requests == limits: Guaranteed QoS, so the kubelet's CPU and topology managers can pin
        # Triton to the GPU's NUMA node (where the node enables them).
        # ephemeral-storage: the pod's emptyDirs count against its containers' limits together; Triton
        # reads the model volume and writes /tmp, so both are its to hold.
        "resources": {
            "requests": {"cpu": spec.resources.cpu, "memory": spec.resources.memory, "nvidia.com/gpu": gpus,
                         "ephemeral-storage": disk},
            "limits": {"cpu": spec.resources.cpu, "memory": spec.resources.memory, "nvidia.com/gpu": gpus,
                       "ephemeral-storage": disk},
        },
        "volumeMounts": [
            {"name": "model-repository", "mountPath": MODEL_REPOSITORY},
            {"name": "config", "mountPath": f"{MODEL_REPOSITORY}/{model}/config.pbtxt", "subPath": "config.pbtxt",
             "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": TMP_DIR},
            *artifact_mounts,
        ],
        # Triton writes only its volumes: /tmp (TensorRT's engine cache too), /dev/shm, the model repository.
        "securityContext": read_only_root({**restricted_container(), **triton_user(policy)}),
        **pre_stop(spec.disruption),
    }
    containers, warm_volumes = [triton], []
    if spec.warm_replicas.enabled:
        warm, warm_volumes = warm_container(model, spec, HTTP_PORT, METRICS_PORT,
                                            read_only_root(restricted_container()), policy.fetcher(spec), RANKOPS_TMP)
        containers.append(warm)
    containers += sidecars
    rendered = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": names.deployment_name(model, track), "namespace": namespace, "labels": deployment_labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": names.track_selector(model, track)},
            # Never go below the serving capacity: surge one pod, or (when another track's pods
            # cover) replace in place, since spare GPUs are rare.
            "strategy": {"type": "RollingUpdate", "rollingUpdate":
                         {"maxUnavailable": covered_by, "maxSurge": 0} if covered_by else
                         {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {SAFE_TO_EVICT: "true", **spec.pod_annotations,
                                    names.ANNOTATION_CONFIG_HASH: config_hash(
                                        in_place_config if in_place else config_text),
                                    **({names.ANNOTATION_STARTED_FOR: started_for or version.name}
                                       if in_place else {})},
                },
                "spec": {
                    **placement,
                    "tolerations": [*placement.get("tolerations", []),
                                    *node_loss_tolerations(spec.disruption.unreachable_toleration_seconds)],
                    "topologySpreadConstraints": topology_spread(model, track, spec.disruption.node_spread),
                    **({"priorityClassName": spec.disruption.priority_class_name}
                       if spec.disruption.priority_class_name else {}),
                    "securityContext": {"runAsNonRoot": True, **triton_user(policy, fs_group=True),
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    # Nothing in the pod talks to the Kubernetes API: no ServiceAccount token to steal.
                    "automountServiceAccountToken": False,
                    # Covers the preStop delay and Triton's exit timeout.
                    "terminationGracePeriodSeconds": spec.disruption.grace_period_seconds(),
                    "initContainers": init_containers,
                    "containers": containers,
                    "volumes": [
                        {"name": "model-repository", "emptyDir": {"sizeLimit": spec.storage.model_volume_size}},
                        {"name": "config", "configMap": {"name": names.config_map_name(model, track)}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": spec.storage.tmp_size}},
                        *volumes,
                        *warm_volumes,
                    ],
                },
            },
        },
    }
    # Guaranteed in every container, so the kubelet can pin Triton (render.isolation).
    return isolation.pinned(rendered, spec, version) if spec.latency_isolation else rendered


def _ports() -> list[dict[str, Any]]:
    return [
        {"name": "http", "port": HTTP_PORT, "targetPort": "http"},
        {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
    ]


def service(model: str, namespace: str, name: str, selector: dict[str, str], track: str | None) -> dict[str, Any]:
    labels = names.common_labels(model)
    if track:
        labels[names.LABEL_TRACK] = track
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": selector, "ports": _ports()},
    }


def serving_service(model: str, namespace: str) -> dict[str, Any]:
    return service(model, namespace, names.serving_service_name(model),
                   {names.LABEL_MODEL: model, names.LABEL_TRAFFIC: "on"}, None)


def track_service(model: str, namespace: str, track: str) -> dict[str, Any]:
    return service(model, namespace, names.track_service_name(model, track),
                   names.track_selector(model, track), track)


def policy_peer(peer: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if peer.pod_selector is not None:
        out["podSelector"] = {"matchLabels": dict(peer.pod_selector)} if peer.pod_selector else {}
    if peer.namespace_selector is not None:
        out["namespaceSelector"] = {"matchLabels": dict(peer.namespace_selector)} if peer.namespace_selector else {}
    return out


def network_policy(model: str, namespace: str, spec: RankingModelSpec, operator_namespace: str) -> dict[str, Any]:
    """spec.networkPolicy: ingress to the model's Triton pods (all tracks) only from the model's own
    pods (gates; the warm container reaches its Triton through the pod's address), its clients on
    the inference ports, and the operator (and metricsClients) on the metrics port; with
    rollout.strategy inPlace, the operator on the HTTP port too. The kubelet's
    probes come from the node, which NetworkPolicies do not block."""
    wanted = spec.network_policy
    port = lambda number: {"protocol": "TCP", "port": number}  # noqa: E731
    inference = [port(HTTP_PORT), port(GRPC_PORT)]
    clients = [policy_peer(p) for p in wanted.clients] or [{"podSelector": {}}]
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": names.network_policy_name(model), "namespace": namespace,
                     "labels": names.common_labels(model)},
        "spec": {
            "podSelector": {"matchLabels": {names.LABEL_MODEL: model,
                                            "app.kubernetes.io/name": names.common_labels(model)["app.kubernetes.io/name"]}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {names.LABEL_MODEL: model}}}],
                 "ports": [*inference, port(METRICS_PORT)]},
                {"from": clients, "ports": inference},
                {"from": [operator, *(policy_peer(p) for p in wanted.metrics_clients)], "ports": [port(METRICS_PORT)]},
                # rollout.strategy inPlace: the operator loads, unloads and gates versions through
                # Triton's HTTP port (the repository API answers only the model's key).
                *([{"from": [operator], "ports": [port(HTTP_PORT)]}]
                  if spec.rollout.switches_in_place else []),
            ],
        },
    }


SCRAPE_INTERVAL = "15s"
# Tracks whose Triton metrics are scraped: every serving pod once, through its track Service. The
# model's serving Service (no track label) would list the same pods again and double every sum;
# the reference track serves only equivalence-gate load and would skew the model's numbers.
SCRAPED_TRACKS = (names.STABLE, names.CANARY)


def service_monitor(model: str, namespace: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Prometheus Operator ServiceMonitor for Triton's metrics port (8002) on the model's pods.

    Triton's series carry `model` and `version`; the Prometheus Operator adds the target's
    `namespace`, `pod` and `service`, and `podTargetLabels` copies the pods' track and version
    (as rankops_io_track, rankops_io_version) so canary and stable can be told apart.
    `extra_labels` are the labels the users' Prometheus selects ServiceMonitors by; no
    namespaceSelector: a ServiceMonitor selects Services in its own namespace.
    """
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": names.service_monitor_name(model), "namespace": namespace,
                     "labels": {**(extra_labels or {}), **names.common_labels(model)}},
        "spec": {
            "selector": {
                "matchLabels": {names.LABEL_MODEL: model},
                "matchExpressions": [{"key": names.LABEL_TRACK, "operator": "In", "values": list(SCRAPED_TRACKS)}],
            },
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL}],
            "podTargetLabels": [names.LABEL_TRACK, names.LABEL_VERSION],
        },
    }


__all__ = ["config_map", "deployment", "network_policy", "api_key_secret", "disruption_budget", "serving_service", "track_service", "service_monitor", "pool_placement",
           "config_hash", "TRT_ENGINE_CACHE"]
