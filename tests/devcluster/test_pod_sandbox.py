"""The process node's pure decisions (dev/rankops_dev/pod_sandbox.py): what a container sees and runs."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rankops_dev import pod_sandbox as sandbox
from rankops_dev.pod_sandbox import BindMount, SandboxError

POD = {"metadata": {"name": "web-1", "namespace": "reco", "uid": "u-1", "labels": {"app": "web"},
                    "annotations": {"a/b": "c"}},
       "spec": {"serviceAccountName": "gate"}}


@pytest.mark.parametrize("image, kind", [
    ("nvcr.io/nvidia/tritonserver:24.05-py3", "triton"),
    ("registry.local:5000/mirror/tritonserver@sha256:abc", "triton"),
    ("quay.io/rankops/rankops:0.1.0", "rankops"),
    ("quay.io/rankops/rankops-gates:0.1.0", "rankops"),
    ("docker.io/library/nginx:1.27", None),
    ("tritonserver-like/other:1", None),
])
def test_images_map_to_a_stand_in_by_repository_name(image, kind):
    assert sandbox.image_kind(image) == kind


def test_expansion_follows_kubernetes():
    env = {"NODE_NAME": "n1", "A": "x"}
    assert sandbox.expand("--node=$(NODE_NAME)", env) == "--node=n1"
    assert sandbox.expand("$(MISSING) $$(A) $(A)", env) == "$(MISSING) $(A) x"


def test_environment_order_and_sources():
    container = {"envFrom": [{"secretRef": {"name": "creds"}, "prefix": "S3_"}, {"configMapRef": {"name": "opt", "optional": True}}],
                 "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "URL", "value": "http://$(IP):8000"},
                         {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "KEY"}}},
                         {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                         {"name": "PATH", "value": "/x"}]}
    env = sandbox.container_env(container, POD, {"PATH": "/usr/bin", "HOME": "/root"}, {}, {"creds": {"KEY": "k"}},
                                "127.77.0.9", "node-a")
    assert env == {"PATH": "/x", "HOME": "/root", "S3_KEY": "k", "IP": "127.77.0.9",
                   "URL": "http://127.77.0.9:8000", "KEY": "k", "APP": "web"}


def test_a_missing_required_source_is_a_config_error_naming_it():
    with pytest.raises(SandboxError) as caught:
        sandbox.container_env({"envFrom": [{"secretRef": {"name": "creds"}}]}, POD, {}, {}, {}, "127.0.0.2", "n")
    assert caught.value.reason == "CreateContainerConfigError" and '"creds" not found' in caught.value.message
    with pytest.raises(SandboxError, match="couldn't find key X"):
        sandbox.container_env({"env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "X"}}}]},
                              POD, {}, {"c": {"Y": "1"}}, {}, "127.0.0.2", "n")


def test_command_line_defaults_to_the_images_entrypoint_and_expands():
    env = {"NODE": "n1"}
    assert sandbox.command_line({"image": "quay.io/rankops/rankops:1", "args": ["validate-node", "--node", "$(NODE)"]},
                                env) == ["rankops", "validate-node", "--node", "n1"]
    assert sandbox.command_line({"image": "x/tritonserver:1", "command": ["tritonserver"], "args": ["--a"]}, env) == \
        ["tritonserver", "--a"]


def test_mounts_come_parents_first_and_subpaths_stay_inside_their_volume(tmp_path):
    dirs = {"repo": tmp_path / "repo", "config": tmp_path / "config"}
    container = {"volumeMounts": [
        {"name": "config", "mountPath": "/models/m/config.pbtxt", "subPath": "config.pbtxt", "readOnly": True},
        {"name": "repo", "mountPath": "/models"}]}
    assert sandbox.volume_mounts(container, dirs) == [
        BindMount(tmp_path / "repo", "/models"),
        BindMount(tmp_path / "config" / "config.pbtxt", "/models/m/config.pbtxt", True)]
    with pytest.raises(SandboxError, match="no '..'"):
        sandbox.volume_mounts({"volumeMounts": [{"name": "repo", "mountPath": "/x", "subPath": "../../etc"}]}, dirs)
    with pytest.raises(SandboxError, match="names no volume"):
        sandbox.volume_mounts({"volumeMounts": [{"name": "other", "mountPath": "/x"}]}, dirs)


def _host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    for d in ("usr/bin", "etc", "opt/tool", "var/lib", "proc", "tmp", "run", "dev"):
        (root / d).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "var/run").symlink_to("../run")
    (root / "etc/hosts").write_text("")
    return root


def _ops(args: list[str]) -> list[tuple[str, ...]]:
    arity = {"--symlink": 2, "--ro-bind": 2, "--bind": 2, "--dir": 1, "--proc": 1, "--dev": 1, "--tmpfs": 1}
    ops, i = [], 0
    while i < len(args):
        n = arity[args[i]]
        ops.append(tuple(args[i:i + n + 1]))
        i += n + 1
    return ops


def test_the_root_is_bound_read_only_except_where_mounts_go(tmp_path):
    root = _host(tmp_path)
    ops = _ops(sandbox.root_binds(["/opt/tritonserver/backends", "/models"], root))
    assert ("--symlink", "usr/bin", "/bin") in ops
    assert ("--ro-bind", str(root / "usr"), "/usr") in ops and ("--ro-bind", str(root / "etc"), "/etc") in ops
    # /opt has a mount under it: made as a directory, its entries bound one by one, in that order.
    assert ops.index(("--dir", "/opt")) < ops.index(("--ro-bind", str(root / "opt/tool"), "/opt/tool"))
    assert ("--ro-bind", str(root / "opt"), "/opt") not in ops
    # The container's own /proc, /dev, /tmp, /run; the host's are never bound.
    assert {("--proc", "/proc"), ("--dev", "/dev"), ("--tmpfs", "/tmp"), ("--tmpfs", "/run")} <= set(ops)
    assert not [op for op in ops if op[-1] in ("/proc", "/dev", "/tmp", "/run") and op[0] == "--ro-bind"]


def test_mount_points_behind_a_host_symlink_are_made_where_the_link_points(tmp_path):
    root = _host(tmp_path)
    assert sandbox.host_target("/var/run/secrets/kubernetes.io/serviceaccount", root) == \
        "/run/secrets/kubernetes.io/serviceaccount"
    assert sandbox.host_target("/models/m/config.pbtxt", root) == "/models/m/config.pbtxt"


def test_the_bwrap_command_line_really_builds_the_containers_view(tmp_path):
    """On this machine: the container sees its volume at /models, its own /etc/hosts, writes its
    termination message, and cannot write the host's /usr."""
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "cfg").write_text("config\n")
    hosts, term = tmp_path / "hosts", tmp_path / "term"
    hosts.write_text(sandbox.hosts_file("pod-a", "127.77.0.5", "reco", {("reco", "web"): ["127.77.0.6"]}))
    term.write_text("")
    script = ("cat /models/m/config.pbtxt && getent hosts web.reco.svc && echo done > /dev/termination-log "
              "&& ! touch /usr/rankops-probe 2>/dev/null && touch /models/written && hostname")
    argv = sandbox.bwrap_argv(["sh", "-c", script],
                              [BindMount(models, "/models"), BindMount(tmp_path / "cfg", "/models/m/config.pbtxt", True)],
                              hosts, term, "/dev/termination-log", "pod-a")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["config", "127.77.0.6      web.reco.svc.cluster.local web.reco.svc web.reco web",
                                        "pod-a"]
    assert term.read_text() == "done\n" and (models / "written").exists() and not Path("/models").exists()


