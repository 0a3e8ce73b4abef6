"""`rankops dev up`: a local Kubernetes with simulated GPU nodes, for trying rankops by hand.

`rankops dev nodes` adds the same simulated GPU nodes to an existing cluster that runs kwok
(the kind workflow uses it). `rankops dev demo` tells the whole story on the local control plane:
the operator as the chart's pod, a GpuNodePool whose validators pass a node whose pods run in real
containers (its validator checks a sample RHEL 8.9 host) and fail a simulated one, and a
RankingModel whose Triton pods fetch their model from a real S3 server, serve it, and answer a
request through the model's Service name. `rankops dev validate`
runs a pool's validators on simulated nodes by hand.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rankops.api.phases import ModelPhase
from rankops.progress import Progress
from rankops_dev.binaries import BinariesMissing
from rankops_dev.controlplane import ControlPlaneError
from rankops_dev.nodes import E2E_NODES, SHAPES, dev_node_set


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser("dev", help="a local Kubernetes with simulated GPU nodes")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="DEV_COMMAND")

    up = dev_sub.add_parser(
        "up", help="start the local control plane and kwok GPU nodes; runs until Ctrl-C",
        description="Builds the control plane once if needed (tens of minutes cold), starts it, "
                    "adds simulated GPU nodes and keeps running until Ctrl-C or SIGTERM.")
    up.add_argument("--nodes", type=int, default=2, metavar="N",
                    help="simulated GPU nodes, alternating T4 and L4 (plus one CPU node); default 2")
    up.add_argument("--keep", action="store_true",
                    help="keep the working directory (data, logs, kubeconfig) after stopping")
    up.set_defaults(func=run_up)

    nodes = dev_sub.add_parser(
        "nodes", help="create simulated GPU nodes in the current KUBECONFIG's cluster (needs kwok "
                      "running there with the rankops stages)")
    nodes.add_argument("--set", choices=["e2e", "dev"], default="e2e",
                       help="e2e: the fixed set the e2e suite expects; dev: like `dev up --nodes`")
    nodes.add_argument("--nodes", type=int, default=2, metavar="N", help="GPU nodes for --set dev")
    nodes.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                       help="default: $KUBECONFIG")
    nodes.set_defaults(func=run_nodes)

    demo = dev_sub.add_parser(
        "demo", help="the whole story on the local control plane: operator, pool, validators, a model Ready",
        description="Builds the images (buildah, cached by content), starts the local control plane with a "
                    "node whose pods run in real containers and simulated T4 nodes, installs the chart (the "
                    "operator runs as its pod), applies the example GpuNodePool (the real node's validator "
                    f"checks a sample RHEL 8.9 host; {DEMO_FAILING_NODE}'s simulated one has nouveau loaded), "
                    "puts the example model in a real S3 server, applies the example RankingModel, waits "
                    "until it is Ready and sends it a request through its Service. Exit 0 when it answers.")
    demo.add_argument("--keep", action="store_true",
                      help="afterwards keep the cluster and the operator running until Ctrl-C")
    demo.add_argument("--timeout", type=float, default=180.0, metavar="S",
                      help="seconds to wait for each stage (default 180)")
    demo.set_defaults(func=run_demo)

    validate = dev_sub.add_parser(
        "validate", help="run a GpuNodePool's validator once on each simulated node it covers",
        description="kwok runs no containers: this runs what each validator pod would, against a sample "
                    "host tree per node, and patches the node as that pod. Exit 0 when every node is "
                    "ready, 1 when some is not, 2 when a node could not be patched or on bad input.")
    validate.add_argument("pool", help="the GpuNodePool's name")
    validate.add_argument("hosts", nargs="*", metavar="NODE=SCENARIO",
                          help="host scenario per node (default healthy-rhel89); e.g. kwok-t4-2=nouveau-loaded")
    validate.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    validate.set_defaults(func=run_validate)

    from rankops_dev.commands import dev_images, dev_traffic, dev_triton
    dev_images.add_commands(dev_sub)
    dev_triton.add_commands(dev_sub)
    dev_traffic.add_commands(dev_sub)


def _node_set(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.nodes < 0:
        raise SystemExit(f"rankops dev: --nodes must be 0 or more, got {args.nodes}")
    return dev_node_set(args.nodes)


def run_up(args: argparse.Namespace) -> int:
    """Start, print how to connect, block until Ctrl-C or SIGTERM, stop."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    try:
        with serve_dev_cluster(_node_set(args), keep=args.keep) as plane:
            print(f"kubeconfig: {plane.kubeconfig}")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            print(f"export PATH={plane.bin_dir}:$PATH   # kubectl, helm, kwok of this release")
            print("running; Ctrl-C to stop", flush=True)
            while True:
                time.sleep(1.0)
                plane.check_alive()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0
    except (BinariesMissing, ControlPlaneError, TimeoutError) as exc:
        print(f"rankops dev up: {exc}", file=sys.stderr)
        return 1


