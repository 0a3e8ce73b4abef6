"""The Helm chart, the plain manifests rendered from it, and the examples.

Renders the chart with the real helm binary (built by dev/rankops_dev/build.sh) in
several value combinations and checks what a cluster admin reviews: least-privilege RBAC with no
wildcards, restricted pod security, the watch scope, the schema rejecting bad values, and that
the checked-in copies (manifests/install.yaml, deploy/monitoring/, the chart's files/crds/) are fresh.
"""
from __future__ import annotations

import filecmp
import functools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "rankops-operator"
NAMESPACE = "rankops-system"
KUBE_VERSION = "1.34.0"  # pinned, so renders do not follow the helm binary's default (build.sh: its Kubernetes)
BIN_DIR = Path(os.environ.get("RANKOPS_K8S_BIN", Path.home() / ".cache/rankops/k8s/v1.34.4/bin"))

ALL_OPTIONS = (
    "openshift.enabled=true", "openshift.routes=true", "traffic.gatewayApi=true",
    "monitoring.tritonServiceMonitors=true", "monitoring.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true", "monitoring.grafanaDashboard.enabled=true",
    "validator.restrictToOwnNode=true",
)
COMBINATIONS = {
    "defaults": (),
    "namespaced": ("watch.namespaces={reco,ads}",),
    "everything": ALL_OPTIONS,
    "namespaced-everything": ("watch.namespaces={reco}",) + ALL_OPTIONS,
    "existing-service-accounts": ("serviceAccount.create=false", "serviceAccount.name=ops-sa",
                                  "validator.serviceAccount.create=false", "validator.serviceAccount.name=val-sa"),
    "no-rbac": ("rbac.create=false",),
}
# What the operator may do only inside the namespaces it serves.
NAMESPACED_APP_RESOURCES = {"rankingmodels", "configmaps", "services", "deployments", "jobs", "pods",
                            "poddisruptionbudgets", "sharedservers", "endpointslices"}
RBAC_KINDS = {"Role", "ClusterRole"}


def helm() -> Path:
    path = BIN_DIR / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm not found at {path}: run dev/rankops_dev/build.sh first "
                    "(CI does), or point RANKOPS_K8S_BIN at a directory holding helm")
    return path


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm()), *args], capture_output=True, text=True, timeout=120)


