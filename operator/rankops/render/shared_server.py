"""A shared tritonserver's objects (issue 42): its arguments, its pod, who may join, what it loads
for each member, and each member's Service, port and endpoints (pure).

One server serves several RankingModels. It starts with no model (explicit model control, no
--load-model) and its members come and go through Triton's repository API, each with its own
config: the config.pbtxt the member would serve alone (render/tritonconfig.py: its batching,
instances, priority levels, queue policy, warm-up), sent as the load's config override, so adding
or removing a member never restarts the pods and never touches another member's config.

The pod is the server's (api/sharedserver.SharedServerSpec), never its members': a template that
changed with its members would restart every member's pods when one joined. Members change only
the server's ConfigMap (what the stager fetches, which ports the route sidecar opens), their own
Services and EndpointSlices, and the NetworkPolicy's rules; a member that needs from the pod what
the server does not give (another image, credentials, a response cache, a longer drain) is refused
by `member_problems`, naming the field and the fix.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankops.api.rankingmodel import RankingModelSpec
from rankops.api.sharedserver import SharedServerSpec
from rankops.fetcher import members as staged_members
from rankops.fetcher.stager import Wanted
from rankops.render import names, serving
from rankops.render.policy import TenantPolicy
from rankops.render.serving import triton_arguments
from rankops.render.tritonconfig import MODEL_FILENAMES, ServingShape, render_config_pbtxt, triton_version


def server_arguments(server: SharedServerSpec) -> list[str]:
    """tritonserver's arguments for a shared server (no model loaded at start)."""
    return [*triton_arguments((), server.disruption.exit_timeout_seconds, server.response_cache),
            # Strict readiness (Triton's default) answers /v2/health/ready 400 while any model it was
            # asked to load is not READY: one member whose load failed would take every member's pods
            # out of their Services (measured: tests/triton/test_shared_server_on_triton.py). The pod is
            # ready when the server is; a member's own readiness is /v2/models/<m>/ready.
            "--strict-readiness=false",
            # A gRPC request names its model inside a protobuf message: no per-member port can route it
            # (triton/route.py), so a shared server serves HTTP only.
            "--allow-grpc=false"]


def member_config(name: str, namespace: str, spec: RankingModelSpec, version_name: str,
                  shape: ServingShape) -> tuple[int, str]:
    """(Triton version, config.pbtxt) that member `name` is loaded with at `version_name`: the config it
    would serve alone; the load sends it as the override (triton.repository.config_json)."""
    version = spec.version_named(version_name)
    if version is None:
        raise ValueError(f"version {version_name!r} is not in {name}'s spec.versions")
    return triton_version(version.name), render_config_pbtxt(name, namespace, spec, version, shape)


# Each member's port on the pod: the `route` sidecar's, one per member (triton/route.py). Kept
# while the member stays (assign_ports), so a member leaving never moves another's port.
FIRST_MEMBER_PORT = 9000
MAX_MEMBERS = staged_members.MAX_MEMBERS
MEMBERS_KEY, ROUTES_KEY = "members.json", "routes.json"
MEMBERS_DIR = "/etc/rankops/server"
STARTUP_SECONDS = 600       # Triton starts with no model: its start is the server's alone
# The route sidecar passes every member's requests: no CPU limit (it uses what is spare), a
# bounded memory (it streams bodies, never holds them), and disk for its log only.
ROUTE_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "128Mi"},
                   "limits": {"memory": "256Mi", "ephemeral-storage": "128Mi"}}   # above the kubelet's log rotation
FETCHED_SCHEMES = staged_members.FETCHED_SCHEMES


@dataclass(frozen=True)
class FrozenMember:
    """A held member whose spec cannot be read now (it stopped validating, and this process never saw
    it valid): it serves as it was where it is loaded; its Service, port and files are kept, and its
    port admits the clients the server's NetworkPolicy last admitted there (none known: none)."""
    name: str
    version: str                        # the version the server holds for it
    error: str                          # why its spec does not validate
    clients: tuple[dict[str, Any], ...] = ()
    config: str | None = None           # the config.pbtxt its pods serve (configs.json, checked against its digest)
    switch: Any = None                  # rollout.inplace.Record: its version switch, as its status line kept it


def clients_by_port(observed_policy: dict[str, Any] | None) -> dict[int, tuple[dict[str, Any], ...]]:
    """The peers the server's NetworkPolicy (as observed) admits on each member port: its rules of
    one TCP port each (network_policy writes one such rule per member)."""
    found: dict[int, tuple[dict[str, Any], ...]] = {}
    for rule in ((observed_policy or {}).get("spec") or {}).get("ingress") or []:
        ports, peers = rule.get("ports") or [], rule.get("from")
        if isinstance(rule, dict) and len(ports) == 1 and isinstance(ports[0].get("port"), int) \
                and isinstance(peers, list) and all(isinstance(p, dict) for p in peers):
            found[ports[0]["port"]] = tuple(peers)
    return found


