"""The process node itself: pods bound to it really run (rankops_dev/pod_runner.py).

What the rest of the suite relies on when it runs Triton and the gates for real: volumes at the
container's paths, the environment, Service names that resolve to Ready pods, probes that decide
readiness and restarts, exit codes and termination messages that decide a Job, deletion that
stops the processes.
"""
from __future__ import annotations

import os
import time

from e2e.support import wait_for

IMAGE = "quay.io/rankops/rankops:0.1.0"  # the rankops image: this project's own entry point


def _pod(k8s, namespace, name):
    return k8s.core.read_namespaced_pod(name, namespace)


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _web(name: str, labels: dict, readiness_file: str | None = None, liveness_file: str | None = None) -> dict:
    """A pod serving HTTP on its pod IP; optional probes that pass while a file exists."""
    container = {
        "name": "web", "image": IMAGE,
        "command": ["python", "-m", "http.server", "8000", "--bind", "$(POD_IP)", "--directory", "/srv"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": 8000}],
        "volumeMounts": [{"name": "srv", "mountPath": "/srv"}],
    }
    if readiness_file:
        container["readinessProbe"] = {"httpGet": {"path": f"/{readiness_file}", "port": "http"}, "periodSeconds": 1,
                                       "failureThreshold": 1}
    if liveness_file:
        container["livenessProbe"] = {"exec": {"command": ["test", "-e", f"/srv/{liveness_file}"]},
                                      "periodSeconds": 1, "failureThreshold": 2}
    init = {"name": "content", "image": IMAGE, "command": ["sh", "-c", "echo ok > /srv/healthy; echo ok > /srv/alive"],
            "volumeMounts": [{"name": "srv", "mountPath": "/srv"}]}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"initContainers": [init], "containers": [container], "volumes": [{"name": "srv", "emptyDir": {}}]}}


def test_a_job_sees_its_volumes_env_and_services_and_its_exit_decides_it(k8s, real_namespace, process_node):
    ns = real_namespace
    k8s.core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"},
                                               "data": {"greeting": "hello", "unused": "x"}})
    k8s.core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"TOKEN": "s3cr3t"}})
    k8s.core.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}})
    k8s.core.create_namespaced_pod(ns, _web("web", {"app": "web"}))
    wait_for(lambda: _ready(_pod(k8s, ns, "web")), 60, "the web pod Ready")
    web = _pod(k8s, ns, "web")
    assert web.spec.node_name == process_node.name and web.status.pod_ip.startswith("127.")
    assert [s.state.terminated.exit_code for s in web.status.init_container_statuses] == [0]

    script = ("import os, urllib.request\n"
              "print(open('/etc/app/greeting.txt').read(), os.environ['TOKEN'], os.environ['NODE'])\n"
              "assert not os.path.exists('/etc/app/unused')\n"
              "body = urllib.request.urlopen('http://web.%s.svc:8000/healthy', timeout=5).read().decode()\n"
              "open('/dev/termination-log', 'w').write('served ' + body.strip())\n"
              "raise SystemExit(int(os.environ['EXIT']))\n" % ns)

    def job(name: str, code: int) -> dict:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
            "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": IMAGE, "command": ["python", "-c", script],
                "env": [{"name": "EXIT", "value": str(code)},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "envFrom": [{"secretRef": {"name": "creds"}}],
                "volumeMounts": [{"name": "settings", "mountPath": "/etc/app"}]}],
                "volumes": [{"name": "settings", "configMap": {
                    "name": "settings", "items": [{"key": "greeting", "path": "greeting.txt"}]}}]}}}}

    k8s.batch.create_namespaced_job(ns, job("passes", 0))
    k8s.batch.create_namespaced_job(ns, job("fails", 3))
    wait_for(lambda: k8s.batch.read_namespaced_job("passes", ns).status.succeeded, 60, "Job passes Complete")
    wait_for(lambda: k8s.batch.read_namespaced_job("fails", ns).status.failed, 60, "Job fails Failed")

    def terminated(job_name):
        pod = k8s.core.list_namespaced_pod(ns, label_selector=f"job-name={job_name}").items[0]
        return pod.status.container_statuses[0].state.terminated
    passed, failed = terminated("passes"), terminated("fails")
    assert (passed.exit_code, passed.message) == (0, "served ok")
    assert (failed.exit_code, failed.message) == (3, "served ok")
    logs = process_node.pod_logs(ns, k8s.core.list_namespaced_pod(ns, label_selector="job-name=passes").items[0]
                                 .metadata.name)
    assert f"hello s3cr3t {process_node.name}" in logs["main"], logs