def serve_dev_cluster(node_set: list[tuple[str, str]] | None = None, *, keep: bool = False):
    """Context manager for the demo: a started local cluster with `node_set` nodes Ready.

    Yields the LocalControlPlane (`.kubeconfig`, `.server`, `.version()`); stops it on exit.
    """
    from rankops_dev.cluster import local_cluster

    return local_cluster(dev_node_set(2) if node_set is None else node_set, keep=keep)


def run_nodes(args: argparse.Namespace) -> int:
    from rankops_dev.cluster import add_nodes

    if not args.kubeconfig or not Path(args.kubeconfig).exists():
        print("rankops dev nodes: no kubeconfig: set KUBECONFIG or pass --kubeconfig PATH",
              file=sys.stderr)
        return 2
    node_set = list(E2E_NODES) if args.set == "e2e" else _node_set(args)
    try:
        names = add_nodes(args.kubeconfig, node_set, timeout=120)
    except TimeoutError as exc:
        print(f"rankops dev nodes: {exc}", file=sys.stderr)
        return 1
    shapes = {name: SHAPES[key] for name, key in node_set}
    for name in names:
        shape = shapes[name]
        gpu = f"{shape.gpu_count}x {shape.gpu_product}" if shape.gpu_count else "no GPU"
        print(f"{name}: {shape.instance_type}, {gpu}, Ready")
    return 0


def _scenarios(pairs: list[str]) -> dict[str, str]:
    scenarios = {}
    for pair in pairs:
        node, sep, scenario = pair.partition("=")
        if not sep or not node or not scenario:
            raise ValueError(f"{pair!r}: write NODE=SCENARIO, e.g. kwok-t4-2=nouveau-loaded")
        scenarios[node] = scenario
    return scenarios


def run_validate(args: argparse.Namespace) -> int:
    from rankops_dev.node_validators import run_validators

    if not args.kubeconfig or not Path(args.kubeconfig).exists():
        print("rankops dev validate: no kubeconfig: set KUBECONFIG or pass --kubeconfig PATH", file=sys.stderr)
        return 2
    try:
        verdicts = run_validators(args.kubeconfig, args.pool, _scenarios(args.hosts))
    except (ValueError, TimeoutError) as exc:
        print(f"rankops dev validate: {exc}", file=sys.stderr)
        return 2
    for verdict in verdicts:
        print(verdict.summary)
    return max((v.exit_code for v in verdicts), default=0)


# --- rankops dev demo ---------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"
DEMO_POOL = EXAMPLES / "gpunodepool-t4.yaml"
DEMO_MODEL = EXAMPLES / "rankingmodel-ctr-ranker.yaml"
DEMO_ARTIFACTS = EXAMPLES / "artifacts"   # the example model's versions, uploaded to the S3 server
DEMO_BUCKET = "models"
# Two g4dn (T4) machines for the example pool: one whose pods run in real containers (3 GPUs
# advertised; its validator pod checks a healthy RHEL 8.9 tree) and a simulated one fresh from
# install with nouveau bound to the GPU. The example model's 2 replicas land on the first.
# The L4 and CPU nodes are outside the pool's selector.
DEMO_REAL_HOST = "healthy-rhel89"
DEMO_NODES = [("kwok-t4-2", "t4"), ("kwok-l4-0", "l4"), ("kwok-cpu-0", "cpu")]
DEMO_FAILING_NODE = "kwok-t4-2"
DEMO_HOSTS = {DEMO_FAILING_NODE: "nouveau-loaded"}
GET_ALL = ["get", "gpunodepools,rankingmodels", "-A"]
POD_COLUMNS = ("custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,"
               "CONTAINERS:.status.containerStatuses[*].containerID")