@dataclass(frozen=True)
class ServerMember:
    """One RankingModel the server holds, at the version it serves (`version`, a spec.versions name)."""
    name: str
    spec: RankingModelSpec
    version: str
    switching_to: str | None = None     # a version being switched in beside it (server_switch.py)


def member_problems(server: SharedServerSpec, member: ServerMember, joining: bool = True) -> list[str]:
    """What `member` needs from the pod that the server does not give, or cannot have on a shared
    server: each line names the member, its field and the fix. Empty when it can join. `joining`: a
    newcomer (what has no effect on a held member is said to it, not held against it)."""
    spec, problems = member.spec, []

    def same(field: str, mine: object, servers: object) -> None:
        if mine != servers:
            problems.append(f"{member.name}: spec.{field} is {mine!r} and the server's {servers!r}: a member runs "
                            f"in the server's pods; set spec.{field} to the server's")
    same("tritonImage", spec.triton_image, server.triton_image)
    same("nodePool", spec.node_pool, server.node_pool)
    if spec.model_credentials_secret not in (None, server.model_credentials_secret):
        problems.append(f"{member.name}: spec.modelCredentialsSecret is {spec.model_credentials_secret!r} and the "
                        f"server fetches with {server.model_credentials_secret!r}: a running pod cannot mount "
                        "another Secret; put the member's artifacts where the server's credentials reach, or "
                        "serve it on its own pods")
    if spec.response_cache and not server.response_cache:
        problems.append(f"{member.name}: spec.responseCache is true and the server runs no response cache: set "
                        "the server's responseCache (its pods restart once), or the member's to false")
    if spec.disruption.exit_timeout_seconds > server.disruption.exit_timeout_seconds:
        problems.append(f"{member.name}: spec.disruption.exitTimeoutSeconds is {spec.disruption.exit_timeout_seconds} "
                        f"and the server's {server.disruption.exit_timeout_seconds}: a drain would cut the member's "
                        "requests short; raise the server's or lower the member's")
    if "warm_replicas" in spec.model_fields_set and spec.warm_replicas.enabled:
        # Asked for in the member's spec (a member that leaves it out is not warmed, by default).
        problems.append(f"{member.name}: spec.warmReplicas.enabled is true: a shared server's pods are not warmed "
                        "per member; set it to false or leave warmReplicas out")
    if spec.network_policy.metrics_clients:
        problems.append(f"{member.name}: spec.networkPolicy.metricsClients is set: Triton's metrics port shows every "
                        "member's counters, so a shared server opens it to the operator's namespace only; read the "
                        "member's own statistics at /v2/models/<name>/stats through its Service, or serve the model "
                        "on its own pods")
    if spec.latency_isolation:
        problems.append(f"{member.name}: spec.latencyIsolation is true: pinned cores are a pod's, not a member's; "
                        "serve the model on its own pods")
    if spec.autoscaling.enabled and joining:
        problems.append(f"{member.name}: spec.autoscaling.enabled is true: a member's pods are the server's, which "
                        "follow every member's load; set the SharedServer's spec.autoscaling, and the member's to "
                        "false (its autoscaling.maxAvgQueueMs is still read)")
    if spec.gpus_per_replica != 1:
        problems.append(f"{member.name}: spec.gpusPerReplica is {spec.gpus_per_replica}: a member takes room on the "
                        "server's cards (one a pod), not cards of its own; set it to 1")
    version = spec.version_named(member.version)
    if version is None:
        problems.append(f"{member.name}: version {member.version!r} is not in spec.versions")
    elif version.model_uri.split("://", 1)[0].lower() not in FETCHED_SCHEMES:
        problems.append(f"{member.name}: spec.versions[{spec.versions.index(version)}].modelUri is mounted, not "
                        "fetched: a member joins a running pod, so its artifact must be fetched "
                        "(s3://, gs://, http(s)://)")
    return problems


def assign_ports(members: Sequence[str], previous: Mapping[str, int]) -> dict[str, int]:
    """Each member's port: the one it had (`previous`, read back from the server's routes), else the
    lowest free one from FIRST_MEMBER_PORT. A member that left frees its port for the next."""
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"{len(members)} members: a server holds at most {MAX_MEMBERS}")
    ports: dict[str, int] = {}
    for m in members:       # a port read back twice: the first member keeps it
        port = previous.get(m)
        if port is not None and FIRST_MEMBER_PORT <= port < FIRST_MEMBER_PORT + MAX_MEMBERS \
                and port not in ports.values():
            ports[m] = port
    free = (p for p in range(FIRST_MEMBER_PORT, FIRST_MEMBER_PORT + MAX_MEMBERS) if p not in ports.values())
    for m in members:
        if m not in ports:
            ports[m] = next(free)
    return ports


