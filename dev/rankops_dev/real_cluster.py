"""A local cluster whose pods run in real containers: the control plane, one real node (or more:
`real_nodes=`) and an S3 server, all inside one network namespace the dev cluster makes
(real_node.py, netns.py). Each node has its own containerd, kubelet, CNI bridge, pod range and
address in the namespace; the first also runs the namespace's kube-proxy and DNS, which the others
share; pods on different nodes reach each other through the namespace's routing between bridges.

`RealCluster(images_dir, work).start()` starts them; the host reaches the API server and the S3
server through forwarders on its own loopback (`kubeconfig`, `object_store`), and a pod's port
through `forward(ip, port)`. `install_operator()` installs the chart with the operator running as
its own pod, from the operator image this machine built (`rankops dev images --export`). Used by
the e2e suite's real-container tests and `scripts/real-node-check.sh`'s successor checks.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import netns as ns
from .binaries import ensure_binaries, ensure_node_binaries
from .controlplane import SERVICE_CIDR, LocalControlPlane
from .objectstore import ObjectStore
from .real_node import RealNode, archive_image_name
from .real_node_config import NodeLayout

PODS_OF_ALL_NODES = "10.245.0.0/16"  # not kwok's 10.244.0.0/16: real pods only


def node_ip(index: int) -> str:
    """Real node `index`'s address in the cluster's network namespace."""
    return f"10.200.0.{index + 1}"


def pod_subnet(index: int) -> str:
    """Real node `index`'s pod range, inside PODS_OF_ALL_NODES."""
    return f"10.245.{index}.0/24"


NODE_IP, POD_SUBNET = node_ip(0), pod_subnet(0)   # the first node's: the API server's and S3's address too
DEFAULT_IMAGES_DIR = Path(os.environ.get("RANKOPS_IMAGES_DIR", "/tmp/rankops-images"))
# The images a serving model needs: the operator's (the operator, fetch-model, the warm
# container, `rankops infer`) and the Triton test image (tritonserver with the CPU stand-ins).
SERVING_IMAGES = ("rankops-operator", "rankops-triton-test")


class RealClusterError(RuntimeError):
    """The real cluster could not start; the message says which part and why."""


def archives_by_image(images_dir: Path) -> dict[str, Path]:
    """`rankops-<target>` -> its OCI archive in `images_dir` (what `rankops dev images --export` wrote)."""
    found: dict[str, Path] = {}
    for archive in sorted(images_dir.glob("*.tar")) if images_dir.is_dir() else []:
        found[archive_image_name(archive).split(":")[0].rsplit("/", 1)[-1]] = archive
    return found


def ensure_images(images_dir: Path, images: Sequence[str], say: Any = print) -> dict[str, Path]:
    """Build `images` (`rankops-<target>`) with buildah, cached by content, and export the ones whose
    archive in `images_dir` is not of the current build: the tests run the tree they test."""
    from . import image_builds

    root = Path(__file__).resolve().parents[2]
    built = image_builds.build_all(root, [image.removeprefix("rankops-") for image in images], say)
    archives = archives_by_image(images_dir)
    stale = [b for b in built[1:] if f"rankops-{b.target}" not in archives
             or archive_image_name(archives[f"rankops-{b.target}"]) != b.tag]
    for path in image_builds.export(stale, images_dir):
        say(f"exported {path}")
    return archives_by_image(images_dir)


def chart_values_for_local_images(refs: dict[str, str]) -> list[str]:
    """`helm --set-string` values that run the chart's operator, and every model's fetcher, from the
    images imported into the node (never pulled: there is no registry)."""
    repository, tag = refs["rankops-operator"].rsplit(":", 1)
    values = [f"image.repository={repository}", f"image.tag={tag}",
              f"fetcher.image.repository={repository}", f"fetcher.image.tag={tag}"]
    for image, key in (("rankops-gates", "gates"), ("rankops-validator", "validator")):
        if image in refs:
            name, image_tag = refs[image].rsplit(":", 1)
            values += [f"{key}.image.repository={name}", f"{key}.image.tag={image_tag}"]
    return values


# The label (=true) of the nodes whose pods really run, and the taint of a kind worker kept for
# the real-pod tests (e2e/kind/setup.sh puts both).
REAL_NODE_TAINT = "rankops.io/real-node"