NODE_COLUMNS = ("custom-columns=NAME:.metadata.name,INSTANCE:.metadata.labels.node\\.kubernetes\\.io/instance-type,"
                "POOL:.metadata.labels.rankops\\.io/pool,GPU-READY:.metadata.labels.rankops\\.io/gpu-ready,"
                "DRIVER:.metadata.labels.rankops\\.io/driver-version,CUDA:.metadata.labels.rankops\\.io/cuda-version,"
                "OS:.metadata.labels.rankops\\.io/os,TAINTS:.spec.taints[*].key")


def demo_progress(pool: dict[str, Any] | None, model: dict[str, Any] | None) -> tuple:
    """What the demo prints a new table for: the pool's counts and the model's phase and readiness."""
    ps = (pool or {}).get("status") or {}
    ms = (model or {}).get("status") or {}
    return (tuple(ps.get(k) for k in ("nodes", "ready", "failing", "pending")),
            ms.get("phase"), ms.get("ready"),
            tuple((c.get("type"), c.get("status"), c.get("reason")) for c in ms.get("conditions") or []))


def model_ready(model: dict[str, Any] | None) -> bool:
    status = (model or {}).get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return status.get("phase") == ModelPhase.READY and ready.get("status") == "True"


class _Demo:
    """The demo's shell: kubectl of the built release against the local cluster, and a clock."""

    def __init__(self, plane: Any, timeout: float) -> None:
        self.plane = plane
        self.timeout = timeout
        self.started = time.monotonic()
        self.env = dict(os.environ, KUBECONFIG=str(plane.kubeconfig))
        self.progress = Progress("rankops dev demo")

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    def kubectl(self, *args: str, show: bool = True, check: bool = True) -> str:
        done = subprocess.run([str(self.plane.bin_dir / "kubectl"), *args], env=self.env,
                              capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        if show:
            print(f"$ kubectl {' '.join(args)}\n{(done.stdout or done.stderr).rstrip()}", flush=True)
        return done.stdout

    def wait(self, what: str, read: Callable[[], tuple[dict | None, dict | None]],
             done: Callable[[dict | None, dict | None], bool]) -> None:
        """Poll `read` (pool, model) until `done(pool, model)`, printing the pools and models table
        whenever their status changes."""
        deadline = time.monotonic() + self.timeout
        last = None
        self.progress.step(f"waiting until {what} (at most {self.timeout:.0f}s)")
        next_note = time.monotonic() + 10.0
        while True:
            if time.monotonic() >= next_note:
                next_note += 10.0
                self.progress.step(f"still waiting until {what}, {deadline - time.monotonic():.0f}s left")
            pool, model = read()
            key = demo_progress(pool, model)
            if key != last:
                last = key
                self.kubectl(*GET_ALL)
            if done(pool, model):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not reached after {self.timeout:.0f}s")
            time.sleep(1.0)


def run_demo(args: argparse.Namespace) -> int:
    from rankops_dev.real_cluster import RealClusterError

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    try:
        with _real_cluster() as real:
            demo = _Demo(real, args.timeout)
            demo.say(f"control plane up with {real.node_name}, a node whose pods run in real containers "
                     f"(containerd, runc, a kubelet), and simulated nodes {', '.join(n for n, _ in DEMO_NODES)}; "
                     f"S3 server at {real.store.endpoint} (inside the cluster's network namespace)")
            # The admission policy that limits each validator to its own node is on, as it should be
            # in production: the validators patch with their pods' bound tokens.
            real.install_operator("validator.restrictToOwnNode=true")
            demo.say("chart installed; the operator runs as its pod rankops-system/rankops-operator, "
                     "from the operator image built here")
            code = _story(demo, real)
            demo.say("done" if code == 0 else "failed")
            real.failed = code != 0  # a failed demo keeps its directory: logs, kubeconfig
            if args.keep and code == 0:
                _serve(demo, real)
            return code
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except (BinariesMissing, ControlPlaneError, RealClusterError, RuntimeError, TimeoutError) as exc:
        print(f"rankops dev demo: {exc}", file=sys.stderr)
        return 1


DEMO_REAL_GPUS = 3  # room for the example's 2 replicas and a 1-pod canary beside them (33%)
DEMO_NEXT_VERSION_PREFIX = "ctr-ranker/4"
# What the demo's pods run: the operator (and fetch-model, rankops infer), Triton, the validator,
# the gates (the README's rollout walkthrough).
DEMO_IMAGES = ("rankops-operator", "rankops-triton-test", "rankops-validator", "rankops-gates")


@contextlib.contextmanager
def _real_cluster() -> Iterator[Any]:
    """The control plane, the real node (its validator checks a sample RHEL 8.9 host: see
    rankops_dev/sample_host_runc.py), the simulated nodes and the S3 server; stopped on exit."""
    import tempfile

    from rankops_dev.nodes import SHAPES, SIM_LABEL, gpu_node
    from rankops_dev.real_cluster import DEFAULT_IMAGES_DIR, RealCluster

    labels = {k: v for k, v in gpu_node("real", SHAPES["t4"])["metadata"]["labels"].items()
              if k not in ("type", SIM_LABEL, "kubernetes.io/hostname")}
    # Under /tmp (1777), not a private temporary directory: the pods' non-root users read under it.
    work = Path(tempfile.mkdtemp(prefix="rankops-demo-", dir="/tmp"))
    real = RealCluster(DEFAULT_IMAGES_DIR, work, images=DEMO_IMAGES, gpus=DEMO_REAL_GPUS,
                       build_images=True, host_scenario=DEMO_REAL_HOST,
                       node_labels={**labels, "nvidia.com/gpu.count": str(DEMO_REAL_GPUS)}, kwok_nodes=DEMO_NODES)
    try:
        yield real.start()
    finally:
        real.stop()
        if real.failed:
            print(f"rankops dev demo: logs and kubeconfig kept in {work}", file=sys.stderr)


def _story(demo: _Demo, real: Any) -> int:
    from kubernetes import client

    from rankops_dev.cluster import api_client
    from rankops_dev.node_validators import run_validators

    api = api_client(real.kubeconfig)
    custom = client.CustomObjectsApi(api)
    pool_name, model_ns, model_name = _names()

    def read(get: Callable[..., dict], *where: str) -> dict | None:
        try:
            return get("rankops.io", "v1alpha1", *where)
        except client.exceptions.ApiException:  # not created yet
            return None

    def state() -> tuple[dict | None, dict | None]:
        return (read(custom.get_cluster_custom_object, "gpunodepools", pool_name),
                read(custom.get_namespaced_custom_object, model_ns, "rankingmodels", model_name))

    def pool_status(pool: dict | None) -> dict:
        return (pool or {}).get("status") or {}

    try:
        demo.say(f"apply the example pool: {DEMO_POOL.relative_to(EXAMPLES.parents[1])}")
        demo.kubectl("apply", "-f", str(DEMO_POOL))
        demo.wait("the operator sees the pool's nodes", state, lambda pool, _: pool_status(pool).get("nodes", 0) > 0)
        demo.say(f"validator pods run on the pool's nodes: on {real.node_name} in a real container (from the "
                 f"validator image; the host it checks is a {DEMO_REAL_HOST} tree); kwok runs no containers, "
                 f"so {DEMO_FAILING_NODE}'s pod's validate-node runs here on a sample host with nouveau loaded")
        for verdict in run_validators(real.kubeconfig, pool_name, DEMO_HOSTS, timeout=demo.timeout,
                                      real_nodes={real.node_name}):
            print(f"  {verdict.summary}")
            if verdict.exit_code == 2:
                raise RuntimeError(f"the validator could not patch {verdict.node} (see the messages above)")
            for check in (verdict.report.blocking if verdict.report else [])[:1]:
                print(f"    {check.id}: {check.observed}\n    remedy: {check.remedy}")
        demo.wait("the pool's status counts the verdicts", state, lambda pool, _: pool_status(pool).get("pending") == 0)
        demo.kubectl("get", "nodes", "-o", NODE_COLUMNS)

        _model_store(demo, api, real, model_ns)
        manifest = _fitted_model(real.work / "rankingmodel.yaml", real.refs["rankops-triton-test"])
        demo.say(f"apply the example model on the pool: {DEMO_MODEL.relative_to(EXAMPLES.parents[1])}, fitted to "
                 f"this machine: tritonImage {real.refs['rankops-triton-test']} (tritonserver 2.51 with CPU "
                 f"stand-ins for the GPU backends, built here) and {DEMO_RESOURCES_NOTE}")
        demo.kubectl("apply", "-f", str(manifest))
        demo.wait(f"RankingModel {model_ns}/{model_name} Ready", state, lambda _, model: model_ready(model))
        demo.kubectl("get", "pods", "-n", model_ns, "-o", POD_COLUMNS)
        demo.say(f"RankingModel {model_ns}/{model_name} is Ready, on validated nodes only; its pods fetched "
                 "the model from S3 and run Triton in containers")
        _infer_in_cluster(demo, api, real, model_ns, model_name)
        return 0
    except Exception as exc:  # noqa: BLE001 - any failure ends in the same diagnostics
        print(f"\nrankops dev demo: FAILED: {exc!r}\n", file=sys.stderr, flush=True)
        _diagnose(demo, real, model_ns, model_name)
        return 1
    finally:
        api.close()


# The node is this machine: 2 cores. The example's Triton pods ask for what a g4dn.xlarge gives
# one replica (2 CPUs, 8Gi by default); here two replicas, their warm containers, the README's
# canary and a gate Job must fit in two cores.
DEMO_RESOURCES = {"resources": {"cpu": "250m", "memory": "1Gi"}}
DEMO_GATE_RESOURCES = {"cpu": "250m"}
DEMO_RESOURCES_NOTE = "250m CPU and 1Gi per Triton pod, 250m per gate Job"


def _fitted_model(path: Path, triton_image: str) -> Path:
    """The example RankingModel with the Triton test image and DEMO_RESOURCES, written to `path`."""
    import yaml

    doc = yaml.safe_load(DEMO_MODEL.read_text())
    doc["spec"].update(DEMO_RESOURCES, tritonImage=triton_image)
    gate_jobs = doc["spec"].setdefault("rollout", {}).setdefault("gateJobs", {})
    gate_jobs["resources"] = {**gate_jobs.get("resources", {}), **DEMO_GATE_RESOURCES}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _model_store(demo: _Demo, api: Any, real: Any, namespace: str) -> None:
    """The example's namespace (its pods pinned to the real node), its artifacts in the S3 server,
    and the credentials Secret the example names."""
    import yaml
    from kubernetes import client

    from rankops_dev.real_cluster import pinned_to_real_nodes

    spec = yaml.safe_load(DEMO_MODEL.read_text())["spec"]
    core = client.CoreV1Api(api)
    # PodNodeSelector: every pod of the namespace (Triton's, gate Jobs', the request Job's) goes to
    # the real node: all of them really run.
    core.create_namespace({"metadata": {"name": namespace, "annotations": pinned_to_real_nodes()}})
    for version in spec["versions"]:
        uri = version["modelUri"]
        prefix = uri.split("/", 3)[3]
        real.store.upload_tree(DEMO_BUCKET, prefix, DEMO_ARTIFACTS / prefix)
        demo.say(f"uploaded {uri} to the S3 server")
    # The README's rollout walkthrough adds version 4: the same weights under a new version, so both
    # gates pass on real numbers and the canary is judged on the traffic `rankops dev traffic` sends.
    newest = spec["versions"][-1]["modelUri"].split("/", 3)[3]
    real.store.upload_tree(DEMO_BUCKET, DEMO_NEXT_VERSION_PREFIX, DEMO_ARTIFACTS / newest)
    demo.say(f"uploaded s3://{DEMO_BUCKET}/{DEMO_NEXT_VERSION_PREFIX} (the README's version 4) to the S3 server")
    core.create_namespaced_secret(namespace, real.store.secret_manifest(spec["modelCredentialsSecret"], namespace))
    demo.say(f"Secret {namespace}/{spec['modelCredentialsSecret']}: the S3 server's endpoint and keys")


def _infer_in_cluster(demo: _Demo, api: Any, real: Any, namespace: str, model: str) -> None:
    """A Job that sends one request through the model's Service name and prints the scores."""
    import json

    import yaml
    from kubernetes import client

    from rankops.render.names import serving_service_name

    spec = yaml.safe_load(DEMO_MODEL.read_text())["spec"]
    url = f"{serving_service_name(model)}.{namespace}.svc:8000"
    command = ["rankops", "infer", "--url", url, "--model", model, "--candidates",
               str((spec.get("candidates") or {}).get("minPerRequest", 10)),
               "--inputs-spec", json.dumps(spec["inputs"], separators=(",", ":"))]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "infer"}, "spec": {
        "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "infer", "image": real.refs["rankops-operator"], "imagePullPolicy": "Never",
            "command": command, "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}}]}}}}
    demo.say(f"send one request through the Service: a Job running `{' '.join(command[:5])} ...`")
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(namespace, job)
    deadline = time.monotonic() + demo.timeout
    while True:
        status = batch.read_namespaced_job("infer", namespace).status
        if status.succeeded or status.failed:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("the infer Job did not finish")
        time.sleep(0.5)
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="job-name=infer").items
    output = real.pod_logs(namespace, pods[0].metadata.name).get("infer", "") if pods else ""
    print(output.rstrip(), flush=True)
    if not status.succeeded:
        raise RuntimeError("the request through the Service failed (its output is above)")