def server_labels(server: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "triton", "app.kubernetes.io/instance": server,
            "app.kubernetes.io/part-of": "rankops", "app.kubernetes.io/managed-by": "rankops",
            names.LABEL_SERVER: server}


def staged_member(member: ServerMember) -> staged_members.Member | None:
    """What the stager keeps on the volume for `member`: its held version, and the one switched in
    beside it while a switch needs it (None when its spec no longer lists the held version: nothing to
    fetch it from)."""
    version = member.spec.version_named(member.version)
    if version is None:
        return None
    incoming = member.spec.version_named(member.switching_to) if member.switching_to else None
    listed = [version, *([incoming] if incoming is not None and incoming.name != version.name else [])]
    return staged_members.Member(member.name, MODEL_FILENAMES[version.format], tuple(
        Wanted(v.name, triton_version(v.name), v.model_uri, v.sha256) for v in listed))


def members_json(server: str, staged: Sequence[staged_members.Member]) -> str:
    """The stager's members.json (fetcher/members.py)."""
    return json.dumps(staged_members.members_document(server, staged), sort_keys=True)


CONFIGS_KEY = "configs.json"
MAX_CONFIGS_BYTES = 512 * 1024      # of the ConfigMap's 1 MiB: members.json and routes.json take the rest


def configs_json(configs: Mapping[str, str], first: Collection[str] = ()) -> str:
    """{member: the config.pbtxt its pods serve} while they fit MAX_CONFIGS_BYTES: what a frozen member
    is loaded with on a new pod (one left out is loaded on none). `first` (the frozen members, whose
    entry cannot be written again) come first, then the smallest: one large config crowds out no other."""
    kept, size = {}, 2
    for name in sorted(configs, key=lambda n: (n not in first, len(configs[n]), n)):
        entry = len(json.dumps({name: configs[name]})) + 1
        if size + entry <= MAX_CONFIGS_BYTES:
            kept[name], size = configs[name], size + entry
    return json.dumps(kept, sort_keys=True, separators=(",", ":"))


def parse_configs(text: str | None) -> dict[str, str]:
    """configs.json as written; whoever may edit the ConfigMap may write anything here, so a document
    that is too large, too deep or not a map of texts is nothing (each text is checked against the
    server's status before it is loaded anyway)."""
    if not text or len(text) > 2 * MAX_CONFIGS_BYTES:
        return {}
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str) and _utf8(v)}


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:      # a lone surrogate JSON lets through
        return False
    return True


def served_sha256(server: str, config_text: str, staged: staged_members.Member | None) -> str:
    """The full SHA-256 of what a member's pods serve: its config and the files it was staged with
    (its members.json entry). A frozen member is loaded on a new pod from the ConfigMap only while
    both hash to this, as the operator wrote it in the server's status (configDigest is 64 bits: a
    tenant steering both texts could find a collision)."""
    document = [config_text, staged_members.members_document(server, [staged]) if staged else None]
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()


def routes_json(ports: Mapping[str, int]) -> str:
    """The route sidecar's routes file: {"PORT": "MODEL"}."""
    return json.dumps({str(port): model for model, port in ports.items()}, sort_keys=True)


