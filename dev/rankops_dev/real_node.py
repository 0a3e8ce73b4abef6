"""A real node in the local cluster: containerd + runc + CNI + a kubelet and kube-proxy of the
control plane's release, all inside the network namespace the control plane runs in.

`RealNode(plane, layout, bin_dir).start(images=[...])` writes the configuration files
(real_node_config.py), starts containerd, imports the pause image and the given OCI archives into
its `k8s.io` namespace, starts the kubelet and kube-proxy, waits for the node to be Ready and
advertises `nvidia.com/gpu` on its status. The namespace's first node also runs kube-proxy and the
cluster's DNS, which a later node in the same namespace shares (NodeLayout.services_node_ip); a
later node's kubelet keeps its cgroups under a root of its own (NodeLayout.cgroup_root). `kill()`
is the node's machine dying. `stop()` removes what it made even after a failure:
the pods' containers and network namespaces, the processes (the containerd shims too, which
outlive containerd), dnsmasq (the cluster's DNS: cluster_dns.py), the mounts under the work directory and the kubelet's empty cgroups.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import netns as ns
from . import real_node_config as cfg
from .cluster_dns import ServiceDNS, dnsmasq_command
from .controlplane import LocalControlPlane, _die_with_parent, render_kubeconfig, tail, terminate
from .pause_image import PAUSE_IMAGE, build_pause, write_archive

CGROUP_ROOT = Path("/sys/fs/cgroup")


class RealNodeError(RuntimeError):
    """The node could not start; the message names the step and the log."""


def archive_image_name(archive: Path) -> str:
    """The image name an OCI archive carries (index.json's ref.name annotation), which
    `ctr images import` gives it."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    annotations = index["manifests"][0].get("annotations", {})
    return annotations.get("io.containerd.image.name") or annotations["org.opencontainers.image.ref.name"]


def mounts_under(root: Path, mountinfo: str) -> list[str]:
    """Mount points at or under `root` in /proc/self/mountinfo text, deepest first."""
    prefix = str(root).rstrip("/") + "/"
    points = [line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4]
    mine = {p.replace("\\040", " ") for p in points if p == str(root) or p.startswith(prefix)}
    return sorted(mine, key=lambda p: (-p.count("/"), p))


def root_mount_is_shared(mountinfo: str) -> bool:
    """Whether / is a shared mount in /proc/self/mountinfo text (systemd makes every mount
    shared; a machine without it, like this one, leaves them private)."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[4] == "/":
            optional = fields[6:fields.index("-")] if "-" in fields else []
            return any(field.startswith("shared:") for field in optional)
    return False


class RealNode:
    def __init__(self, plane: LocalControlPlane, layout: cfg.NodeLayout, bin_dir: Path,
                 *, gpus: int = 1, log: Callable[[str], None] | None = None) -> None:
        if not plane.netns:
            raise RealNodeError("the control plane must run in a network namespace (netns=)")
        self.plane, self.layout, self.bin_dir, self.gpus = plane, layout, Path(bin_dir), gpus
        self.say = log or (lambda msg: print(f"[real-node] {msg}", file=sys.stderr, flush=True))
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []
        self.images: list[str] = []
        self._cgroups_before: set[Path] = set()
        self._dead_pods_netns: list[str] = []  # the pods' network namespaces kill() left
        self.dns: ServiceDNS | None = None
        self.mount_namespace: Path | None = None

    @property
    def logs_dir(self) -> Path:
        return self.layout.work_dir / "logs"

    # -- start --------------------------------------------------------------------------------

    def start(self, images: Sequence[Path] = (), timeout: float = 180.0) -> "RealNode":
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        lay = self.layout
        for directory in (lay.containerd_root, lay.containerd_state, lay.cni_conf_dir, lay.kubelet_root,
                          lay.pod_logs_dir, self.logs_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._cgroups_before = set(_kubepods_cgroups(lay.cgroup_root))
        make_cgroup_root(lay.cgroup_root)
        (lay.work_dir / "containerd.toml").write_text(cfg.containerd_config(lay))
        if lay.sample_host:
            runtime = Path(lay.runtime_binary)
            runtime.write_text(cfg.sample_host_runc_script(lay, sys.executable))
            runtime.chmod(0o755)
        (lay.cni_conf_dir / "10-rankops.conflist").write_text(cfg.cni_conflist(lay))
        (lay.work_dir / "kubelet.yaml").write_text(cfg.kubelet_config(lay))
        kubeconfig = lay.work_dir / "node.kubeconfig"
        ca = (self.plane.work_dir / "pki" / "apiserver.crt").read_bytes()
        kubeconfig.write_text(render_kubeconfig(self.plane.inside_server, ca, self.plane.token))
        kubeconfig.chmod(0o600)
        (lay.work_dir / "kube-proxy.yaml").write_text(cfg.kube_proxy_config(lay, kubeconfig))

        self._share_mounts()
        self._spawn("containerd", cfg.containerd_command(lay.work_dir / "containerd.toml"))
        self._wait("containerd", deadline,
                   lambda: subprocess.run(cfg.ctr_command(lay, "version"), capture_output=True).returncode == 0)

        pause = write_archive(build_pause(self.bin_dir / "rankops-pause").read_bytes(),
                              lay.work_dir / "pause.tar")
        for archive in [pause, *images]:
            began = time.monotonic()
            result = subprocess.run(cfg.ctr_command(lay, "images", "import", str(archive)),
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise RealNodeError(f"ctr images import {archive}: {result.stderr.strip()}")
            name = PAUSE_IMAGE if archive == pause else archive_image_name(archive)
            self.images.append(name)
            self.say(f"imported {name} in {time.monotonic() - began:.1f}s")

        if lay.cluster_dns and lay.runs_shared_services:
            from .cluster import api_client

            self.dns = ServiceDNS(lambda: api_client(self.plane.kubeconfig), lay.hosts_dir).start()
            self._spawn("dnsmasq", dnsmasq_command(lay.node_ip, lay.hosts_dir, lay.work_dir / "dnsmasq.pid"))
        self._spawn("kubelet", cfg.kubelet_command(self.bin_dir / "kubelet", lay,
                                                   lay.work_dir / "kubelet.yaml", kubeconfig))
        if lay.runs_shared_services:
            self._spawn("kube-proxy", cfg.kube_proxy_command(self.bin_dir / "kube-proxy",
                                                             lay.work_dir / "kube-proxy.yaml"))
        self._wait(f"node {lay.node_name} Ready", deadline, self._node_ready)
        self._patch_gpus()
        self.say(f"node {lay.node_name} Ready with {self.gpus} nvidia.com/gpu in "
                 f"{time.monotonic() - started:.1f}s")
        return self

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """kubectl from the host, through the control plane's forwarder."""
        result = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.plane.kubeconfig}", *args],
                                input=input, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RealNodeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def _node_ready(self) -> bool:
        """Ready, and schedulable: the node lifecycle controller has lifted the not-ready taint
        the kubelet registers with (until then the scheduler backs off, up to 10 s)."""
        status, body = self.plane.get(f"/api/v1/nodes/{self.layout.node_name}")
        if status != 200:
            return False
        node = json.loads(body)
        conditions = node.get("status", {}).get("conditions", [])
        taints = [t for t in node.get("spec", {}).get("taints", []) or [] if t.get("effect") == "NoSchedule"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not taints

    def _patch_gpus(self) -> None:
        if self.gpus:
            self.kubectl("patch", "node", self.layout.node_name, "--subresource=status", "--type=json",
                         "-p", json.dumps(cfg.gpu_capacity_patch(self.gpus)))

    def _share_mounts(self) -> None:
        """The validator mounts its host's paths with HostToContainer propagation, which containerd
        refuses on a private mount ("is not a shared or slave mount"). Where the machine's mounts
        are private (no systemd), a node whose validator runs (a sample host) gets containerd and
        the kubelet in a mount namespace of their own whose mounts are shared, as systemd makes
        them; the machine's own mounts stay as they are."""
        if not self.layout.sample_host or root_mount_is_shared(Path("/proc/self/mountinfo").read_text()):
            return
        holder = self.layout.work_dir / "mount-namespace"
        holder.touch()
        for command in (["unshare", f"--mount={holder}", "--propagation", "unchanged", "true"],
                        ["nsenter", f"--mount={holder}", "mount", "--make-rshared", "/"]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RealNodeError(f"{' '.join(command)}: {done.stderr.strip()}")
        self.mount_namespace = holder

    def _spawn(self, name: str, command: list[str]) -> None:
        log_path = self.logs_dir / f"{name}.log"
        enter = ns.enter_command(self.plane.netns or "")
        if self.mount_namespace and name in ("containerd", "kubelet"):  # they share the pods' mounts
            enter.append(f"--mount={self.mount_namespace}")
        with open(log_path, "wb") as log_file:
            # Killed with the caller (a test run stopped by its timeout): nothing keeps running.
            process = subprocess.Popen([*enter, *command],
                                       stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=_die_with_parent)
        self.processes.append((name, process, log_path))

    def _wait(self, what: str, deadline: float, ready: Callable[[], bool]) -> None:
        while True:
            for name, process, log_path in self.processes:
                if process.poll() is not None:
                    raise RealNodeError(f"{name} exited with {process.returncode}; {log_path}:\n{tail(log_path)}")
            if ready():
                return
            if time.monotonic() > deadline:
                name, _, log_path = self.processes[-1]
                raise RealNodeError(f"timed out waiting for {what}; {log_path}:\n{tail(log_path)}")
            time.sleep(0.5)

    # -- kill and stop ------------------------------------------------------------------------

    def kill(self) -> None:
        """The node's machine dies: its kubelet, every container and containerd are SIGKILLed and
        nothing tells the API server (the node lifecycle controller finds out by the missed
        heartbeats). `stop()` still removes what is left."""
        by_name = {name: process for name, process, _ in self.processes}
        # The kubelet first: it would start the containers again. The namespace's kube-proxy and
        # DNS die with the first node.
        for name in ("kubelet", "kube-proxy", "dnsmasq"):
            _kill(by_name.get(name))
        self._dead_pods_netns += self._remove_containers()
        _kill(by_name.get("containerd"))
        for pid in _shims_of(self.layout.containerd_socket):
            _kill_pid(pid)

    # -- stop ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Everything the node made, in order; each step runs even when an earlier one failed."""
        began = time.monotonic()
        by_name = {name: process for name, process, _ in self.processes}
        for name in ("kube-proxy", "kubelet", "dnsmasq"):
            terminate(by_name.get(name), 10)
        if self.dns:
            self.dns.stop()
        stopped = time.monotonic()
        containerd = by_name.get("containerd")
        alive = containerd is not None and containerd.poll() is None
        pod_netns = [*self._dead_pods_netns, *(self._remove_containers() if alive else [])]
        removed = time.monotonic()
        terminate(containerd, 10)
        self.processes.clear()
        for pid in _shims_of(self.layout.containerd_socket):
            _kill_pid(pid)
        for path in pod_netns:
            subprocess.run(["umount", path], capture_output=True)
            Path(path).unlink(missing_ok=True)
        self.unmount()
        if self.mount_namespace:  # its last process is gone: unpinned, it goes with its mounts
            subprocess.run(["umount", str(self.mount_namespace)], capture_output=True)
            self.mount_namespace.unlink(missing_ok=True)
            self.mount_namespace = None
        _remove_cgroups(self._cgroups_before, self.layout.cgroup_root)
        self.say(f"stopped in {time.monotonic() - began:.1f}s (kubelet, kube-proxy, dnsmasq "
                 f"{stopped - began:.1f}s; containers {removed - stopped:.1f}s)")

    def _remove_containers(self) -> list[str]:
        """Kill and delete every container of this containerd; returns the pods' network
        namespace paths (/var/run/netns/cni-...) the CRI plugin pinned for them."""
        def ctr(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(cfg.ctr_command(self.layout, *args), capture_output=True, text=True)
        listed = ctr("containers", "ls", "-q")
        ids = listed.stdout.split() if listed.returncode == 0 else []
        paths: list[str] = []
        for cid in ids:
            info = ctr("containers", "info", cid)
            try:
                spaces = json.loads(info.stdout)["Spec"]["linux"]["namespaces"]
                paths += [s["path"] for s in spaces if s.get("type") == "network" and s.get("path")]
            except (ValueError, KeyError, TypeError):
                pass
            ctr("tasks", "kill", "-a", "-s", "SIGKILL", cid)
        for _ in range(50):  # until no task is left (SIGKILL is asynchronous)
            left = [cid for cid in ids if cid in ctr("tasks", "ls", "-q").stdout.split()]
            if not left:
                break
            for cid in left:
                ctr("tasks", "delete", cid)
            time.sleep(0.1)
        for cid in ids:
            ctr("containers", "delete", cid)
        return sorted(set(paths))

    def unmount(self) -> None:
        for point in mounts_under(self.layout.work_dir, Path("/proc/self/mountinfo").read_text()):
            subprocess.run(["umount", "-l", point], capture_output=True)


def _kill(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(10)


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _shims_of(socket_path: Path) -> list[int]:
    """PIDs of the containerd-shim processes started by the containerd at `socket_path`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and str(socket_path).encode() in argv:
            pids.append(int(proc.name))
    return pids


def _remove_cgroups(keep: set[Path], root: str = "/", timeout: float = 10.0) -> bool:
    """rmdir the kubelet's cgroups under `root` not in `keep`, deepest first; a cgroup stays busy
    for a moment after its last process is killed, so retry until `timeout`. True if any were there."""
    deadline = time.monotonic() + timeout
    existed = False
    while True:
        left = sorted(set(_kubepods_cgroups(root)) - keep, key=lambda p: -len(p.parts))
        existed = existed or bool(left)
        for cgroup in left:
            try:
                cgroup.rmdir()
            except OSError:
                pass
        if not (set(_kubepods_cgroups(root)) - keep) or time.monotonic() > deadline:
            return existed
        time.sleep(0.2)


def _hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies (and unified) mounted under CGROUP_ROOT."""
    return sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []


def _kubepods_cgroups(root: str = "/") -> list[Path]:
    """Every cgroup directory a kubelet whose cgroup root is `root` makes, in each hierarchy: at or
    under `kubepods` for the machine's root; the whole of a root of the node's own."""
    found: list[Path] = []
    for hierarchy in _hierarchies():
        top = hierarchy / ("kubepods" if root == "/" else root.strip("/"))
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return found


def make_cgroup_root(root: str) -> None:
    """Make a kubelet's cgroup root in every hierarchy (the kubelet refuses one that does not
    exist); a new cpuset has no CPUs or memory nodes until given its parent's."""
    if root == "/":
        return
    for hierarchy in _hierarchies():
        path = hierarchy / root.strip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((hierarchy / name).read_text())


def sweep(netns_name: str, work_dir: Path) -> list[str]:
    """After a run that could not clean up (killed outright): kill, by PID, every process in the
    node's network namespace and the shims of its containerd; remove the pods' network namespaces
    made since `work_dir` was and that no process holds; unmount what is under `work_dir`; delete
    the namespace; remove the empty kubepods cgroups. Returns what it did, one line each."""
    done: list[str] = []
    target = ns.netns_path(netns_name)
    inode = target.stat().st_ino if target.exists() else None
    # Containers of this node: their IDs are the task directories in containerd's state dir
    # (read before anything is unmounted); their processes sit in the pods' network namespaces,
    # found by their cgroup paths, which end in the container ID.
    containers = {d.name for d in work_dir.glob("**/io.containerd.runtime.v2.task/k8s.io/*")}
    killed: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            net = (proc / "ns" / "net").stat().st_ino
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        ours = inode is not None and net == inode
        contained = any(cid in cgroup for cid in containers)
        if ours or contained:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(int(proc.name))
            done.append(f"killed {proc.name} ({'in ' + netns_name if ours else 'a container'})")
    sockets = work_dir.glob("node*/containerd/containerd.sock")  # every node's: node, node-1, ...
    for pid in {pid for socket in sockets for pid in _shims_of(socket)} - set(killed):
        _kill_pid(pid)
        killed.append(pid)
        done.append(f"killed shim {pid}")
    for _ in range(50):  # until they are gone (reaped), so namespaces and cgroups are free
        if not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in killed):
            break
        time.sleep(0.1)
    held = set()
    for proc in Path("/proc").iterdir():
        try:
            held.add((proc / "ns" / "net").stat().st_ino)
        except OSError:
            pass
    # Written once, before containerd started: pods' namespaces are younger.
    marker = work_dir / "node" / "containerd.toml"
    since = marker.stat().st_mtime if marker.exists() else time.time()
    for pod_ns in ns.NETNS_DIR.glob("cni-*") if ns.NETNS_DIR.exists() else []:
        try:
            if pod_ns.stat().st_mtime >= since and pod_ns.stat().st_ino not in held:
                subprocess.run(["umount", str(pod_ns)], capture_output=True)
                pod_ns.unlink(missing_ok=True)
                done.append(f"removed {pod_ns}")
        except OSError:
            pass
    for point in mounts_under(work_dir, Path("/proc/self/mountinfo").read_text()):
        subprocess.run(["umount", "-l", point], capture_output=True)
        done.append(f"unmounted {point}")
    if target.exists():
        ns.delete(netns_name)
        done.append(f"deleted netns {netns_name}")
    if _remove_cgroups(set()):
        done.append("removed the kubepods cgroups")
    for root in sorted({p.name for h in _hierarchies() for p in h.glob(f"{netns_name}-node-*")}):
        if _remove_cgroups(set(), f"/{root}"):
            done.append(f"removed the cgroups under /{root}")
    if work_dir.exists():
        done.append(f"kept {work_dir} (logs: node/logs, cp/logs)")
    return done