@functools.lru_cache(maxsize=None)
def render(sets: tuple[str, ...] = ()) -> tuple[dict, ...]:
    """helm template with these `--set`s ("json:key=value" for `--set-json`: helm's --set reads 0.8 as a string)."""
    args = ["template", "rankops", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set-json", s[5:]] if s.startswith("json:") else ["--set", s]
    done = run_helm(*args)
    assert done.returncode == 0, f"helm template {' '.join(sets)} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def by_kind(objs, kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs, kind: str, name: str | None = None) -> dict:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_container(objs) -> dict:
    return one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def granted(role: dict) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role/ClusterRole grants."""
    return {(g, r, v) for rule in role.get("rules", []) for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])}


def rules_for(objs, subject_sa: str) -> dict[str, set]:
    """What each namespace ("*" = cluster-wide) lets the ServiceAccount do, following bindings."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in RBAC_KINDS}
    out: dict[str, set] = {}
    for binding in objs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == subject_sa for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        ns = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles.get((ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"]))
        assert role is not None, f"{binding['kind']} {binding['metadata']['name']} refers to missing {ref}"
        out.setdefault(ns or "*", set()).update(granted(role))
    return out


def test_helm_lint_passes_with_defaults_and_every_option():
    for sets in ((), ALL_OPTIONS):
        args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
        for s in sets:
            args += ["--set", s]
        done = run_helm(*args)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("combo", COMBINATIONS)
def test_no_rbac_wildcards(combo):
    for role in (o for o in render(COMBINATIONS[combo]) if o["kind"] in RBAC_KINDS):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{role['kind']} {role['metadata']['name']}: {field} has *"


@pytest.mark.parametrize("combo", COMBINATIONS)
def test_every_object_carries_the_standard_labels(combo):
    for obj in render(COMBINATIONS[combo]):
        labels = obj["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart"):
            assert key in labels, f"{obj['kind']} {obj['metadata']['name']} lacks label {key}"


@pytest.mark.parametrize("combo", COMBINATIONS)
def test_operator_deployment_is_a_peered_pair_and_restricted(combo):
    objs = render(COMBINATIONS[combo])
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    args = operator_container(objs)["args"]
    assert args[args.index("--peering") + 1] == "rankops-operator", "replicas without peering would both act"
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    # Issue 37: a replica that is not Ready must not block a drain.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert "runAsUser" not in pod["securityContext"], "a fixed UID breaks OpenShift restricted-v2"
    c = operator_container(objs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and any(v["name"] == tmp[0]["name"] and "emptyDir" in v for v in pod["volumes"])
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    # The liveness probe hits the endpoint kopf serves on the port given by --liveness.
    args = c["args"]
    liveness_url = args[args.index("--liveness") + 1]
    port_by_name = {p["name"]: p["containerPort"] for p in c["ports"]}
    probe = c["livenessProbe"]["httpGet"]
    assert liveness_url == f"http://0.0.0.0:{port_by_name[probe['port']]}{probe['path']}"
    assert "readinessProbe" not in c
    assert pod["serviceAccountName"] == ("ops-sa" if combo == "existing-service-accounts" else "rankops-operator")


def test_one_replica_is_standalone_and_replaced():
    objs = render(("operator.replicas=1",))
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert "--peering" not in operator_container(objs)["args"]
    assert not by_kind(objs, "PodDisruptionBudget")
    assert not [o for o in by_kind(objs, "CustomResourceDefinition") if o["spec"]["group"] == "kopf.dev"]
    everything = set().union(*rules_for(objs, "rankops-operator").values())
    assert not [r for g, r, v in everything if g == "kopf.dev"], "no peering rights without peering"


@pytest.mark.parametrize("sets,where,resource", [
    ((), "*", "clusterkopfpeerings"), (("watch.namespaces={reco,ads}",), "reco", "kopfpeerings")])
def test_peering_rights_and_crds_where_kopf_peers(sets, where, resource):
    """kopf peers cluster-wide through a ClusterKopfPeering, namespaced through a KopfPeering in
    each served namespace: `rankops run --peering` creates it, kopf patches and watches it."""
    objs = render(sets)
    rules = rules_for(objs, "rankops-operator")
    peering = {(r, v) for ns, grants in rules.items() for g, r, v in grants if g == "kopf.dev"}
    assert peering == {(resource, v) for v in ("get", "list", "watch", "create", "patch")}
    assert {(g, r) for g, r, _ in rules[where] if g == "kopf.dev"} == {("kopf.dev", resource)}
    if where != "*":
        assert {(g, r) for g, r, _ in rules["ads"] if g == "kopf.dev"} == {("kopf.dev", resource)}
    crds = {o["metadata"]["name"]: o for o in by_kind(objs, "CustomResourceDefinition") if o["spec"]["group"] == "kopf.dev"}
    assert sorted(crds) == ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"


def test_cluster_wide_mode_uses_all_namespaces_and_cluster_roles():
    objs = render(())
    args = operator_container(objs)["args"]
    assert "--all-namespaces" in args and "--namespace" not in args
    grants = rules_for(objs, "rankops-operator")
    assert set(grants) == {"*", NAMESPACE}
    cluster = grants["*"]
    for resource in NAMESPACED_APP_RESOURCES:
        assert any(r == resource for _, r, _ in cluster), resource
    # kopf observes (lists, watches) namespaces only in namespaced mode; cluster-wide the operator
    # only gets one, to hold a model's Events while its namespace is being deleted.
    assert {v for _, r, v in cluster if r == "namespaces"} == {"get"}


def test_namespaced_mode_grants_model_rights_only_in_listed_namespaces():
    objs = render(COMBINATIONS["namespaced"])
    args = operator_container(objs)["args"]
    assert "--all-namespaces" not in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["reco", "ads"]
    grants = rules_for(objs, "rankops-operator")
    assert set(grants) == {"*", "reco", "ads", NAMESPACE}
    cluster_resources = {r for _, r, _ in grants["*"]}
    assert not cluster_resources & NAMESPACED_APP_RESOURCES, "namespaced rights leaked into a ClusterRole"
    assert {"gpunodepools", "gpunodepools/status", "nodes", "customresourcedefinitions", "namespaces"} <= cluster_resources
    for ns in ("reco", "ads"):
        assert {r for _, r, _ in grants[ns]} >= NAMESPACED_APP_RESOURCES | {"rankingmodels/status", "events"}
        assert ("apps", "deployments", "create") in grants[ns]
        assert {v for g, r, v in grants[ns] if (g, r) == ("policy", "poddisruptionbudgets")} == {
            "get", "list", "watch", "create", "patch", "delete"}, "the Triton tracks' budgets"
        assert ("", "pods", "patch") in grants[ns], "the canary traffic label"
        assert not {("", "pods", "delete"), ("", "pods", "create")} & grants[ns], "pods belong to their owners"


@pytest.mark.parametrize("combo", ["defaults", "namespaced"])
def test_operator_rights_are_exactly_what_it_touches(combo):
    objs = render(COMBINATIONS[combo])
    everything = set().union(*rules_for(objs, "rankops-operator").values())
    # No escalation paths: no RBAC, SCCs, pod exec; nodes only read, and patched to clear a deleted
    # pool's marks (never created, updated or deleted); Secrets only got one by one, to check that
    # spec.modelCredentialsSecret exists, and created (each model's restricted-API key): never
    # listed or watched, never updated, patched or deleted.
    for group, resource, verb in everything:
        assert group != "rbac.authorization.k8s.io", (group, resource, verb)
        assert resource not in ("serviceaccounts", "pods/exec", "securitycontextconstraints")
    assert {v for g, r, v in everything if (g, r) == ("", "secrets")} == {"get", "create"}
    assert {v for g, r, v in everything if (g, r) == ("networking.k8s.io", "networkpolicies")} == {
        "get", "create", "patch", "delete"}, "spec.networkPolicy, applied server-side"
    assert {v for g, r, v in everything if (g, r) == ("", "nodes")} == {"get", "list", "watch", "patch"}
    assert not any(r.startswith("nodes/") for _, r, _ in everything), "no node subresources (status, proxy)"
    assert {v for g, r, v in everything if (g, r) == ("", "namespaces")} <= {"get", "list", "watch"}
    # The validator DaemonSets only in the operator's own namespace.
    for ns, grants in rules_for(objs, "rankops-operator").items():
        has_ds = any(r == "daemonsets" for _, r, _ in grants)
        assert has_ds == (ns == NAMESPACE), f"daemonsets granted in {ns}"
    # Optional APIs only when asked for.
    resources = {r for _, r, _ in everything}
    assert not resources & {"httproutes", "routes", "routes/custom-host", "servicemonitors", "prometheusrules"}


def test_optional_apis_are_granted_when_enabled():
    everything = set().union(*rules_for(render(ALL_OPTIONS), "rankops-operator").values())
    assert ("gateway.networking.k8s.io", "httproutes", "create") in everything
    assert ("route.openshift.io", "routes", "patch") in everything
    assert ("route.openshift.io", "routes/custom-host", "create") in everything
    assert ("monitoring.coreos.com", "servicemonitors", "create") in everything


@pytest.mark.parametrize("watch", [(), ("watch.namespaces={reco}",)], ids=["cluster-wide", "namespaced"])
def test_triton_service_monitors_value_turns_on_the_flag_and_its_rbac_together(watch):
    """monitoring.tritonServiceMonitors: `rankops run --service-monitors` with the operator
    ServiceMonitor's labels, and servicemonitors rights (no more) where models are served."""
    from rankops.cli import build_parser

    sm_verbs = lambda grants: {v for g, r, v in grants if (g, r) == ("monitoring.coreos.com", "servicemonitors")}
    off = render(watch)
    assert "--service-monitors" not in operator_container(off)["args"]
    assert all(not sm_verbs(g) for g in rules_for(off, "rankops-operator").values())

    on = render(watch + ("monitoring.tritonServiceMonitors=true",
                         "monitoring.serviceMonitor.labels.release=kube-prometheus-stack"))
    args = build_parser().parse_args(["run", *operator_container(on)["args"]])
    assert args.service_monitors is True
    assert args.service_monitor_label == [("release", "kube-prometheus-stack")]
    grants = rules_for(on, "rankops-operator")
    where = "reco" if watch else "*"
    assert sm_verbs(grants[where]) == {"get", "list", "create", "patch", "delete"}
    assert all(not sm_verbs(g) for ns, g in grants.items() if ns != where), "only where models are served"
    assert not {r for g in grants.values() for _, r, _ in g} & {"prometheusrules"}, "the operator makes none"


def test_rbac_rules_are_commented_and_split_framework_from_application():
    out = run_helm("template", "rankops", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
                   "--show-only", "templates/rbac.yaml").stdout
    for doc in out.split("\n---"):
        if "kind: ClusterRole\n" not in doc and "kind: Role\n" not in doc:
            continue
        lines = doc.splitlines()
        rules = [i for i, line in enumerate(lines) if line.lstrip().startswith("- apiGroups:")]
        for i in rules:
            above = lines[i - 1].strip()
            # Each rule is introduced by a comment, or continues the rule just above it.
            assert above.startswith("#") or above.startswith("verbs:"), f"uncommented rule at: {lines[i]}"
    assert "# Framework:" in out and "# Application:" in out


@pytest.mark.parametrize("combo", ["defaults", "existing-service-accounts"])
def test_validator_may_only_get_and_patch_nodes_and_list_pools(combo):
    objs = render(COMBINATIONS[combo])
    sa = "val-sa" if combo == "existing-service-accounts" else "rankops-operator-validator"
    # Listing pools tells it which pool owns its node (the oldest of those selecting it).
    assert rules_for(objs, sa) == {"*": {("", "nodes", "get"), ("", "nodes", "patch"),
                                         ("rankops.io", "gpunodepools", "list")}}
    args = operator_container(objs)["args"]
    assert args[args.index("--validator-service-account") + 1] == sa
    if combo == "existing-service-accounts":
        assert not by_kind(objs, "ServiceAccount")


def test_the_chart_and_rankops_render_name_the_validators_service_account_alike():
    """Issue 37: one default name: the chart's for the release `rankops` is the operator's own."""
    from rankops.validator.daemonset import DEFAULT_SERVICE_ACCOUNT

    objs = render()
    args = operator_container(objs)["args"]
    assert args[args.index("--validator-service-account") + 1] == DEFAULT_SERVICE_ACCOUNT
    assert DEFAULT_SERVICE_ACCOUNT in {o["metadata"]["name"] for o in by_kind(objs, "ServiceAccount")}


@pytest.mark.parametrize("value, expected", [(None, "system-node-critical"), ("gpu-agents", "gpu-agents"), ("", "")])
def test_the_validators_priority_class_is_passed_to_the_operator(value, expected):
    objs = render(() if value is None else (f"validator.priorityClassName={value}",))
    args = operator_container(objs)["args"]
    assert args[args.index("--validator-priority-class") + 1] == expected


def test_rbac_create_false_renders_no_rbac():
    objs = render(COMBINATIONS["no-rbac"])
    assert not [o for o in objs if o["apiVersion"].startswith("rbac.authorization.k8s.io")]
    assert by_kind(objs, "Deployment") and by_kind(objs, "ServiceAccount")


def test_own_node_admission_policy_targets_the_validator_only():
    objs = render(ALL_OPTIONS)
    policy = one(objs, "ValidatingAdmissionPolicy", "rankops-operator-validator-own-node")
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:rankops-system:rankops-operator-validator"')
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["variables"][0]["expression"]
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "rankops-operator-validator-own-node")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    # On by default: a token of the validator's ServiceAccount must not mark every node.
    assert "rankops-operator-validator-own-node" in {o["metadata"]["name"] for o in render(())}
    assert "rankops-operator-validator-own-node" not in \
        {o["metadata"]["name"] for o in render(("validator.restrictToOwnNode=false",))}


@pytest.mark.parametrize("sets, account", [
    ((), "system:serviceaccount:rankops-system:rankops-operator"),
    (("serviceAccount.create=false", "serviceAccount.name=ops-sa"), "system:serviceaccount:rankops-system:ops-sa"),
])
def test_status_admission_policy_lets_only_the_operators_service_account_write_status(sets, account):
    objs = render(sets)
    policy = one(objs, "ValidatingAdmissionPolicy", "rankops-operator-status-by-operator")
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["rankops.io"] and rule["resources"] == ["rankingmodels/status", "sharedservers/status"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"} and policy["spec"]["failurePolicy"] == "Fail"
    assert "matchConditions" not in policy["spec"], "every writer is judged, the cluster admin too"
    [validation] = policy["spec"]["validations"]
    assert validation["expression"] == f'request.userInfo.username == "{account}"'
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "rankops-operator-status-by-operator")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"]
    for off in ("admissionPolicies.statusByOperatorOnly=false", "admissionPolicies.enabled=false"):
        assert "rankops-operator-status-by-operator" not in {o["metadata"]["name"] for o in render(sets + (off,))}


def test_openshift_scc_allows_host_reads_and_nothing_privileged():
    objs = render(ALL_OPTIONS)
    scc = one(objs, "SecurityContextConstraints")
    assert scc["allowHostDirVolumePlugin"] is True
    for flag in ("allowPrivilegedContainer", "allowPrivilegeEscalation", "allowHostNetwork", "allowHostPID",
                 "allowHostIPC", "allowHostPorts"):
        assert scc[flag] is False, flag
    assert scc["requiredDropCapabilities"] == ["ALL"] and scc["allowedCapabilities"] == []
    assert scc["runAsUser"]["type"] == "MustRunAsNonRoot" and scc["readOnlyRootFilesystem"] is True
    # The validator DaemonSet the operator renders is admitted: its SELinux type needs RunAsAny
    # (MustRunAs takes only its own type and the namespace's MCS level); its volumes are allowed.
    from rankops.api.gpunodepool import GpuNodePool
    from rankops.validator.daemonset import render_validator
    pool = GpuNodePool.model_validate(yaml.safe_load((ROOT / "manifests" / "examples" / "gpunodepool-t4.yaml").read_text()))
    daemonset = one(render_validator(pool, namespace=NAMESPACE, service_account="rankops-operator-validator"), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    if any((c.get("securityContext") or {}).get("seLinuxOptions") for c in pod["containers"]):
        assert scc["seLinuxContext"]["type"] == "RunAsAny", "the SCC would refuse the validator's seLinuxOptions"
    kinds = {next(k for k in v if k != "name") for v in pod["volumes"]}
    assert kinds <= set(scc["volumes"]), kinds
    use = one(objs, "ClusterRole", "rankops-operator-validator-scc")
    assert use["rules"] == [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                             "resourceNames": [scc["metadata"]["name"]], "verbs": ["use"]}]
    assert rules_for(objs, "rankops-operator-validator")[NAMESPACE] == {
        ("security.openshift.io", "securitycontextconstraints", "use")}


def test_metrics_service_and_service_monitor_point_at_the_metrics_port():
    objs = render(ALL_OPTIONS + ("metrics.port=9100",))
    c = operator_container(objs)
    assert c["args"][c["args"].index("--metrics-port") + 1] == "9100"
    svc = one(objs, "Service")
    assert svc["spec"]["ports"][0]["port"] == 9100 and svc["spec"]["ports"][0]["targetPort"] == "metrics"
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    sm = one(objs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and sm["spec"]["endpoints"][0]["honorLabels"] is True


def test_alert_thresholds_come_from_values():
    objs = render(("monitoring.prometheusRule.enabled=true",
                   "json:monitoring.prometheusRule.thresholds.gpuMemoryFraction=0.8",
                   "monitoring.prometheusRule.thresholds.minAverageBatch=3",
                   "json:monitoring.prometheusRule.thresholds.shedRatio=0.05"))
    rules = {r["alert"]: r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert "> 0.8" in rules["RankopsGpuMemoryNearFull"]["expr"]
    assert "< 3" in rules["RankopsBatchTooSmall"]["expr"]
    assert ") > 0.05" in rules["RankopsModelShedding"]["expr"]
    assert all("__" not in r["expr"] for r in rules.values()), "an unreplaced placeholder"
    assert 'up{job="rankops-operator-metrics"}' in rules["RankopsOperatorDown"]["expr"]


def test_generated_admission_policies_are_installed_unless_disabled():
    names = lambda objs: {o["metadata"]["name"] for o in by_kind(objs, "ValidatingAdmissionPolicy")}
    generated = {d["metadata"]["name"] for p in (CHART / "files" / "crd-policies").glob("*.yaml")
                 for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == "ValidatingAdmissionPolicy"}
    assert generated and generated <= names(render(()))
    assert not generated & names(render(("admissionPolicies.enabled=false",)))


def test_dashboard_configmap_holds_the_dashboard():
    cm = one(render(ALL_OPTIONS), "ConfigMap", "rankops-operator-dashboard")
    dashboard = json.loads(cm["data"]["rankops.json"])
    assert dashboard["uid"] == "rankops-overview"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


# (--set or json:--set-json, the JSON pointer helm's schema error names)
BAD_VALUES = [
    ("watch.namespaces={Bad_Namespace}", "/watch/namespaces/0"),
    ("metrics.port=70000", "/metrics/port"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("image.digest=latest", "/image/digest"),
    ("rbac.creat=true", "creat"),
    ("validator.restrictToOwnNode=yes", "/validator/restrictToOwnNode"),
    ("tenantPolicy.allowFileUriDirs={models}", "/tenantPolicy/allowFileUriDirs/0"),
    ("tenantPolicy.allowFileUriDirs={/}", "/tenantPolicy/allowFileUriDirs/0"),
    ("json:monitoring.prometheusRule.thresholds.gpuMemoryFraction=1.5", "/monitoring/prometheusRule/thresholds/gpuMemoryFraction"),
    ("json:monitoring.prometheusRule.thresholds.shedRatio=0", "/monitoring/prometheusRule/thresholds/shedRatio"),
    ("monitoring.serviceMonitor.interval=often", "/monitoring/serviceMonitor/interval"),
    ("operator.resources.requests.cpu=lots", "/operator/resources/requests/cpu"),
]


@pytest.mark.parametrize("setting,named", BAD_VALUES)
def test_schema_rejects_bad_values_naming_the_key(setting, named):
    flag = ["--set-json", setting[5:]] if setting.startswith("json:") else ["--set", setting]
    done = run_helm("template", "rankops", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION, *flag)
    assert done.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


@pytest.mark.parametrize("sets,message", [
    (("serviceAccount.create=false",), "serviceAccount.name must name an existing ServiceAccount"),
    (("monitoring.serviceMonitor.enabled=true", "metrics.service.enabled=false"), "needs metrics.service.enabled"),
])
def test_inconsistent_values_fail_with_a_reason(sets, message):
    args = ["template", "rankops", str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    done = run_helm(*args)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_operator_args_are_accepted_by_rankops_run():
    """The chart's command line is a contract with `rankops run`: parse it with the real CLI."""
    from rankops.cli import build_parser

    for sets in ((), COMBINATIONS["namespaced"], ("validator.image.repository=mirror.local/rankops-validator",)):
        args = build_parser().parse_args(["run", *operator_container(render(sets))["args"]])
        assert args.command == "run"
        assert args.liveness == "http://0.0.0.0:8080/healthz" and int(args.metrics_port) == 8081
        assert args.validator_service_account == "rankops-operator-validator"
        assert list(args.namespace or []) == (["reco", "ads"] if sets == COMBINATIONS["namespaced"] else [])
        expected_image = "mirror.local/rankops-validator:0.1.0" if "validator.image" in "".join(sets) else None
        assert args.validator_image == expected_image


def test_tenant_policy_values_become_the_operators_allow_flags():
    from rankops.cli import build_parser
    from rankops.commands.render import tenant_policy

    default = build_parser().parse_args(["run", *operator_container(render(()))["args"]])
    assert tenant_policy(default).file_uri_dirs == () and tenant_policy(default).image_prefixes == ()
    sets = ("tenantPolicy.allowFileUriDirs={/srv/models,/mnt/lab}",
            "tenantPolicy.allowImagePrefixes={nvcr.io/nvidia/,registry.corp/ml}")
    args = build_parser().parse_args(["run", *operator_container(render(sets))["args"]])
    policy = tenant_policy(args)
    assert policy.file_uri_dirs == ("/srv/models", "/mnt/lab")
    assert policy.image_prefixes == ("nvcr.io/nvidia/", "registry.corp/ml")


def test_install_manifest_and_monitoring_copies_match_a_fresh_render():
    helm()
    done = subprocess.run([str(ROOT / "scripts" / "render-manifests.sh"), "--check"], capture_output=True,
                          text=True, timeout=180, env={**os.environ, "RANKOPS_K8S_BIN": str(BIN_DIR)})
    assert done.returncode == 0, ("checked-in renders are stale: run scripts/render-manifests.sh\n"
                                  + done.stdout[-3000:] + done.stderr[-2000:])


def test_install_manifest_is_self_contained():
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]
    assert docs[0]["kind"] == "Namespace" and docs[0]["metadata"]["name"] == NAMESPACE
    kinds = [d["kind"] for d in docs]
    generated = [d for p in (ROOT / "crds").glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d]
    assert generated, "crds/ is empty: run `rankops crds --write crds/`"
    for kind in {d["kind"] for d in generated}:
        assert ({d["metadata"]["name"] for d in docs if d["kind"] == kind}
                >= {d["metadata"]["name"] for d in generated if d["kind"] == kind}), f"install.yaml lacks a {kind}"
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for d in docs:
        if d["kind"] not in cluster_scoped:
            assert d["metadata"].get("namespace") == NAMESPACE, f"{d['kind']} {d['metadata']['name']}"


def test_chart_crds_are_the_generated_crds():
    """Chart files/crds/ holds the generated CRDs, files/crd-policies/ the generated rest, byte for byte."""
    top = ROOT / "crds"
    copies = {p.name: p for d in (CHART / "files" / "crds", CHART / "files" / "crd-policies") for p in d.glob("*.yaml")}
    top_files = {p.name: p for p in top.glob("*.yaml")} if top.is_dir() else {}
    assert sorted(copies) == sorted(top_files), "chart CRDs differ from crds/: run scripts/render-manifests.sh"
    stale = [name for name in top_files if not filecmp.cmp(top_files[name], copies[name], shallow=False)]
    assert not stale, f"stale chart copies {stale}: run scripts/render-manifests.sh"
    for path in (CHART / "files" / "crds").glob("*.yaml"):
        assert {d["kind"] for d in yaml.safe_load_all(path.read_text()) if d} == {"CustomResourceDefinition"}
    # Helm installs a chart's crds/ once and never upgrades it: the CRDs must not sit there.
    assert not (CHART / "crds").exists(), "charts/rankops-operator/crds/ would never be upgraded: use files/crds/"


def generated_crds() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for p in (ROOT / "crds").glob("*.yaml")
            for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == "CustomResourceDefinition"}


@pytest.mark.parametrize("sets,installed,kept", [
    ((), True, True), (("crds.keep=false",), True, False), (("crds.install=false",), False, False)])
def test_crds_are_templates_with_the_keep_policy(sets, installed, kept):
    """Rendered as templates (so `helm upgrade` applies them), schema exactly as generated (no
    number turned into a float), the chart's labels, and the keep policy unless turned off."""
    crds = {o["metadata"]["name"]: o for o in by_kind(render(sets), "CustomResourceDefinition")
            if o["spec"]["group"] == "rankops.io"}
    if not installed:
        assert not by_kind(render(sets), "CustomResourceDefinition"), "nor kopf's peering CRDs"
        assert crds == {}
        return
    generated = generated_crds()
    assert sorted(crds) == sorted(generated)
    for name, crd in crds.items():
        assert crd["spec"] == generated[name]["spec"], f"{name}: the rendered schema differs from crds/"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        policy = crd["metadata"].get("annotations", {}).get("helm.sh/resource-policy")
        assert policy == ("keep" if kept else None), name


def test_helm_upgrade_applies_a_changed_crd_and_uninstall_keeps_it(tmp_path):
    """A real install and upgrade against the local control plane: the upgraded chart's CRD
    change reaches the cluster, and `helm uninstall` leaves the CRDs (and the RankingModels)."""
    import shutil

    from rankops_dev.controlplane import LocalControlPlane

    missing = [b for b in ("etcd", "kube-apiserver", "kubectl") if not os.access(BIN_DIR / b, os.X_OK)]
    if missing:
        pytest.fail(f"{missing} not in {BIN_DIR}: run dev/rankops_dev/build.sh first (CI does)")
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crds" / "rankingmodels.rankops.io.yaml"
    before = "description: Triton Inference Server image."
    assert before in crd_file.read_text()

    with LocalControlPlane(BIN_DIR, work_dir=tmp_path / "cp") as cp:
        env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig)}

        def tool(name: str, *args: str, stdin: str | None = None) -> str:
            done = subprocess.run([str(BIN_DIR / name), *args], capture_output=True, text=True, env=env,
                                  input=stdin, timeout=180)
            assert done.returncode == 0, f"{name} {' '.join(args)}: {done.stderr}"
            return done.stdout

        def triton_image_description() -> str:
            crd = json.loads(tool("kubectl", "get", "crd", "rankingmodels.rankops.io", "-o", "json"))
            spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            return spec["properties"]["tritonImage"]["description"]

        install = ("upgrade", "--install", "rankops", str(chart), "-n", NAMESPACE, "--create-namespace")
        tool("helm", *install)
        tool("kubectl", "wait", "--for=condition=Established", "--timeout=60s", "crd/rankingmodels.rankops.io")
        assert triton_image_description() == "Triton Inference Server image."

        crd_file.write_text(crd_file.read_text().replace(before, "description: Triton Inference Server image (v2)."))
        tool("helm", *install)
        assert triton_image_description() == "Triton Inference Server image (v2).", "helm upgrade left the old CRD"

        tool("kubectl", "create", "namespace", "reco")
        example = next(d for p in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
                       for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == "RankingModel")
        model = {**example, "metadata": {"name": "ctr", "namespace": "reco"}}
        tool("kubectl", "apply", "--server-side", "-f", "-", stdin=json.dumps(model))
        tool("helm", "uninstall", "rankops", "-n", NAMESPACE)
        assert json.loads(tool("kubectl", "get", "crd", "-o", "json"))["items"], "helm uninstall deleted the CRDs"
        assert tool("kubectl", "get", "rankingmodel", "ctr", "-n", "reco", "-o", "name").strip()


def _adoption_blocks() -> list[str]:
    """The bash blocks of docs/install.md's section on upgrading from a chart with crds/."""
    import re

    text = (ROOT / "docs" / "install.md").read_text()
    section = text.split("### Upgrading a release whose chart installed the CRDs from `crds/`", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


@pytest.mark.parametrize("block", [0, 1], ids=["label-and-annotate", "take-ownership"])
def test_a_release_of_the_crds_folder_chart_upgrades_as_docs_install_md_says(tmp_path, block):
    """Before the CRDs were templates the chart had them in crds/: such a release's first upgrade
    is refused for the CRDs' ownership, and each of the documented ways hands them to the release,
    applies the new schema and keeps the RankingModels."""
    import shutil

    from rankops_dev.controlplane import LocalControlPlane

    commands = _adoption_blocks()
    assert len(commands) == 2, commands
    old = tmp_path / "old-chart"
    shutil.copytree(CHART, old)
    (old / "templates" / "crds.yaml").unlink()
    (old / "crds").mkdir()
    for crd in (old / "files" / "crds").glob("*.yaml"):
        if crd.name.startswith("sharedservers."):    # came after the CRDs became templates
            crd.unlink()
            continue
        crd.rename(old / "crds" / crd.name)
    new = tmp_path / "charts" / "rankops-operator"      # where the documented commands name it
    shutil.copytree(CHART, new)
    crd_file = new / "files" / "crds" / "rankingmodels.rankops.io.yaml"
    crd_file.write_text(crd_file.read_text().replace("description: Triton Inference Server image.",
                                                     "description: Triton Inference Server image (v2)."))

    with LocalControlPlane(BIN_DIR, work_dir=tmp_path / "cp") as cp:
        env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "PATH": f"{BIN_DIR}:{os.environ['PATH']}"}

        def sh(script: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, input=stdin,
                                  capture_output=True, text=True, timeout=300)

        def ok(script: str, stdin: str | None = None) -> str:
            done = sh(script, stdin)
            assert done.returncode == 0, f"{script}\n{done.stderr}"
            return done.stdout

        ok(f"helm install rankops {old} -n {NAMESPACE} --create-namespace --set operator.replicas=1")
        ok("kubectl wait --for=condition=Established --timeout=60s crd/rankingmodels.rankops.io")
        ok("kubectl create namespace reco")
        example = yaml.safe_load((ROOT / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml").read_text())
        ok("kubectl apply --server-side -f -", stdin=json.dumps({**example, "metadata": {"name": "ctr", "namespace": "reco"}}))

        refused = sh(f"helm upgrade rankops charts/rankops-operator -n {NAMESPACE}")
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr, refused.stderr
        ok(commands[block])

        crd = json.loads(ok("kubectl get crd rankingmodels.rankops.io -o json"))
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert spec["properties"]["tritonImage"]["description"] == "Triton Inference Server image (v2)."
        annotations = crd["metadata"]["annotations"]
        assert annotations["meta.helm.sh/release-name"] == "rankops" and annotations["helm.sh/resource-policy"] == "keep"
        assert ok("kubectl get rankingmodel ctr -n reco -o name").strip() == "rankingmodel.rankops.io/ctr"
        ok(f"helm upgrade rankops charts/rankops-operator -n {NAMESPACE}")   # and the next upgrade is plain


def test_examples_parse_with_the_api_models_and_reference_each_other():
    from rankops.api.gpunodepool import GpuNodePool
    from rankops.api.rankingmodel import RankingModel
    from rankops.api.sharedserver import SharedServer

    parsed = []
    for path in sorted((ROOT / "manifests" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            model = {"RankingModel": RankingModel, "GpuNodePool": GpuNodePool, "SharedServer": SharedServer}[doc["kind"]]
            parsed.append(model.model_validate(doc))
    pools = {p.metadata["name"] for p in parsed if isinstance(p, GpuNodePool)}
    servers = {s.metadata["name"]: s for s in parsed if isinstance(s, SharedServer)}
    models = [m for m in parsed if isinstance(m, RankingModel)]
    assert pools and len(models) >= 2 and servers
    assert all(m.spec.node_pool in pools for m in models)
    assert all(s.spec.node_pool in pools for s in servers.values())
    members = [m for m in models if m.spec.server]
    assert len(members) >= 3 and all(m.spec.server in servers for m in members)
    assert any(m.spec.batching == "auto" and m.spec.planning is not None for m in models)
    assert any(m.spec.batching != "auto" for m in models)
    assert any("rollout" in m.model_fields_set or m.spec.rollout.model_fields_set for m in models)


def test_a_real_api_server_accepts_the_chart_and_enforces_the_own_node_policy(tmp_path):
    """Server-side apply against the local control plane (the schemas kubeconform would check,
    plus CEL compilation), then the validator's own-node policy judged by the API server."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from rankops_dev.controlplane import LocalControlPlane

    missing = [b for b in ("etcd", "kube-apiserver", "kubectl") if not os.access(BIN_DIR / b, os.X_OK)]
    if missing:
        pytest.fail(f"{missing} not in {BIN_DIR}: run dev/rankops_dev/build.sh first (CI does)")
    without_crds = {"SecurityContextConstraints", "ServiceMonitor", "PrometheusRule"}  # not served here
    rendered = [o for o in render(("watch.namespaces={reco}",) + ALL_OPTIONS) if o["kind"] not in without_crds]
    (tmp_path / "options.yaml").write_text(yaml.safe_dump_all(rendered))
    validator = "system:serviceaccount:rankops-system:rankops-operator-validator"

    with LocalControlPlane(BIN_DIR, work_dir=tmp_path / "cp") as cp:
        def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(BIN_DIR / "kubectl"), "--kubeconfig", str(cp.kubeconfig), *args],
                                  capture_output=True, text=True, input=stdin, timeout=120)

        done = kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "install.yaml"))
        assert done.returncode == 0, done.stderr
        assert kubectl("create", "namespace", "reco").returncode == 0
        done = kubectl("apply", "--server-side", "-f", str(tmp_path / "options.yaml"))
        assert done.returncode == 0, done.stderr
        for node in ("node-a", "node-b"):
            node_obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"team": "x"}}}
            assert kubectl("create", "-f", "-", stdin=json.dumps(node_obj)).returncode == 0

        as_validator_on_a = config.new_client_from_config(str(cp.kubeconfig))
        as_validator_on_a.set_default_header("Impersonate-User", validator)
        as_validator_on_a.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", "node-a")
        nodes = client.CoreV1Api(as_validator_on_a)

        def allowed(node: str, patch: dict) -> bool:
            try:
                nodes.patch_node(node, patch)
                return True
            except ApiException as exc:
                assert exc.status in (403, 422), exc.body
                return False

        deadline = time.monotonic() + 30  # policies take a moment to become active
        while allowed("node-b", {"metadata": {"labels": {"rankops.io/probe": "x"}}}):
            assert time.monotonic() < deadline, "the own-node policy never took effect"
            time.sleep(0.5)
        assert allowed("node-a", {"metadata": {"labels": {"rankops.io/gpu-ready": "true"},
                                               "annotations": {"rankops.io/report": "{}"}}})
        admin = client.CoreV1Api(config.new_client_from_config(str(cp.kubeconfig)))

        def with_taint(node: str, key: str, effect: str) -> dict:
            # A Node's taints are replaced whole by a patch: keep the ones already there (the node
            # lifecycle controller adds node.kubernetes.io/not-ready to these kubelet-less nodes
            # after a while, and dropping it is refused, rightly), as the validator does.
            existing = [admin.api_client.sanitize_for_serialization(t) for t in admin.read_node(node).spec.taints or []]
            return {"spec": {"taints": existing + [{"key": key, "effect": effect}]}}

        # Tried again if the controller's taint landed between the read and the patch.
        assert any(allowed("node-a", with_taint("node-a", "rankops.io/gpu-unvalidated", "NoSchedule"))
                   for _ in range(3))
        assert not allowed("node-a", {"metadata": {"labels": {"team": "y"}}})
        assert not allowed("node-a", with_taint("node-a", "other", "NoExecute"))
        assert not allowed("node-a", {"spec": {"unschedulable": True}}), "the validator never cordons"
        done = kubectl("auth", "can-i", "list", "secrets", "-A", "--as",
                       "system:serviceaccount:rankops-system:rankops-operator")
        assert done.stdout.strip() == "no"


def _template(*args: str) -> list[dict]:
    done = run_helm("template", "rankops", str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_helm_template_works_as_docs_install_md_writes_it():
    """No --kube-version: build.sh links helm with the Kubernetes version it builds, not v1.20."""
    objs = _template()
    assert one(objs, "Deployment")
    assert "helm template rankops charts/rankops-operator -n" in (ROOT / "docs" / "install.md").read_text()


@pytest.mark.parametrize("kube, rendered", [("1.27.0", False), ("1.29.9", False), ("1.30.0", True),
                                            (KUBE_VERSION, True)])
def test_admission_policies_render_only_where_their_api_is_ga(kube, rendered):
    objs = _template("--kube-version", kube, "--set", "validator.restrictToOwnNode=true")
    policies = {o["metadata"]["name"] for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")}
    assert bool(policies) == rendered, policies
    if rendered:  # the own-node, status and generated CRD policies, each with its binding
        assert len(policies) == 3 and len(by_kind(objs, "ValidatingAdmissionPolicyBinding")) == 3
    # A cluster that serves the v1 kind (helm install reads discovery) gets them at any version.
    served = _template("--kube-version", "1.29.0", "--api-versions",
                       "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    assert len(by_kind(served, "ValidatingAdmissionPolicy")) == 3


def test_image_pull_secrets_become_the_operators_flags_for_every_operand():
    from rankops.cli import build_parser

    objs = render(("imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=mirror"))
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    args = build_parser().parse_args(["run", *operator_container(objs)["args"]])
    assert args.image_pull_secret == ["regcred", "mirror"]
    assert build_parser().parse_args(["run", *operator_container(render(()))["args"]]).image_pull_secret == []


def _notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it: `helm template` skips it, so a copy of the chart
    renders it through `tpl` as an ordinary template."""
    chart = tmp_path / "chart"
    import shutil
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "notes-under-test.txt")
    (chart / "templates" / "notes.yaml").write_text(
        'kind: Notes\ntext: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}\n')
    done = run_helm("template", "rankops", str(chart), "--namespace", NAMESPACE,
                    "--show-only", "templates/notes.yaml", *args)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["text"]


def test_notes_say_what_was_installed_what_to_type_next_and_what_is_missing(tmp_path):
    plain = _notes(tmp_path / "a", "--kube-version", KUBE_VERSION)
    assert "Deployment rankops-operator " in plain and "watching every namespace" in plain
    assert "kubectl get rankingmodels -A" in plain and "kubectl explain rankingmodel.spec" in plain
    assert "ValidatingAdmissionPolicies" in plain and "WARNING" not in plain and "OpenShift" not in plain
    assert "2 replicas with kopf peering" in plain and "kubectl get clusterkopfpeering rankops-operator" in plain
    assert "(upgraded by `helm upgrade`)" in plain
    assert "one standalone replica" in _notes(tmp_path / "e", "--set", "operator.replicas=1")
    old = _notes(tmp_path / "b", "--kube-version", "1.29.0", "--set", "imagePullSecrets[0].name=regcred",
                 "--set", "watch.namespaces={reco}")
    assert "WARNING" in old and "Kubernetes 1.30+" in old and "watching namespaces reco" in old
    assert "image pull secrets regcred" in old
    detected = _notes(tmp_path / "c", "--api-versions", "security.openshift.io/v1")
    assert "--set openshift.enabled=true" in detected
    assert "SecurityContextConstraints are installed" in _notes(tmp_path / "d", "--set", "openshift.enabled=true")


def test_on_openshift_the_operator_lets_the_platform_assign_pod_uids():
    args = lambda objs: one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]  # noqa: E731
    assert "--platform-assigns-uids" in args(render(("openshift.enabled=true",)))
    assert "--platform-assigns-uids" not in args(render())


def test_fetcher_gates_and_validator_images_are_set_once_for_the_cluster_and_pinned_by_digest():
    """Issue 37: the images every model and pool runs besides Triton, by digest, from the chart."""
    from rankops.cli import build_parser
    from rankops.commands.render import tenant_policy

    digest = "sha256:" + "ab" * 32
    args = build_parser().parse_args(["run", *operator_container(render())["args"]])
    assert (args.fetcher_image, args.gates_image, args.validator_image) == (None, None, None), \
        "unset: each spec's own image"
    objs = render(tuple(f"{kind}.image.{key}={value}" for kind in ("fetcher", "gates", "validator")
                        for key, value in (("repository", f"registry.corp/ml/rankops-{kind}"), ("digest", digest))))
    args = build_parser().parse_args(["run", *operator_container(objs)["args"]])
    assert args.fetcher_image == f"registry.corp/ml/rankops-fetcher@{digest}"
    assert args.gates_image == f"registry.corp/ml/rankops-gates@{digest}"
    assert args.validator_image == f"registry.corp/ml/rankops-validator@{digest}"
    policy = tenant_policy(args)
    assert (policy.fetcher_image, policy.gates_image) == (args.fetcher_image, args.gates_image)
    bad = run_helm("template", "rankops", str(CHART), "--set", "gates.image.digest=latest")
    assert bad.returncode != 0 and "digest" in bad.stderr