def server_deployment(server: str, namespace: str, spec: SharedServerSpec, replicas: int, placement: dict[str, Any],
                      policy: TenantPolicy = TenantPolicy()) -> dict[str, Any]:
    """The server's pods: Triton (no model at start), the `route` sidecar (a port per member, from the
    ConfigMap's routes.json) and the `stage` sidecar (every member's artifacts, from members.json).
    The template is a function of the server's spec alone: members come and go without a restart
    (`replicas`, the cards the members need, is not in it)."""
    name, labels, selector = names.server_name(server), server_labels(server), {names.LABEL_SERVER: server}
    disk = serving.sum_quantities(spec.storage.model_volume_size, spec.storage.tmp_size)
    limits = {"cpu": spec.resources.cpu, "memory": spec.resources.memory,
              "nvidia.com/gpu": "1", "ephemeral-storage": disk}
    restricted = serving.read_only_root(serving.restricted_container())
    config_mount = {"name": "server", "mountPath": MEMBERS_DIR, "readOnly": True}
    triton = {
        "name": "triton", "image": spec.triton_image, "command": ["tritonserver"],
        "args": server_arguments(spec),
        "env": [serving.api_key_env(name)],
        "ports": [{"name": "http", "containerPort": serving.HTTP_PORT},
                  {"name": "metrics", "containerPort": serving.METRICS_PORT}],
        # Not strict (server_arguments): the pod is ready when Triton is; a member's own state
        # decides its endpoints (member_endpoints).
        **serving.triton_probes(STARTUP_SECONDS),
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "volumeMounts": [{"name": "model-repository", "mountPath": serving.MODEL_REPOSITORY},
                         {"name": "shm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": serving.TMP_DIR}],
        "securityContext": serving.read_only_root({**serving.restricted_container(), **serving.triton_user(policy)}),
        **serving.pre_stop(spec.disruption),
    }
    route = {
        "name": "route", "image": policy.fetcher(spec),
        "command": ["rankops", "route", "--upstream", f"127.0.0.1:{serving.HTTP_PORT}",
                    "--routes-file", f"{MEMBERS_DIR}/{ROUTES_KEY}", "--api-key-env", serving.API_KEY_ENV,
                    "--repository", serving.MODEL_REPOSITORY],
        # the operator's drain asks (a swap) carry the server's restricted-API key; their answers say which
        # version directories the stager has put on the volume (read-only here)
        "env": [serving.api_key_env(name)],
        "volumeMounts": [config_mount, {"name": "model-repository", "mountPath": serving.MODEL_REPOSITORY,
                                        "readOnly": True}], "resources": ROUTE_RESOURCES, "securityContext": restricted,
    }
    stage = {
        "name": "stage", "image": policy.fetcher(spec),
        "command": ["rankops", "stage-members", "--server", server, "--repository", serving.MODEL_REPOSITORY,
                    "--members-file", f"{MEMBERS_DIR}/{MEMBERS_KEY}",
                    "--max-bytes", str(serving.quantity_bytes(spec.storage.model_volume_size)), *spec.fetch.args()],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "model-repository", "mountPath": serving.MODEL_REPOSITORY}, config_mount,
                         {"name": "fetch-tmp", "mountPath": serving.TMP_DIR}],
        "resources": copy.deepcopy(serving.STAGE_RESOURCES), "securityContext": restricted,
        **({"envFrom": [{"secretRef": {"name": spec.model_credentials_secret}}]}
           if spec.model_credentials_secret else {}),
    }
    pod = {
        **placement,
        "tolerations": [*placement.get("tolerations", []),
                        *serving.node_loss_tolerations(spec.disruption.unreachable_toleration_seconds)],
        "topologySpreadConstraints": [{**c, "labelSelector": {"matchLabels": selector}}
                                      for c in serving.topology_spread(server, "", spec.disruption.node_spread)],
        **({"priorityClassName": spec.disruption.priority_class_name} if spec.disruption.priority_class_name else {}),
        "securityContext": {"runAsNonRoot": True, **serving.triton_user(policy, fs_group=True),
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": False,     # nothing in the pod talks to the Kubernetes API
        "terminationGracePeriodSeconds": spec.disruption.grace_period_seconds(),
        "containers": [triton, route, stage],
        "volumes": [
            {"name": "model-repository", "emptyDir": {"sizeLimit": spec.storage.model_volume_size}},
            {"name": "server", "configMap": {"name": name}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": spec.storage.tmp_size}},
            {"name": "fetch-tmp", "emptyDir": {"sizeLimit": serving.RANKOPS_TMP}},
        ],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # surge one: every member's capacity is in each pod
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels,
                                      "annotations": {serving.SAFE_TO_EVICT: "true", **spec.pod_annotations}},
                         "spec": pod},
        },
    }


