"""OpenShift's own SCC admission on every pod rankops makes, as OpenShift would judge it.

`sccadmit` (dev/rankops_dev/sccadmit: openshift/apiserver-library-go's admission plugin,
built by build.sh) runs what OpenShift's kube-apiserver does on a pod create: defaulting, the
ServiceAccount plugin, the SCC plugin's Admit and Validate, with the RBAC authorizer deciding who may
`use` which SCC. The cluster is OpenShift's bootstrap SCCs and their grants
(openshift-sccs/: cluster-kube-apiserver-operator's bindata/bootkube/scc-manifests, restricted-v2
and restricted-v3 granted to system:authenticated) plus what the chart installs with
openshift.enabled=true. Judged: the Triton Deployment with its fetch-model init container (as the
operator renders it with --platform-assigns-uids, which the chart passes on OpenShift), the gate
Jobs, the operator Deployment and the validator DaemonSet; and, so that each assertion can fail,
what OpenShift refused before issue 15 was fixed.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from rankops.api.gpunodepool import GpuNodePool
from rankops.api.rankingmodel import RankingModel
from rankops.commands.render import render_documents
from rankops.render.policy import TenantPolicy
from rankops.rollout.jobs import gate_job
from rankops.validator.daemonset import render_validator
from rankops_dev.binaries import bin_dir

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "rankops-operator"
SCCADMIT_SRC = ROOT / "dev" / "rankops_dev" / "sccadmit"
OPENSHIFT_SCCS = SCCADMIT_SRC / "openshift-sccs"
EXAMPLES = ROOT / "manifests" / "examples"
OPERATOR_NS, MODEL_NS = "rankops-system", "reco"
KUBE_VERSION = "1.34.0"
# What OpenShift's namespace-security-allocation controller writes on every namespace (a UID block of
# 10000 from 1000000000 up, the same block as groups, an MCS level): what restricted-v2 assigns from.
UID_BLOCKS = {MODEL_NS: (1000680000, "s0:c26,c15"), OPERATOR_NS: (1000700000, "s0:c26,c20")}


def source_hash(src: Path) -> str:
    """build.sh's sccadmit_hash: sha256sum lines of the Go sources, sorted by path, hashed."""
    files = sorted((p for p in src.rglob("*") if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))),
                   key=lambda p: ("./" + p.relative_to(src).as_posix()).encode())
    lines = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(src).as_posix()}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


@pytest.fixture(scope="module")
def sccadmit() -> Path:
    path = bin_dir() / "sccadmit"
    if not os.access(path, os.X_OK):
        pytest.fail(f"sccadmit not found at {path}: run dev/rankops_dev/build.sh (CI does)")
    built_from = (bin_dir() / "sccadmit.sha256").read_text().strip() if (bin_dir() / "sccadmit.sha256").exists() else ""
    if built_from != source_hash(SCCADMIT_SRC):
        pytest.fail(f"{path} was built from other sources than {SCCADMIT_SRC}: rerun build.sh")
    return path


def namespace(name: str) -> dict:
    start, mcs = UID_BLOCKS[name]
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": {
        "openshift.io/sa.scc.uid-range": f"{start}/10000",
        "openshift.io/sa.scc.supplemental-groups": f"{start}/10000",
        "openshift.io/sa.scc.mcs": mcs}}}