def test_hosts_name_services_as_cluster_dns_would():
    text = sandbox.hosts_file("p", "127.77.0.2", "reco", {("reco", "ranker-canary"): ["127.77.0.3", "127.77.0.4"],
                                                          ("other", "api"): ["127.77.0.9"]})
    assert "127.77.0.3\tranker-canary.reco.svc.cluster.local ranker-canary.reco.svc ranker-canary.reco ranker-canary" in text
    assert "127.77.0.9\tapi.other.svc.cluster.local api.other.svc api.other\n" in text  # no short name across namespaces
    assert "127.77.0.2\tp" in text


def test_services_resolve_to_ready_loopback_pods_only():
    def pod(name, ip, ready, labels, namespace="reco", deleting=False):
        meta = {"name": name, "namespace": namespace, "labels": labels}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        return {"metadata": meta, "status": {"podIP": ip, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]}}
    services = [{"metadata": {"name": "web", "namespace": "reco"}, "spec": {"selector": {"app": "web"}}},
                {"metadata": {"name": "headless", "namespace": "reco"}, "spec": {}}]
    pods = [pod("a", "127.77.0.2", True, {"app": "web", "x": "1"}), pod("b", "127.77.0.3", False, {"app": "web"}),
            pod("c", "10.244.0.5", True, {"app": "web"}), pod("d", "127.77.0.4", True, {"app": "web"}, "other"),
            pod("e", "127.77.0.5", True, {"app": "web"}, deleting=True)]
    assert sandbox.service_addresses(services, pods) == {("reco", "web"): ["127.77.0.2"]}


@pytest.mark.parametrize("policy, exits, phase", [
    ("Never", [None], "Running"), ("Never", [0, 0], "Succeeded"), ("Never", [0, 3], "Failed"),
    ("OnFailure", [1], "Running"), ("OnFailure", [0], "Succeeded"), ("Always", [0], "Running"),
    ("Always", [], "Pending"),
])
def test_pod_phase_follows_the_restart_policy(policy, exits, phase):
    assert sandbox.pod_phase(policy, False, exits) == phase


def test_a_failed_init_container_fails_a_never_restarting_pod():
    assert sandbox.pod_phase("Never", True, []) == "Failed"
    assert sandbox.pod_phase("Always", True, []) == "Pending"


def test_termination_message_falls_back_to_the_log_only_when_asked_and_failed():
    log = "\n".join(f"line {i}" for i in range(200))
    assert sandbox.termination_message("verdict", log, 1, "FallbackToLogsOnError") == "verdict"
    assert sandbox.termination_message("", log, 1, "FallbackToLogsOnError").splitlines() == \
        [f"line {i}" for i in range(120, 200)]
    assert sandbox.termination_message("", log, 0, "FallbackToLogsOnError") == ""
    assert sandbox.termination_message("", log, 1, None) == ""
    assert len(sandbox.termination_message("x" * 10000, "", 0, None)) == sandbox.TERMINATION_MESSAGE_LIMIT


def test_program_directories_hidden_by_the_containers_tmp_are_bound_back(tmp_path):
    venv = tmp_path / "clone" / ".venv"
    venv.mkdir(parents=True)
    mounts = sandbox.program_mounts([venv, venv / "lib", tmp_path / "clone", Path("/usr"), Path("/work")])
    assert mounts == [BindMount(tmp_path / "clone", str(tmp_path / "clone"), True)]


def test_a_condition_keeps_its_transition_time_until_it_flips():
    first = sandbox.condition("Ready", False, "t1", "ContainersNotReady")
    same = sandbox.condition("Ready", False, "t2", "ContainersNotReady", first)
    flipped = sandbox.condition("Ready", True, "t3", None, same)
    assert (first["lastTransitionTime"], same["lastTransitionTime"], flipped["lastTransitionTime"]) == ("t1", "t1", "t3")
    assert "reason" not in flipped and same["reason"] == "ContainersNotReady"