def server_objects(server: str, namespace: str, spec: SharedServerSpec, members: Sequence[ServerMember],
                   ports: Mapping[str, int], replicas: int, placement: dict[str, Any],
                   policy: TenantPolicy = TenantPolicy(),
                   lingering: Sequence[staged_members.Member] = (),
                   frozen: Sequence[FrozenMember] = (), served_configs: Mapping[str, str] | None = None,
                   taken: int = 0) -> list[dict[str, Any]]:
    """The server's ConfigMap (members.json, routes.json, configs.json), Deployment, disruption budget and
    NetworkPolicy, and one Service per member. `members`: those the server holds, in admission
    order (which may join is member_problems' and the plan's to say); `ports`: assign_ports';
    `replicas`: the cards the admission needs; `lingering`: members that left but may still be
    loaded on a pod, kept on the volume (members.json) and nowhere else; `frozen`: held members whose
    spec cannot be read, routed and given their Service (their files come in `lingering`);
    `served_configs`: each held member's config.pbtxt as its pods serve it (configs.json); `taken`: pods
    a member's swap has taken out of its endpoints (Ready, yet one fewer serving it: the budget counts them
    as gone, so an eviction waits for the swap's pod rather than take the member below its floor)."""
    name, labels = names.server_name(server), server_labels(server)
    staged = [s for s in (staged_member(m) for m in members) if s is not None]
    listed = {s.model for s in staged}
    lingering = [s for s in lingering if s.model not in listed]     # a model is listed once
    config = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {MEMBERS_KEY: members_json(server, [*staged, *lingering]),
                 ROUTES_KEY: routes_json({m.name: ports[m.name] for m in [*members, *frozen]}),
                 CONFIGS_KEY: configs_json(served_configs or {}, {f.name for f in frozen})},
    }
    # Shared fate: one budget for every member (every member goes with a pod).
    budget = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"minAvailable": min(replicas, max(0, replicas - spec.failure_tolerance) + taken),
                 "selector": {"matchLabels": {names.LABEL_SERVER: server}},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }
    return [config, server_deployment(server, namespace, spec, replicas, placement, policy), budget,
            network_policy(server, namespace, members, ports, policy, frozen),
            *(member_service(m.name, server, namespace, ports[m.name]) for m in [*members, *frozen])]


def member_service(model: str, server: str, namespace: str, port: int) -> dict[str, Any]:
    """`<model>.<ns>.svc`: answers for that model only. No selector: member_endpoints lists the pods."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names.serving_service_name(model), "namespace": namespace,
                         "labels": {**names.common_labels(model), names.LABEL_SERVER: server}},
            "spec": {"ports": [{"name": "http", "port": serving.HTTP_PORT, "targetPort": port}]}}


@dataclass(frozen=True)
class PodEndpoint:
    name: str
    ip: str
    node: str | None
    serving: bool              # the pod is Ready and the member Serving in it (serverplan.member_state)
    terminating: bool = False  # the pod is going (deletionTimestamp): no new connections


def member_endpoints(model: str, server: str, namespace: str, port: int,
                     pods: Sequence[PodEndpoint]) -> dict[str, Any]:
    """The EndpointSlice of a member's Service: every pod of the server, ready only where the member
    serves and the pod is not terminating, so a pod still loading it (or that failed to, or that is
    draining) gets none of its new requests. One address family: the first address's (IPv6 when it
    has a colon); a dual-stack cluster's other family is not listed."""
    family = "IPv6" if ":" in next((p.ip for p in pods if p.ip), "") else "IPv4"
    pods = [p for p in pods if p.ip and (":" in p.ip) == (family == "IPv6")]
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
        "metadata": {"name": names.member_endpoints_name(model), "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": names.serving_service_name(model),
                                "endpointslice.kubernetes.io/managed-by": "rankops.io",
                                names.LABEL_SERVER: server, names.LABEL_MODEL: model}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [p.ip],
                       "conditions": {"ready": p.serving and not p.terminating, "serving": p.serving,
                                      "terminating": p.terminating},
                       **({"nodeName": p.node} if p.node else {}),
                       "targetRef": {"kind": "Pod", "name": p.name, "namespace": namespace}}
                      for p in sorted(pods, key=lambda p: p.name)],
    }


def network_policy(server: str, namespace: str, members: Sequence[ServerMember], ports: Mapping[str, int],
                   policy: TenantPolicy, frozen: Sequence[FrozenMember] = ()) -> dict[str, Any]:
    """Triton's own ports (its repository API, every member's metrics) from the operator only; each
    member's port from that member's clients (spec.networkPolicy.clients; any pod of the namespace
    when it names none). Always rendered: without it any pod could reach Triton past the routes."""
    port = lambda number: {"protocol": "TCP", "port": number}  # noqa: E731
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": policy.operator_namespace}}}
    rules: list[dict[str, Any]] = [{"from": [operator], "ports": [port(serving.HTTP_PORT), port(serving.METRICS_PORT)]}]
    for m in members:
        clients = [serving.policy_peer(p) for p in m.spec.network_policy.clients] or [{"podSelector": {}}]
        rules.append({"from": clients, "ports": [port(ports[m.name])]})
    rules += [{"from": list(f.clients), "ports": [port(ports[f.name])]} for f in frozen if f.clients]
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": names.server_name(server), "namespace": namespace, "labels": server_labels(server)},
        "spec": {"podSelector": {"matchLabels": {names.LABEL_SERVER: server}}, "policyTypes": ["Ingress"],
                 "ingress": rules},
    }