def _names() -> tuple[str, str, str]:
    import yaml

    pool = yaml.safe_load(DEMO_POOL.read_text())
    model = yaml.safe_load(DEMO_MODEL.read_text())
    return pool["metadata"]["name"], model["metadata"]["namespace"], model["metadata"]["name"]


def _diagnose(demo: _Demo, real: Any, namespace: str, model: str) -> None:
    print(f"--- the operator's pod log (tail) ---\n{_operator_log(real, 80)}", file=sys.stderr)
    for args in (GET_ALL, ["get", "pods,deployments", "-n", namespace, "-o", "wide"],
                 ["describe", "rankingmodel", "-n", namespace, model],
                 ["get", "events", "-A", "--sort-by=.lastTimestamp"]):
        try:
            out = demo.kubectl(*args, show=False, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            out = str(exc)
        print(f"--- kubectl {' '.join(args)} ---\n{out.rstrip()[-6000:]}", file=sys.stderr, flush=True)
    print(real.diagnostics(namespace)[-8000:], file=sys.stderr, flush=True)


def _operator_log(real: Any, tail: int) -> str:
    return real.kubectl("-n", "rankops-system", "logs", "deployment/rankops-operator", f"--tail={tail}",
                        check=False)


def _serve(demo: _Demo, real: Any) -> None:
    """--keep: leave it all running for the user until Ctrl-C. The pod network lives in the
    cluster's network namespace: this machine reaches the model's Service through a forwarder."""
    import json

    from rankops.render.names import serving_service_name

    pool_name, namespace, model = _names()
    service = json.loads(real.kubectl("-n", namespace, "get", "service", serving_service_name(model), "-o", "json"))
    port = real.forward(service["spec"]["clusterIP"], 8000)
    print(f"\nexport KUBECONFIG={real.kubeconfig}\n"
          f"export PATH={real.bin_dir}:$PATH   # kubectl, helm, kwok of this release\n"
          f"operator log: kubectl -n rankops-system logs deployment/rankops-operator\n"
          f"try: kubectl get gnp,rm -A -o wide; kubectl get nodes --show-labels; kubectl get pods -n {namespace} -o wide\n"
          f"     rankops dev validate {pool_name} {DEMO_FAILING_NODE}=healthy-rhel89   # fix the simulated node\n"
          f"send a request yourself (pods resolve {serving_service_name(model)}.{namespace}.svc; this machine "
          f"reaches that Service through a forwarder):\n"
          f"     rankops infer --url 127.0.0.1:{port} -f {DEMO_MODEL}\n"
          f"roll out version 4 (README, 'Roll out a new version'; its artifact is in the S3 server) while\n"
          f"     rankops dev traffic -f {DEMO_MODEL} --netns {real.netns}   # the traffic its canary is judged on\n"
          "running; Ctrl-C to stop", flush=True)
    while True:
        time.sleep(1.0)
        assert real.plane is not None
        real.plane.check_alive()
