"""A tenant's RankingModel gets no host path and no image the cluster admin has not allowed:
`file://` only under the admin's directories (never / or system trees), image prefixes when
listed, and no rendered volume beyond emptyDir, ConfigMap, PVC and the allowed hostPath."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import yaml

from rankops.api.rankingmodel import RankingModel
from rankops.commands.render import InputError, load_documents, render_documents
from rankops.render.desired import RenderError, ServingState, desired_objects, resolve_shape
from rankops.render.policy import (PolicyError, TenantPolicy, allowed_dir, normalise_image, pod_volume_problems,
                                   spec_problems)
from rankops.rollout.jobs import gate_job

HERE = pathlib.Path(__file__).parent
CASES = sorted(p for p in (HERE / "cases").glob("*.yaml") if p.name != "pools.yaml")
LAB = TenantPolicy.from_settings(["/srv/models"])


def _model(uri: str = "s3://m/3", **spec) -> RankingModel:
    doc = yaml.safe_load((HERE / "cases" / "onnx-fp16-pooled.yaml").read_text())
    doc["spec"].update(versions=[{"name": "3", "modelUri": uri, "format": "onnx"}], nodePool=None, **spec)
    return RankingModel.model_validate(doc)


def _render(rm: RankingModel, policy: TenantPolicy) -> list[dict]:
    return desired_objects(rm, ServingState(stable_version="3"), resolve_shape(rm.spec), None, policy)


def _pod(objects: list[dict]) -> dict:
    return next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("text", ["/", "//", "/etc", "/etc/", "/etc/ssl/models", "/proc", "/sys/fs", "/dev",
                                  "/usr/local/models", "/var", "/var/lib", "/var/run", "/run/models", "/root",
                                  "/boot", "/srv/../etc", "/srv/models/../../usr", "/var/lib/kubelet/pods",
                                  "srv/models", ""])
def test_admin_dirs_are_never_the_root_or_a_system_tree(text):
    with pytest.raises(PolicyError, match="--allow-file-uri-dir"):
        allowed_dir(text)


def test_admin_dirs_are_normalised():
    assert [allowed_dir(d) for d in ("/srv/models/", "/srv/./models", "/var/lib/models", "/opt/a/../models")] == \
        ["/srv/models", "/srv/models", "/var/lib/models", "/opt/models"]
    assert TenantPolicy.from_settings(["/srv/models", "/srv/models/"]).file_uri_dirs == ("/srv/models",)


@pytest.mark.parametrize("uri", ["file:///etc/shadow", "file:///", "file:///srv/models/../../etc",
                                 "file:///srv/models/../modelsX", "file:///srv/modelsX/1",
                                 "file://node-a/srv/models/1", "file:///srv/models/1?x=1", "file:/srv/models/1#x"])
def test_file_uris_outside_the_admins_dirs_are_refused(uri):
    with pytest.raises(PolicyError):
        LAB.host_path(uri)
    with pytest.raises(PolicyError):
        TenantPolicy().host_path(uri)


def test_file_uris_inside_them_mount_the_normalised_path():
    assert LAB.host_path("file:///srv/models/ctr/./3/") == "/srv/models/ctr/3"
    assert LAB.host_path("file:///srv/models/a/../ctr/3") == "/srv/models/ctr/3"
    assert LAB.host_path("file:///srv/models") == "/srv/models"


def test_rendering_a_refused_file_uri_names_the_field_and_mounts_nothing():
    rm = _model("file:///etc")
    with pytest.raises(RenderError, match=r"spec\.versions\[0\]\.modelUri: file:///etc would mount the node's /etc"):
        _render(rm, TenantPolicy())   # before: a hostPath of /etc in the model's pods
    [problem] = spec_problems(rm.spec, TenantPolicy())
    assert problem.startswith("spec.versions[0].modelUri: ") and "--allow-file-uri-dir" in problem
    assert "pvc://" in problem and "file:// is off on this cluster" in problem, "the message says what to do"


def test_an_allowed_file_uri_mounts_read_only_at_the_version_directory():
    pod = _pod(_render(_model("file:///srv/models/../models/ctr/3"), LAB))
    [artifact] = [v for v in pod["volumes"] if v["name"] == "artifact"]
    assert artifact == {"name": "artifact", "hostPath": {"path": "/srv/models/ctr/3", "type": "Directory"}}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "artifact")
    assert mount["readOnly"] is True
    assert pod_volume_problems(_render(_model("file:///srv/models/ctr/3"), LAB), LAB) == []


@pytest.mark.parametrize("image, full", [
    ("tritonserver:24.05", "docker.io/library/tritonserver:24.05"),
    ("nvidia/tritonserver", "docker.io/nvidia/tritonserver"),
    ("nvcr.io/nvidia/tritonserver:24.05-py3", "nvcr.io/nvidia/tritonserver:24.05-py3"),
    ("localhost/triton", "localhost/triton"), ("registry:5000/triton", "registry:5000/triton")])
def test_image_names_are_read_as_the_runtime_reads_them(image, full):
    assert normalise_image(image) == full


def test_images_must_start_with_an_allowed_prefix_when_the_admin_lists_any():
    policy = TenantPolicy.from_settings(image_prefixes=["nvcr.io/nvidia", "registry.corp/ml/", "docker.io/library/"])
    allowed = ("nvcr.io/nvidia/tritonserver:24.05-py3", "registry.corp/ml/rankops:1", "tritonserver:24")
    refused = ("nvcr.io/nvidia-evil/x", "nvcr.io.evil.com/nvidia/x", "quay.io/rankops/rankops:0.1.0",
               "registry.corp/mlx/x", "evil/nvcr.io/nvidia")
    assert [policy.image_allowed(i) for i in allowed] == [True] * 3
    assert [policy.image_allowed(i) for i in refused] == [False] * 5
    assert TenantPolicy().image_allowed("anything.example/x:1"), "no prefixes: any image"
    with pytest.raises(PolicyError, match="empty prefix"):
        TenantPolicy.from_settings(image_prefixes=[" "])


def test_every_image_field_of_a_spec_is_checked_and_named():
    policy = TenantPolicy.from_settings(image_prefixes=["registry.corp/"])
    rm = _model(tritonImage="registry.corp/triton:24", fetcherImage="evil.example/fetch:1",
                rollout={"gateJobs": {"image": "quay.io/rankops/rankops:0.1.0"}})
    fields = [p.split(":")[0] for p in spec_problems(rm.spec, policy)]
    assert fields == ["spec.fetcherImage", "spec.rollout.gateJobs.image"]
    assert spec_problems(rm.spec, TenantPolicy()) == []


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_rendered_objects_bring_no_volume_a_tenant_may_not_have(case):
    """Serving, reference and gate pods of every sample: emptyDir, ConfigMap and PVC only."""
    rm = RankingModel.model_validate(yaml.safe_load(case.read_text()))
    rm.metadata.setdefault("namespace", "default")
    objects = desired_objects(rm, ServingState(stable_version=rm.spec.version), resolve_shape(rm.spec))
    objects += [gate_job(rm, gate, rm.spec.version, "a1", rm.spec.version) for gate in ("warmup", "equivalence")]
    assert pod_volume_problems(objects, TenantPolicy()) == []


def test_a_foreign_volume_is_caught_by_the_backstop():
    objects = _render(_model(), TenantPolicy())
    pod = _pod(objects)
    pod["volumes"] += [{"name": "host", "hostPath": {"path": "/srv/models/../../etc"}},
                       {"name": "token", "projected": {"sources": []}}]
    problems = pod_volume_problems(objects, LAB)
    assert len(problems) == 2 and "volume host (hostPath)" in problems[0] and "volume token (projected)" in problems[1]


def test_rankops_render_applies_the_same_policy(tmp_path):
    doc = yaml.safe_load((HERE / "cases" / "onnx-fp16-pooled.yaml").read_text())
    doc["spec"].update(nodePool=None, versions=[{"name": "3", "modelUri": "file:///srv/models/3", "format": "onnx"}])
    path = tmp_path / "rm.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"spec\.versions\[0\]\.modelUri"):
        render_documents(load_documents([str(path)]))
    assert render_documents(load_documents([str(path)]), policy=LAB)
    done = subprocess.run([sys.executable, "-m", "rankops", "render", "-f", str(path), "--allow-file-uri-dir",
                           "/srv/models"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "path: /srv/models/3" in done.stdout, done.stderr


def test_rankops_run_refuses_to_start_with_a_system_directory():
    done = subprocess.run([sys.executable, "-m", "rankops", "run", "--allow-file-uri-dir", "/srv/../etc"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "/etc" in done.stderr and "system tree" in done.stderr, done.stderr


def test_the_operator_reports_a_refused_uri_as_degraded_and_writes_nothing():
    from rankops.controller import models

    rm = _model("file:///etc")
    body = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel",
            "metadata": {"name": "ctr", "namespace": "reco", "uid": "u1", "generation": 3},
            "spec": rm.spec.to_wire(),
            "status": {"stableVersion": "3", "phase": "Ready"}}
    from tests.fakecluster import FakeCluster

    cluster = FakeCluster()   # nothing exists
    result = models.reconcile(cluster, body, policy=TenantPolicy())
    assert [c for c in cluster.calls if c.method not in ("get", "exists", "list")] == [], "nothing written"
    degraded = next(c for c in result.status.to_wire()["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", models.POLICY_REASON)
    assert degraded["message"].startswith("spec.versions[0].modelUri: file:///etc would mount the node's /etc")
    assert result.status.to_wire()["stableVersion"] == "3" and result.status.to_wire()["observedGeneration"] == 3
    assert [e.reason for e in result.events] == [models.POLICY_REASON]


def _user_fields(pod: dict) -> list[str]:
    found = [f"pod.{k}" for k in ("runAsUser", "fsGroup") if k in pod.get("securityContext", {})]
    for container in pod.get("initContainers", []) + pod["containers"]:
        found += [f"{container['name']}.runAsUser"] if "runAsUser" in container.get("securityContext", {}) else []
    return found


def test_where_the_platform_assigns_uids_triton_pods_name_none_and_stay_restricted():
    """OpenShift's restricted-v2 gives the UID and fsGroup from the namespace's range and refuses
    1000; elsewhere NVIDIA's images would run as root without the triton-server user."""
    rm = _model()
    pod = _pod(_render(rm, TenantPolicy()))
    assert _user_fields(pod) == ["pod.runAsUser", "pod.fsGroup", "triton.runAsUser"]
    pod = _pod(_render(rm, TenantPolicy.from_settings(platform_assigns_uids=True)))
    assert _user_fields(pod) == []
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in pod.get("initContainers", []) + pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}, container