def test_probes_decide_readiness_and_restarts_and_deletion_stops_the_processes(k8s, real_namespace, process_node):
    ns = real_namespace
    k8s.core.create_namespaced_pod(ns, _web("probed", {"app": "probed"}, readiness_file="healthy",
                                            liveness_file="alive"))
    wait_for(lambda: _ready(_pod(k8s, ns, "probed")), 60, "the probed pod Ready")
    pod_dir = next((process_node.work_dir / "pods").glob(f"{ns}_probed_*"))
    srv = pod_dir / "volumes" / "srv"

    (srv / "healthy").unlink()  # readiness fails: not Ready, not restarted
    wait_for(lambda: not _ready(_pod(k8s, ns, "probed")), 30, "the pod NotReady once /healthy is gone")
    assert _pod(k8s, ns, "probed").status.container_statuses[0].restart_count == 0
    (srv / "healthy").write_text("ok\n")
    wait_for(lambda: _ready(_pod(k8s, ns, "probed")), 30, "Ready again")

    (srv / "alive").unlink()  # liveness (an exec probe in the container's namespace) fails: restarted
    status = wait_for(lambda: (s := _pod(k8s, ns, "probed").status.container_statuses[0]).restart_count >= 1 and s,
                      60, "a restart after the liveness probe failed")
    assert status.last_state.terminated is not None
    (srv / "alive").write_text("ok\n")
    wait_for(lambda: _ready(_pod(k8s, ns, "probed")), 60, "Ready after the restart")

    pid = int(_pod(k8s, ns, "probed").status.container_statuses[0].container_id.split("://")[1])
    os.kill(pid, 0)  # the process runs now
    k8s.core.delete_namespaced_pod("probed", ns)
    wait_for(lambda: not k8s.core.list_namespaced_pod(ns, field_selector="metadata.name=probed").items, 60,
             "the pod gone")
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{pid}"), "the deleted pod's process still runs"


def test_an_image_without_a_local_stand_in_waits_with_the_reason(k8s, real_namespace):
    ns = real_namespace
    k8s.core.create_namespaced_pod(ns, {"metadata": {"name": "other"}, "spec": {"containers": [
        {"name": "c", "image": "docker.io/library/nginx:1.27"}]}})
    waiting = wait_for(lambda: (w := _pod(k8s, ns, "other").status.container_statuses) and
                       w[0].state.waiting and w[0].state.waiting.reason == "ErrImageNeverPull" and w[0].state.waiting,
                       30, "the pod waiting with ErrImageNeverPull")
    assert "nginx" in waiting.message and "no local stand-in" in waiting.message


def test_a_claim_bound_to_a_host_directory_is_mounted_with_its_subpath(k8s, real_namespace, process_node, tmp_path):
    ns = real_namespace
    shared = tmp_path / "volume" / "models"
    shared.mkdir(parents=True)
    (shared / "weights.txt").write_text("v3 weights\n")
    pv = f"{ns}-pv"
    k8s.core.create_persistent_volume({"metadata": {"name": pv}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
        "hostPath": {"path": str(tmp_path / "volume")}, "persistentVolumeReclaimPolicy": "Retain"}})
    try:
        k8s.core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": "models"}, "spec": {
            "accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: k8s.core.read_namespaced_persistent_volume_claim("models", ns).status.phase == "Bound", 60,
                 "the claim Bound")
        k8s.core.create_namespaced_pod(ns, {"metadata": {"name": "reader"}, "spec": {
            "restartPolicy": "Never", "containers": [{
                "name": "read", "image": IMAGE, "command": ["cat", "/models/3/weights.txt"],
                "volumeMounts": [{"name": "m", "mountPath": "/models/3", "subPath": "models", "readOnly": True}]}],
            "volumes": [{"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]}})
        wait_for(lambda: _pod(k8s, ns, "reader").status.phase == "Succeeded", 60, "the reader pod Succeeded")
        assert "v3 weights" in process_node.pod_logs(ns, "reader")["read"]
    finally:
        k8s.core.delete_persistent_volume(pv)


def test_a_pod_on_one_process_node_calls_a_service_whose_pods_run_on_another(k8s, cluster, real_namespace,
                                                                             process_node, tmp_path):
    from rankops_dev.process_nodes import ProcessNode

    ns = real_namespace
    with ProcessNode(cluster.kubeconfig, "process-1", tmp_path / "process-1") as other:
        web = _web("far-web", {"app": "far"})
        web["spec"]["nodeName"] = other.name
        k8s.core.create_namespaced_service(ns, {"metadata": {"name": "far"}, "spec": {
            "selector": {"app": "far"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}})
        k8s.core.create_namespaced_pod(ns, web)
        wait_for(lambda: _ready(_pod(k8s, ns, "far-web")), 60, "the web pod on process-1 Ready")
        k8s.core.create_namespaced_pod(ns, {"metadata": {"name": "caller"}, "spec": {
            "nodeName": process_node.name, "restartPolicy": "Never", "containers": [{
                "name": "call", "image": IMAGE, "command": ["python", "-c",
                "import urllib.request; print(urllib.request.urlopen('http://far:8000/healthy', timeout=5).read())"]}]}})
        wait_for(lambda: _pod(k8s, ns, "caller").status.phase in ("Succeeded", "Failed"), 60, "the caller finished")
        assert _pod(k8s, ns, "caller").status.phase == "Succeeded", process_node.pod_logs(ns, "caller")
        assert _pod(k8s, ns, "far-web").status.pod_ip.split(".")[:2] != \
            _pod(k8s, ns, "caller").status.pod_ip.split(".")[:2]  # two runners, two address blocks
        k8s.core.delete_namespaced_pod("far-web", ns)
        wait_for(lambda: not k8s.core.list_namespaced_pod(ns, field_selector="metadata.name=far-web").items, 60,
                 "far-web gone before its node stops")
    k8s.core.delete_node("process-1")