def pinned_to_real_nodes() -> dict[str, str]:
    """Namespace annotations (PodNodeSelector, PodTolerationRestriction) that send every pod of
    the namespace to the real nodes, tolerating the real-node taint: on kind, and beside a dev
    cluster's simulated nodes, GPU pods would otherwise land on kwok's nodes."""
    toleration = {"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    return {"scheduler.alpha.kubernetes.io/node-selector": f"{REAL_NODE_TAINT}=true",
            "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps([toleration])}


class ClusterOfRealPods:
    """What the real-pod tests use of a cluster whose pods run in real containers, by kubectl and
    helm: this machine's RealCluster, or a kind cluster's worker (ExistingCluster). Subclasses set
    `kubeconfig`, `node_name` (the operator's), `node_names` (every real node's), `refs` (image
    name -> reference), `store`, `netns` (the namespace test traffic is sent from, None: this
    machine reaches pod IPs) and `pull_policy`."""

    kubeconfig: str
    node_name: str
    node_names: list[str]
    refs: dict[str, str]
    store: ObjectStore | None
    netns: str | None
    pull_policy = "Never"
    failed = False

    def tool(self, name: str) -> str:
        return shutil.which(name) or name

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run([self.tool("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                                input=input, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RealClusterError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def install_operator(self, *values: str, namespace: str = "rankops-system", timeout: float = 180.0) -> None:
        """`helm upgrade --install` the chart with its operator Deployment running (one replica:
        one node), from the operator image on the node; waits until it has rolled out."""
        from .operator_process import CHART, RELEASE

        helm = [self.tool("helm"), "upgrade", "--install", RELEASE, str(CHART), "--namespace", namespace,
                "--create-namespace", "--wait=false", "--set", "operator.replicas=1",
                "--set", f"image.pullPolicy={self.pull_policy}",
                # On the real node, where the images are (on kind: not a kwok node).
                "--set-string", f"operator.nodeSelector.kubernetes\\.io/hostname={self.node_name}",
                "--set", f"operator.tolerations[0].key={REAL_NODE_TAINT}",
                "--set", "operator.tolerations[0].operator=Exists",
                "--set", "operator.tolerations[0].effect=NoSchedule"]
        for value in chart_values_for_local_images(self.refs):
            helm += ["--set-string", value]  # a content-hash tag may be all digits: still a string
        for value in values:
            helm += ["--set", value]
        done = subprocess.run(helm, env=dict(os.environ, KUBECONFIG=self.kubeconfig), capture_output=True,
                              text=True, timeout=180)
        if done.returncode != 0:
            raise RealClusterError(f"helm install failed: {done.stderr.strip()}")
        # `rollout status`, not the Available condition: an upgrade's old pod is Available until it goes.
        waited = subprocess.run([self.tool("kubectl"), f"--kubeconfig={self.kubeconfig}", "-n", namespace,
                                 "rollout", "status", f"--timeout={int(timeout)}s", f"deployment/{RELEASE}-operator"],
                                capture_output=True, text=True)
        if waited.returncode != 0:
            pods = self.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False)
            raise RealClusterError(f"the chart's operator did not become Available: {waited.stderr.strip()}\n{pods}")

    def pod_range(self, node_name: str) -> str:
        """The pod addresses a node hands out (its Node's spec.podCIDR, as kind's nodes say)."""
        return json.loads(self.kubectl("get", "node", node_name, "-o", "json"))["spec"].get("podCIDR", "")

    def logs(self, namespace: str, pod: str, container: str, *, previous: bool = False, tail: int = 200) -> str:
        """A container's log through the API server (which asks the node's kubelet)."""
        return self.kubectl("-n", namespace, "logs", pod, "-c", container, f"--tail={tail}",
                            *(["--previous"] if previous else []), check=False)

    def pod_logs(self, namespace: str, pod: str) -> dict[str, str]:
        """container name -> its log (the current run's), init containers included."""
        found = json.loads(self.kubectl("-n", namespace, "get", "pod", pod, "-o", "json", check=False) or "{}")
        spec = found.get("spec", {})
        return {c["name"]: self.logs(namespace, pod, c["name"], tail=-1)
                for c in [*spec.get("initContainers", []), *spec.get("containers", [])]}

    def diagnostics(self, namespace: str | None = None) -> str:
        """Pods, events and the last lines of every container of `namespace`, for a failing test."""
        where = ["-n", namespace] if namespace else ["-A"]
        parts = [self.kubectl("get", "pods", "-o", "wide", *where, check=False),
                 self.kubectl("get", "events", "--sort-by=.lastTimestamp", *where, check=False)[-6000:]]
        if namespace:
            pods = json.loads(self.kubectl("-n", namespace, "get", "pods", "-o", "json", check=False) or "{}")
            for pod in pods.get("items", []):
                spec = pod["spec"]
                for container in [*spec.get("initContainers", []), *spec["containers"]]:
                    parts.append(f"=== {pod['metadata']['name']}/{container['name']}\n"
                                 + self.logs(namespace, pod["metadata"]["name"], container["name"], tail=40))
        return "\n".join(parts)

    def stop(self) -> None:
        if self.store:
            self.store.stop()


def run_engine(engine: str, *args: str) -> None:
    done = subprocess.run([engine, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RealClusterError(f"{engine} {' '.join(args)}: {done.stderr.strip()}")


class EngineNode:
    """A kind node: a container of the engine (docker or podman) named as the node."""

    def __init__(self, cluster: "ExistingCluster", name: str) -> None:
        self.cluster, self.name = cluster, name

    def kill(self) -> None:
        """The machine dies: its container killed, its kubelet and pods with it, nothing reported.
        The cluster starts it again when the module's tests are done (ExistingCluster.stop)."""
        self.cluster.killed.add(self.name)
        run_engine(self.cluster.engine, "kill", self.name)


class ExistingCluster(ClusterOfRealPods):
    """A cluster someone else made (kind, in e2e-kind.yaml or e2e/kind/setup.sh) with workers for
    the real-pod tests: `node_name` (the operator's) and every node labelled as real, their images
    loaded (`refs`, from $RANKOPS_E2E_IMAGES), an S3 server started here on `store_host`, an
    address those workers' pods reach. Test traffic goes from this machine (setup.sh routes the
    pod ranges through the nodes). `engine` runs the nodes (kind's containers), which a node's
    death and an API server outage act on; `control_plane`: the control-plane node's container."""

    pull_policy = "IfNotPresent"

    def __init__(self, kubeconfig: str, node_name: str, refs: dict[str, str], work: Path, store_host: str,
                 engine: str = "docker", control_plane: str = "rankops-e2e-control-plane") -> None:
        self.kubeconfig, self.node_name, self.refs, self.netns = kubeconfig, node_name, refs, None
        self.engine, self.control_plane = engine, control_plane
        self.killed: set[str] = set()
        self.store = ObjectStore(work / "object-store", host=store_host).start()

    @property
    def node_names(self) -> list[str]:
        """The workers labelled as real nodes, `node_name` first."""
        found = self.kubectl("get", "nodes", "-l", f"{REAL_NODE_TAINT}=true", "-o", "name").replace("node/", "").split()
        return sorted(found, key=lambda name: name != self.node_name)

    def node(self, name: str) -> EngineNode:
        return EngineNode(self, name)

    @contextmanager
    def api_outage(self) -> Iterator[None]:
        """The control-plane container paused (the cgroup freezer) while the block runs: its API
        server, etcd and controllers hang, as behind a lost network, then go on."""
        run_engine(self.engine, "pause", self.control_plane)
        try:
            yield
        finally:
            run_engine(self.engine, "unpause", self.control_plane)

    def stop(self) -> None:
        """The nodes a test killed start again (kind's node containers keep their state), so the
        next module and the next run find every real node Ready; then the S3 server stops."""
        try:
            for name in sorted(self.killed):
                run_engine(self.engine, "start", name)
                self.kubectl("wait", "node", name, "--for=condition=Ready", "--timeout=180s")
            self.killed.clear()
        finally:
            super().stop()


def images_from_env(text: str) -> dict[str, str]:
    """`operator=REF,gates=REF,triton=REF` ($RANKOPS_E2E_IMAGES) -> {"rankops-operator": REF, ...}."""
    refs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, ref = item.partition("=")
        if not ref:
            raise RealClusterError(f"RANKOPS_E2E_IMAGES: {item!r} is not NAME=REFERENCE")
        refs["rankops-triton-test" if key == "triton" else f"rankops-{key}"] = ref
    return refs


class RealCluster(ClusterOfRealPods):
    def __init__(self, images_dir: Path, work: Path, *, images: Sequence[str] = SERVING_IMAGES,
                 gpus: int = 2, name: str | None = None, build_images: bool = False,
                 cpu_manager_policy: str = "none", host_scenario: str | None = None,
                 node_labels: dict[str, str] | None = None,
                 kwok_nodes: Sequence[tuple[str, str]] = (), real_nodes: int = 1) -> None:
        """`host_scenario`: the sample host (validator/sample_hosts.py) the real nodes' validator
        pods check instead of this machine; `node_labels`: put on the real nodes once Ready;
        `kwok_nodes`: (name, shape) simulated nodes beside them (nodes.SHAPES); `real_nodes`: how
        many real nodes (each with `gpus`); `cpu_manager_policy` is the first node's (a second
        kubelet's static policy would hand out the same cores again)."""
        if not 1 <= real_nodes <= 8:
            raise RealClusterError(f"real_nodes must be 1 to 8, got {real_nodes}")
        self.images_dir, self.work, self.wanted, self.gpus = Path(images_dir), Path(work), tuple(images), gpus
        self.real_nodes = real_nodes
        self.build_images, self.cpu_manager_policy = build_images, cpu_manager_policy
        self.host_scenario, self.node_labels, self.kwok_nodes = host_scenario, dict(node_labels or {}), tuple(kwok_nodes)
        self.name = name or "rankops-" + secrets.token_hex(3)
        self.plane: LocalControlPlane | None = None
        self.nodes: list[RealNode] = []
        self.store: ObjectStore | None = None
        self.refs: dict[str, str] = {}
        self.netns: str | None = self.name
        self._forwarders: dict[tuple[str, int], ns.Forwarder] = {}
        self.failed = False

    @property
    def kubeconfig(self) -> str:
        assert self.plane is not None
        return str(self.plane.kubeconfig)

    @property
    def node_names(self) -> list[str]:
        return [f"{self.name}-node-{index}" for index in range(self.real_nodes)]

    @property
    def node_name(self) -> str:
        """The first node's: the operator's, kube-proxy's and the DNS's."""
        return self.node_names[0]

    def node(self, name: str) -> RealNode:
        return next(node for node in self.nodes if node.layout.node_name == name)

    def pod_range(self, node_name: str) -> str:
        """The node's own range (its CNI bridge's; the Node object names none here)."""
        return pod_subnet(self.node_names.index(node_name))

    @contextmanager
    def api_outage(self) -> Iterator[None]:
        """The API server stopped (SIGSTOP) while the block runs: it hangs, then goes on."""
        assert self.plane is not None
        with self.plane.outage("kube-apiserver"):
            yield

    def _layout(self, index: int, sample_host: Path | None) -> NodeLayout:
        """Node `index`'s own directories, address, pod range, bridge and (after the first) cgroup
        root; a later node shares the first's kube-proxy and DNS."""
        later = index > 0
        return NodeLayout(self.work / (f"node-{index}" if later else "node"), self.node_names[index],
                          node_ip(index), pod_subnet(index), SERVICE_CIDR, bridge=f"rkbr{index}",
                          cpu_manager_policy="none" if later else self.cpu_manager_policy, sample_host=sample_host,
                          cgroup_root=f"/{self.node_names[index]}" if later else "/",
                          cluster_pod_cidr=PODS_OF_ALL_NODES, services_node_ip=NODE_IP if later else None)

    @property
    def bin_dir(self) -> Path:
        assert self.plane is not None
        return self.plane.bin_dir

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name) if self.plane and (self.bin_dir / name).exists() else super().tool(name)

    def start(self) -> "RealCluster":
        archives = (ensure_images(self.images_dir, self.wanted, self._say) if self.build_images
                    else archives_by_image(self.images_dir))
        missing = [image for image in self.wanted if image not in archives]
        if missing:
            raise RealClusterError(f"no OCI archive of {', '.join(missing)} in {self.images_dir}: build them "
                                   f"with `rankops dev images --export {self.images_dir}`")
        for tool in ("containerd", "runc", "ctr", "iptables", "dnsmasq"):
            if not shutil.which(tool) and not Path("/usr/sbin", tool).exists():
                raise RealClusterError(f"{tool} is not installed: apt-get install -y containerd runc "
                                       "containernetworking-plugins iptables conntrack dnsmasq-base")
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o755)  # the pods' non-root users read the hostPath volumes under it
        ensure_binaries(build=True)
        bins = ensure_node_binaries()
        sample_hosts: list[Path | None] = [None] * self.real_nodes
        if self.host_scenario:
            from rankops_dev import sample_hosts as hosts

            sample_hosts = [hosts.build(self.host_scenario, self.work / "hosts" / name) for name in self.node_names]
        self.plane = LocalControlPlane(bins, work_dir=self.work / "cp", netns=self.name, advertise_address=NODE_IP)
        layouts = [self._layout(index, host) for index, host in enumerate(sample_hosts)]
        self.nodes = [RealNode(self.plane, layout, bins, gpus=self.gpus) for layout in layouts]
        try:
            ns.create(self.name, *(layout.node_ip for layout in layouts))
            self.plane.start()
            for node in self.nodes:
                node.start([archives[image] for image in self.wanted])
            labels = {**self.node_labels, REAL_NODE_TAINT: "true"}
            self.kubectl("label", "node", *self.node_names, "--overwrite",
                         *(f"{key}={value}" for key, value in sorted(labels.items())))
            if self.kwok_nodes:
                from .cluster import add_nodes

                add_nodes(self.plane.kubeconfig, self.kwok_nodes)
            self.refs = {n.split(":")[0].rsplit("/", 1)[-1]: n for n in self.nodes[0].images}
            self.store = ObjectStore(self.work / "object-store", host=NODE_IP, netns=self.name).start()
        except BaseException:
            self.failed = True
            self.stop()
            raise
        return self

    def diagnostics(self, namespace: str | None = None) -> str:
        if self.plane is None or not self.nodes:
            return "(the cluster did not start)"
        return super().diagnostics(namespace)

    @staticmethod
    def _say(line: str) -> None:
        print(f"[real-cluster] {line}", flush=True)

    def forward(self, address: str, port: int) -> int:
        """A port on this machine's loopback that reaches `address:port` inside the namespace
        (a pod's IP, a ClusterIP): test traffic never leaves loopback and the namespace."""
        key = (address, port)
        if key not in self._forwarders:
            assert self.plane is not None
            self._forwarders[key] = ns.Forwarder(self.name, 0, key)
        return self._forwarders[key].port

    def stop(self) -> None:
        """Everything, each step even when an earlier one failed; the work directory is kept
        when anything failed (logs under node/logs and cp/logs)."""
        for forwarder in self._forwarders.values():
            forwarder.close()
        self._forwarders.clear()
        if self.store:
            self.store.stop()
        for node in reversed(self.nodes):  # the first, with the shared kube-proxy and DNS, last
            node.stop()
        if self.plane:
            self.plane.failed = self.plane.failed or self.failed
            self.plane.stop()
        ns.delete(self.name)
        if not self.failed:
            shutil.rmtree(self.work, ignore_errors=True)


def process_facts(container_id: str, comm: str | None) -> dict[str, Any] | None:
    """UID, effective capabilities, PID namespace and root mount of the process named `comm` (None:
    any) whose cgroup names the container, beside this process's PID namespace (the host's)."""
    bare = container_id.split("://", 1)[-1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if comm and (proc / "comm").read_text().strip() != comm or bare not in (proc / "cgroup").read_text():
                continue
            status = (proc / "status").read_text()
            field = {line.split(":")[0]: line.split(":", 1)[1].split() for line in status.splitlines() if ":" in line}
            root_options = next((line.split()[5] for line in (proc / "mountinfo").read_text().splitlines()
                                 if line.split()[4] == "/"), "")
            return {"pid": int(proc.name), "uid": int(field["Uid"][0]), "cap_eff": int(field["CapEff"][0], 16),
                    "pidns": os.readlink(proc / "ns" / "pid"), "host_pidns": os.readlink("/proc/self/ns/pid"),
                    "root_mount_options": root_options.split(",")}
        except (OSError, KeyError, IndexError, ValueError):
            continue
    return None


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