def admit(binary: Path, tmp_path: Path, docs: list[dict]) -> dict[tuple[str, str], dict]:
    """sccadmit's verdict per (kind, name) on `docs` in a cluster of OpenShift's SCCs."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump_all([namespace(MODEL_NS), namespace(OPERATOR_NS), *docs]))
    done = subprocess.run([str(binary), str(OPENSHIFT_SCCS), str(cluster)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    verdicts = [json.loads(line) for line in done.stdout.splitlines()]
    return {(v["kind"], v["name"]): v for v in verdicts}


def chart(*sets: str) -> list[dict]:
    helm = bin_dir() / "helm"
    args = [str(helm), "template", "rankops", str(CHART), "--namespace", OPERATOR_NS, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def serving(platform_assigns_uids: bool, **spec) -> list[dict]:
    """What the operator applies for the example model (an s3:// URI: a fetch-model init container)."""
    doc = yaml.safe_load((EXAMPLES / "rankingmodel-ctr-ranker.yaml").read_text())
    doc["spec"].update(spec)
    policy = TenantPolicy.from_settings(platform_assigns_uids=platform_assigns_uids)
    return [o for o in render_documents([("example", doc)], policy=policy) if o["kind"] == "Deployment"]


def gate_jobs() -> list[dict]:
    doc = yaml.safe_load((EXAMPLES / "rankingmodel-planned-rollout.yaml").read_text())
    with_torchscript = copy.deepcopy(doc)
    with_torchscript["metadata"]["name"] = "ctr-ranker-ts"
    with_torchscript["spec"]["rollout"]["equivalence"]["reference"] = {"torchscriptUri": "s3://models/ctr/model.pt"}
    jobs = []
    for d in (doc, with_torchscript):
        rm = RankingModel.model_validate(d)
        jobs += [gate_job(rm, gate, "5", "1", "4") for gate in ("warmup", "equivalence")]
    return jobs


def validator(service_account: str) -> dict:
    pool = GpuNodePool.model_validate(yaml.safe_load((EXAMPLES / "gpunodepool-t4.yaml").read_text()))
    [daemonset] = [o for o in render_validator(pool, namespace=OPERATOR_NS, service_account=service_account)
                   if o["kind"] == "DaemonSet"]
    return daemonset


def operator_arg(objs: list[dict], flag: str) -> str:
    [deployment] = [o for o in objs if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index(flag) + 1]


def assigned_uids(verdict: dict) -> set:
    return {c.get("runAsUser") for c in verdict["containers"].values()}


def test_in_place_pods_with_their_stage_sidecar_are_admitted_by_restricted_v2(sccadmit, tmp_path):
    """rollout.strategy inPlace: the stage-versions init container and the stage sidecar too."""
    [deployment] = serving(platform_assigns_uids=True, rollout={"strategy": "inPlace"})
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["stage-versions"] and "stage" in {
        c["name"] for c in pod["containers"]}
    v = admit(sccadmit, tmp_path, [deployment])[("Deployment", deployment["metadata"]["name"])]
    assert v["admitted"] and v["scc"] == "restricted-v2", v
    assert set(v["containers"]) == {c["name"] for c in pod["initContainers"] + pod["containers"]}
    assert assigned_uids(v) == {UID_BLOCKS[MODEL_NS][0]}, "the stager writes the volume as Triton's user"


def test_triton_pods_as_rendered_on_openshift_are_admitted_by_restricted_v2(sccadmit, tmp_path):
    [deployment] = serving(platform_assigns_uids=True)
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-model"]
    v = admit(sccadmit, tmp_path, [deployment])[("Deployment", deployment["metadata"]["name"])]
    assert v["admitted"] and v["scc"] == "restricted-v2", v
    # restricted-v2 gave every container the first UID of the namespace's block and the pod its group.
    start = UID_BLOCKS[MODEL_NS][0]
    assert set(v["containers"]) == {c["name"] for c in pod["initContainers"] + pod["containers"]}
    assert assigned_uids(v) == {start} and v["podSecurityContext"]["fsGroup"] == start
    assert v["podSecurityContext"]["seLinuxOptions"]["level"] == UID_BLOCKS[MODEL_NS][1]


def test_a_shared_servers_pods_are_admitted_by_restricted_v2(sccadmit, tmp_path):
    """The example SharedServer with its three members: Triton, the route and stage sidecars."""
    docs = [(f"example#{i}", d) for i, d in enumerate(yaml.safe_load_all((EXAMPLES / "sharedserver-ranking.yaml").read_text()))]
    policy = TenantPolicy.from_settings(platform_assigns_uids=True)
    [deployment] = [o for o in render_documents(docs, policy=policy) if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["triton", "route", "stage"]
    v = admit(sccadmit, tmp_path, [deployment])[("Deployment", deployment["metadata"]["name"])]
    assert v["admitted"] and v["scc"] == "restricted-v2", v
    assert set(v["containers"]) == {c["name"] for c in pod.get("initContainers", []) + pod["containers"]}
    assert assigned_uids(v) == {UID_BLOCKS[MODEL_NS][0]}, "the stager writes the volume as Triton's user"


def test_triton_pods_with_the_triton_server_user_are_refused_by_restricted_v2(sccadmit, tmp_path):
    """Without --platform-assigns-uids (the default elsewhere) the pods ask for UID and fsGroup
    1000, as they all did before issue 15: refused, and for that reason."""
    [deployment] = serving(platform_assigns_uids=False)
    v = admit(sccadmit, tmp_path, [deployment])[("Deployment", deployment["metadata"]["name"])]
    assert not v["admitted"], v
    assert "provider restricted-v2: .containers[0].runAsUser: Invalid value: 1000: must be in the ranges: " \
           "[1000680000, 1000689999]" in v["error"], v["error"]
    assert "provider restricted-v2: .spec.securityContext.fsGroup: Invalid value: [1000]: 1000 is not an allowed group" \
           in v["error"], v["error"]


def test_gate_jobs_are_admitted_by_restricted_v2(sccadmit, tmp_path):
    jobs = gate_jobs()
    assert any(c["name"] == "fetch-reference" for j in jobs for c in j["spec"]["template"]["spec"]["initContainers"])
    verdicts = admit(sccadmit, tmp_path, jobs)
    assert len(verdicts) == len(jobs) == 4
    start = UID_BLOCKS[MODEL_NS][0]
    for v in verdicts.values():
        assert v["admitted"] and v["scc"] == "restricted-v2", v
        assert v["requester"] == "system:serviceaccount:kube-system:job-controller"
        assert assigned_uids(v) == {start}, v


def test_operator_and_validator_pods_from_the_chart_are_admitted(sccadmit, tmp_path):
    objs = chart("openshift.enabled=true")
    [scc] = [o for o in objs if o["kind"] == "SecurityContextConstraints"]
    account = operator_arg(objs, "--validator-service-account")
    daemonset = validator(account)
    # The chart as `oc get ... -o yaml` would list it: one List.
    verdicts = admit(sccadmit, tmp_path, [{"apiVersion": "v1", "kind": "List", "items": objs}, daemonset])
    operator = verdicts[("Deployment", "rankops-operator")]
    assert operator["admitted"] and operator["scc"] == "restricted-v2", operator
    assert assigned_uids(operator) == {UID_BLOCKS[OPERATOR_NS][0]}
    v = verdicts[("DaemonSet", daemonset["metadata"]["name"])]
    assert v["admitted"] and v["scc"] == scc["metadata"]["name"] and v["serviceAccount"] == account, v
    # It runs as the type its container asks (spc_t), which the SCC left alone.
    [container] = v["containers"].values()
    assert container["seLinuxOptions"]["type"] == "spc_t" and container["readOnlyRootFilesystem"] is True


def test_the_validator_is_refused_without_the_charts_scc_or_its_grant(sccadmit, tmp_path):
    """Each thing the chart does for the validator is needed: the SCC's RunAsAny SELinux strategy
    (MustRunAs, as it was before, refuses spc_t), and the grant to the validator's account
    (restricted-v2 refuses its hostPath mount of /)."""
    objs = chart("openshift.enabled=true")
    account = operator_arg(objs, "--validator-service-account")
    must_run_as = copy.deepcopy(objs)
    for o in must_run_as:
        if o["kind"] == "SecurityContextConstraints":
            o["seLinuxContext"] = {"type": "MustRunAs"}
            name = o["metadata"]["name"]
    daemonset = validator(account)
    v = admit(sccadmit, tmp_path, [*must_run_as, daemonset])[("DaemonSet", daemonset["metadata"]["name"])]
    assert not v["admitted"], v
    assert f'provider {name}: .containers[0].seLinuxOptions.type: Invalid value: "spc_t"' in v["error"], v["error"]

    elsewhere = validator("default")
    v = admit(sccadmit, tmp_path, [*objs, elsewhere])[("DaemonSet", elsewhere["metadata"]["name"])]
    assert not v["admitted"] and f'provider "{name}": Forbidden: not usable by user or serviceaccount' in v["error"], v
    # (upstream names no provider on this one error)
    assert 'spec.volumes[0]: Invalid value: "hostPath": hostPath volumes are not allowed to be used' in v["error"], v["error"]
