"""`python -m rankops_dev.real_node_check`: the local control plane and one real node in
a network namespace of their own; a Triton pod from the triton-test image serves an ONNX model,
a client pod from the operator image asks it through its Service (kube-proxy's iptables rules)
and reads the API server through the `kubernetes` Service. Prints the container IDs, the Triton
process's UID and PID namespace, and the pod's create -> Ready seconds; tears everything down.

Not part of the test suite (issue 38, item 3 wires real nodes into the e2e run).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import netns as ns
from .binaries import ensure_node_binaries
from .controlplane import SERVICE_CIDR, LocalControlPlane
from .image_check import MODEL, write_repository
from .real_cluster import NODE_IP, POD_SUBNET, process_facts
from .real_node import RealNode, archive_image_name, sweep
from .real_node_config import NodeLayout

SERVICE = "triton"

CLIENT = f"""
import json, os, ssl, urllib.request
import socket
host, port = "{SERVICE}.default.svc", 8000  # cluster DNS (dnsmasq), then kube-proxy's rules
print("DNS", host, socket.gethostbyname(host), "env", os.environ["{SERVICE.upper()}_SERVICE_HOST"])
body = json.dumps({{"inputs": [
    {{"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}},
    {{"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [10, 20, 30, 40]}}]}}).encode()
req = urllib.request.Request(f"http://{{host}}:{{port}}/v2/models/{MODEL}/infer", body, {{"Content-Type": "application/json"}})
out = json.load(urllib.request.urlopen(req, timeout=30))
print("INFER", host, port, [o["data"] for o in out["outputs"] if o["name"] == "y"][0])
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
api = "kubernetes.default.svc"  # the serving certificate names it
req = urllib.request.Request(f"https://{{api}}/version", headers={{"Authorization": "Bearer " + open(sa + "/token").read()}})
print("API", api, socket.gethostbyname(api), json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"])
"""


def restricted(uid: int) -> dict:
    return {"runAsNonRoot": True, "runAsUser": uid, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def triton_pod(image: str, models: Path, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "triton", "namespace": "default", "labels": {"app": SERVICE}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{
                         "name": "triton", "image": image, "imagePullPolicy": "Never",
                         "command": ["tritonserver", "--model-repository=/models", "--http-port=8000",
                                     "--grpc-port=8001", "--metrics-port=8002"],
                         "ports": [{"containerPort": 8000, "name": "http"}],
                         "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": 8000},
                                            "periodSeconds": 1, "failureThreshold": 120},
                         "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                       "limits": {"nvidia.com/gpu": "1", "memory": "2Gi"}},
                         "securityContext": restricted(1000),
                         "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True},
                                          {"name": "tmp", "mountPath": "/tmp"}]}],
                     "volumes": [{"name": "models", "hostPath": {"path": str(models), "type": "Directory"}},
                                 {"name": "tmp", "emptyDir": {}}]}}


def triton_service() -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": "default"},
            "spec": {"selector": {"app": SERVICE}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}}


def client_pod(image: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": "default"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "client", "image": image, "imagePullPolicy": "Never",
                                     "command": ["python", "-c", CLIENT],
                                     "securityContext": restricted(1001)}]}}


def timeline(pod: dict) -> str:
    """Seconds from the pod's creation to each condition and to its container's start (the API's
    timestamps have one-second resolution)."""
    from datetime import datetime

    def at(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    created = at(pod["metadata"]["creationTimestamp"])
    marks = {c["type"]: c["lastTransitionTime"] for c in pod["status"].get("conditions", [])}
    running = pod["status"]["containerStatuses"][0].get("state", {}).get("running", {})
    if running.get("startedAt"):
        marks["ContainerStarted"] = running["startedAt"]
    order = ["PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainerStarted", "ContainersReady", "Ready"]
    return ", ".join(f"{k} +{(at(marks[k]) - created).total_seconds():.0f}s" for k in order if k in marks)


def run(images_dir: Path, keep: bool, name: str, work: Path) -> int:
    archives = {archive_image_name(p).split(":")[0].rsplit("/", 1)[-1]: p for p in images_dir.glob("*.tar")}
    needed = {"rankops-triton-test", "rankops-operator"}
    if not needed <= archives.keys():
        print(f"missing archives in {images_dir}: {needed - archives.keys()} (rankops dev images --export DIR)")
        return 2
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    bins = ensure_node_binaries()
    t0 = time.monotonic()
    plane = LocalControlPlane(bins, work_dir=work / "cp", netns=name, advertise_address=NODE_IP)
    node = RealNode(plane, NodeLayout(work / "node", f"{name}-node-0", NODE_IP, POD_SUBNET, SERVICE_CIDR), bins)
    failed = True
    try:
        ns.create(name, NODE_IP)
        plane.start()
        node.start([archives[n] for n in sorted(needed)])
        print(f"cluster + real node up in {time.monotonic() - t0:.1f}s (netns {name}, work {work})")
        status = json.loads(node.kubectl("get", "node", node.layout.node_name, "-o", "json"))["status"]
        gpu = status["allocatable"].get("nvidia.com/gpu")
        print(f"node {node.layout.node_name}: nvidia.com/gpu capacity {status['capacity'].get('nvidia.com/gpu')}, "
              f"allocatable {gpu}; kubelet {status['nodeInfo']['kubeletVersion']}, "
              f"runtime {status['nodeInfo']['containerRuntimeVersion']}")
        models = write_repository(work / "repo")
        image = {n.split(":")[0].rsplit("/", 1)[-1]: n for n in node.images}
        node.kubectl("apply", "-f", "-", input=json.dumps(triton_service()))
        if node.dns and not node.dns.wait_for(SERVICE, "default"):
            raise RuntimeError(f"Service {SERVICE} never reached the DNS hosts file {node.dns.path}")
        created = time.monotonic()
        node.kubectl("apply", "-f", "-", input=json.dumps(triton_pod(image["rankops-triton-test"], models, node.layout.node_name)))
        node.kubectl("wait", "--for=condition=Ready", "pod/triton", "--timeout=180s")
        ready_s = time.monotonic() - created
        pod = json.loads(node.kubectl("get", "pod", "triton", "-o", "json"))
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        for line in node.kubectl("get", "events", "--field-selector=involvedObject.name=triton",
                                 "-o", "custom-columns=AGE:.firstTimestamp,REASON:.reason,MSG:.message",
                                 "--sort-by=.firstTimestamp").splitlines()[1:]:
            print(f"  event {line[:200]}")
        print(f"triton pod create -> Ready: {ready_s:.1f}s (pod IP {pod['status'].get('podIP')}); "
              f"{timeline(pod)}")
        print(f"triton container: {cid}")
        facts = process_facts(cid, "tritonserver")
        print(f"tritonserver process: {facts}")
        client_created = time.monotonic()
        node.kubectl("apply", "-f", "-", input=json.dumps(client_pod(image["rankops-operator"], node.layout.node_name)))
        node.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/client", "--timeout=120s", check=False)
        client = json.loads(node.kubectl("get", "pod", "client", "-o", "json"))
        print(f"client pod: phase {client['status'].get('phase')} after {time.monotonic() - client_created:.1f}s, "
              f"container {client['status']['containerStatuses'][0].get('containerID')}")
        logs = node.kubectl("logs", "client")  # the API server -> the kubelet on the node's address
        print("client output:\n  " + "\n  ".join(logs.strip().splitlines()))
        ok = (client["status"].get("phase") == "Succeeded" and "[11.0, 22.0, 33.0, 44.0]" in logs and "DNS triton.default.svc 10.96." in logs
              and facts is not None and facts["uid"] == 1000 and facts["pidns"] != facts["host_pidns"]
              and facts["cap_eff"] == 0
              and cid.startswith("containerd://") and gpu == "1")
        print("PASS" if ok else "FAIL")
        failed = not ok
        return 0 if ok else 1
    finally:
        if failed:
            print(f"logs: {work}/node/logs {work}/cp/logs")
        t_down = time.monotonic()
        node.stop()
        plane.failed = plane.failed or failed
        plane.stop()
        ns.delete(name)
        if not (failed or keep):
            shutil.rmtree(work, ignore_errors=True)
        print(f"torn down in {time.monotonic() - t_down:.1f}s; netns left: "
              f"{[p.name for p in ns.NETNS_DIR.glob('*')] if ns.NETNS_DIR.exists() else []}")


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # SIGTERM unwinds through the teardown, as Ctrl-C does


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=Path(os.environ.get("RANKOPS_IMAGES_DIR", "/tmp/rankops-images")))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--name", default="rankops-" + secrets.token_hex(3), help="the network namespace")
    parser.add_argument("--work", type=Path, help="work directory (default: a new one under /tmp)")
    parser.add_argument("--sweep", action="store_true",
                        help="only remove what a killed run of --name/--work left behind")
    args = parser.parse_args()
    if args.sweep:
        if args.work is None:
            parser.error("--sweep needs --work")
        for line in sweep(args.name, args.work):
            print(f"[sweep] {line}")
        return 0
    signal.signal(signal.SIGTERM, _terminated)
    work = args.work or Path(tempfile.mkdtemp(prefix="rankops-node-"))
    return run(args.images, args.keep, args.name, work)


if __name__ == "__main__":
    sys.exit(main())
