"""A kubelet for process nodes: pods bound to the node really run, as local processes (test harness).

kwok simulates the cluster's other nodes; a node registered here is not kwok's (no kwok
annotation), so its pods are ours: for each one the runner prepares the volumes (emptyDir,
configMap and secret with items and subPath, projected ServiceAccount tokens bound to the pod,
downward API, hostPath under the node's host root, claims bound to hostPath/local volumes), runs the init containers in order and then the
containers, each under bubblewrap in a mount namespace of its own, with the image mapped to a
local program (`pod_sandbox.image_kind`: Triton's image -> the real-Triton fixture with its CPU
stand-ins, the rankops image -> this project's own entry point). It runs the startup, readiness
and liveness probes, restarts by the pod's restartPolicy, writes exit codes and termination
messages into the pod's status (so Jobs complete or fail as on a real node), keeps each running
pod's /etc/hosts in step with the Services' Ready pods on the process nodes, stops a deleted pod's processes (its
containers' exec preStop hooks first, then SIGTERM to each container's first process, within the grace period) and
then removes the pod, and renews the node's Lease.

Not real: the containers run as root in the host's network namespace (each on its own loopback
pod IP), resources and securityContext are recorded but not enforced, images are mapped rather
than pulled. Container logs are files under `<work-dir>/pods/<namespace>_<name>/logs/`.

Run as `python -m rankops_dev.pod_runner --kubeconfig K --node NAME --work-dir DIR`.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rankops_dev import pod_sandbox as sandbox
from rankops_dev.kubeapi import Api
from rankops_dev.pod_sandbox import SandboxError

log = logging.getLogger("pod-runner")

PROCESS_NODE_LABEL = "sim.rankops.io/process-node"
PROCESS_NODE_TAINT = {"key": PROCESS_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LEASE_SECONDS = 40
TICK = 0.25
MIN_STOP_GRACE = 2.0   # a kubelet gives a container this long after its preStop hook ran out the grace
STATUS_RESYNC_S = 10.0   # a kubelet syncs pod status about this often
# Probes go straight to the pod's loopback address, never through a proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(name: str, address: str, labels: dict[str, str], taints: list[dict[str, str]],
                  capacity: dict[str, str], kubelet_version: str) -> dict[str, Any]:
    """The Node as this runner registers it (no kwok annotation: kwok leaves it alone)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  "kubernetes.io/arch": "amd64", "type": "process",
                                                  PROCESS_NODE_LABEL: "true", **labels}},
            "spec": {"taints": taints} if taints else {},
            "status": node_status(address, capacity, kubelet_version)}


def node_status(address: str, capacity: dict[str, str], kubelet_version: str) -> dict[str, Any]:
    stamp = now()
    return {"addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": address}],
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "rankops pod runner: pods run as local processes",
                            "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}],
            "nodeInfo": {"kubeletVersion": kubelet_version, "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "rankops-pod-runner://bwrap",
                         "osImage": "Red Hat Enterprise Linux 8.9 (Ootpa)", "kernelVersion": os.uname().release,
                         "machineID": "", "systemUUID": "", "bootID": ""}}


# --- one container --------------------------------------------------------------------------------

@dataclass
class ContainerRun:
    spec: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    termination_file: Path
    init: bool = False
    process: subprocess.Popen | None = None
    restarts: int = 0
    started_at: str | None = None
    finished: dict[str, Any] | None = None   # state.terminated of the last run
    last_finished: dict[str, Any] | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    ready: bool = False
    started: bool = False
    restart_at: float = 0.0
    probe_state: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def start(self) -> None:
        self.termination_file.write_text("")
        with open(self.log_path, "ab") as out:
            out.write(f"--- {now()} start: {sandbox.describe(self.argv[self.argv.index('--') + 1:])}\n".encode())
            out.flush()
            self.process = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at, self.finished, self.waiting = now(), None, None
        self.ready = self.started = False
        self.probe_state = {"since": time.monotonic()}

    def poll(self) -> int | None:
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None and self.finished is None:
            if code < 0:
                code = 128 - code  # killed by a signal: 137 for SIGKILL, as a runtime reports
            written = self.termination_file.read_text(errors="replace") if self.termination_file.exists() else ""
            message = sandbox.termination_message(written, self._log_tail(), code,
                                                  self.spec.get("terminationMessagePolicy"))
            self.finished = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                             "startedAt": self.started_at, "finishedAt": now(), "containerID": self.container_id}
            if message:
                self.finished["message"] = message
            self.ready = False
        return code

    def stop(self, grace: float) -> None:
        """SIGTERM to the container's first process, as a runtime sends it, then SIGKILL to all of it
        after `grace`. Not to bwrap: it would die of it and its --die-with-parent would kill the
        program at once, before Triton finished a request."""
        if self.process is None or self.process.poll() is not None:
            return
        inner = self.inner_pid()
        try:
            if inner is None:
                os.killpg(self.process.pid, signal.SIGTERM)
            else:
                os.kill(inner, signal.SIGTERM)
            self.process.wait(timeout=grace)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
        try:   # what is left of it (its first process gone, a runtime kills the rest too)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)

    def pre_stop(self, timeout: float) -> None:
        """The container's exec preStop hook, in its namespaces, for at most `timeout` seconds (a
        kubelet's rule: the hook runs before the stop signal, within the grace period). Said in the
        container's log; a failing hook does not keep the container from being stopped."""
        command = (((self.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        pid = self.inner_pid()
        if not command or pid is None or self.process is None or self.process.poll() is not None or timeout <= 0:
            return
        with open(self.log_path, "ab") as out:
            out.write(f"--- {now()} preStop: {sandbox.describe(command)}\n".encode())
            out.flush()
            try:
                code = subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "--", *command], env=self.env,
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                code = "timed out"
            except OSError as exc:
                code = str(exc)
            out.write(f"--- {now()} preStop done: {code}\n".encode())

    def inner_pid(self) -> int | None:
        """The container's first process inside bwrap's namespaces (for exec probes)."""
        if self.process is None:
            return None
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
            return int(children[0]) if children else None
        except OSError:
            return None

    @property
    def container_id(self) -> str:
        return f"process://{self.process.pid}" if self.process else ""

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-16384:]
        except OSError:
            return ""

    def status(self) -> dict[str, Any]:
        state: dict[str, Any]
        if self.finished is not None:
            state = {"terminated": self.finished}
        elif self.process is not None and self.waiting is None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            reason, message = self.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        found = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "", "containerID": self.container_id,
                 "ready": self.ready, "restartCount": self.restarts, "state": state,
                 "started": self.started if not self.init else None}
        if self.last_finished:
            found["lastState"] = {"terminated": self.last_finished}
        if not self.container_id:
            found.pop("containerID")
        return {k: v for k, v in found.items() if v is not None}


# --- probes ---------------------------------------------------------------------------------------

def probe_once(probe: dict[str, Any], pod_ip: str, container: ContainerRun) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    ports = {p.get("name"): p["containerPort"] for p in container.spec.get("ports") or [] if p.get("name")}
    if "httpGet" in probe:
        get = probe["httpGet"]
        port = ports.get(get["port"], get["port"]) if isinstance(get["port"], str) else get["port"]
        host = get.get("host") or pod_ip
        url = f"{get.get('scheme', 'HTTP').lower()}://{host}:{port}{get.get('path', '/')}"
        try:
            with _DIRECT.open(url, timeout=timeout) as response:
                return 200 <= response.status < 400
        except urllib.error.HTTPError as exc:
            return 200 <= exc.code < 400
        except (OSError, ValueError):
            return False
    if "tcpSocket" in probe:
        port = probe["tcpSocket"]["port"]
        port = ports.get(port, port) if isinstance(port, str) else port
        try:
            with socket.create_connection((probe["tcpSocket"].get("host") or pod_ip, int(port)), timeout=timeout):
                return True
        except OSError:
            return False
    if "exec" in probe:
        pid = container.inner_pid()
        if pid is None:
            return False
        try:
            result = subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "--", *probe["exec"]["command"]],
                                    env=container.env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0
    return False  # grpc probes: not run here


def advance_probes(container: ContainerRun, pod_ip: str) -> str | None:
    """Run the probes that are due; 'restart' when startup or liveness failed for good."""
    spec, state, clock = container.spec, container.probe_state, time.monotonic()

    def due(kind: str, probe: dict[str, Any]) -> bool:
        key = f"{kind}-next"
        if key not in state:
            state[key] = state["since"] + float(probe.get("initialDelaySeconds", 0))
        if clock < state[key]:
            return False
        state[key] = clock + float(probe.get("periodSeconds", 10))
        return True

    def outcome(kind: str, probe: dict[str, Any]) -> bool | None:
        """True/False once the thresholds say so, None while undecided."""
        ok = probe_once(probe, pod_ip, container)
        good, bad = state.get(f"{kind}-good", 0), state.get(f"{kind}-bad", 0)
        good, bad = (good + 1, 0) if ok else (0, bad + 1)
        state[f"{kind}-good"], state[f"{kind}-bad"] = good, bad
        if good >= int(probe.get("successThreshold", 1)):
            return True
        if bad >= int(probe.get("failureThreshold", 3)):
            return False
        return None

    startup = spec.get("startupProbe")
    if not container.started:
        if startup is None:
            container.started = True
        elif due("startup", startup):
            verdict = outcome("startup", startup)
            if verdict is False:
                return "restart"
            container.started = bool(verdict)
        if not container.started:
            return None
    readiness = spec.get("readinessProbe")
    if readiness is None:
        container.ready = True
    elif due("readiness", readiness):
        verdict = outcome("readiness", readiness)
        if verdict is not None:
            container.ready = verdict
    liveness = spec.get("livenessProbe")
    if liveness is not None and due("liveness", liveness) and outcome("liveness", liveness) is False:
        return "restart"
    return None


# --- one pod ---------------------------------------------------------------------------------------

class PodWorker(threading.Thread):
    def __init__(self, runner: "PodRunner", pod: dict[str, Any], pod_ip: str) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.runner, self.pod, self.pod_ip = runner, pod, pod_ip
        self.namespace, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = runner.work_dir / "pods" / f"{self.namespace}_{self.pod_name}_{self.uid[:8]}"
        self.logs = self.dir / "logs"
        self.hosts = self.dir / "hosts"
        self._hosts_lock = threading.Lock()  # the worker and the refresher both write it
        self.stopping = threading.Event()
        self.grace = 0.0
        self.pre_stop = False   # run the containers' preStop hooks when stopping (a deleted pod's)
        self.inits: list[ContainerRun] = []
        self.containers: list[ContainerRun] = []
        self.reported: str = ""
        self.reported_at = 0.0   # time.monotonic() of the last status write that succeeded
        self.conditions: list[dict[str, Any]] = []
        self.started = now()
        self.init_done = False
        self.init_failed = False
        self.problem: tuple[str, str] | None = None

    # -- lifecycle --
    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - a harness bug must show in the pod, not vanish
            log.exception("pod %s/%s", self.namespace, self.pod_name)
            self.problem = ("RunnerError", f"{type(exc).__name__}: {exc}")
            self._report()
        finally:
            self._terminate()
            self.runner.worker_done(self)

    def _terminate(self) -> None:
        """Every container at once, as a kubelet: its preStop hook, then SIGTERM, then SIGKILL, all
        within the grace period (capped at 10 s past the hooks, to keep the harness quick)."""
        grace, pre_stop = self.grace, self.pre_stop   # as when it began: a later event changes neither
        deadline = time.monotonic() + grace

        def stop(container: ContainerRun) -> None:
            if pre_stop:
                container.pre_stop(deadline - time.monotonic())
            left = deadline - time.monotonic()
            container.stop(min(max(left, MIN_STOP_GRACE) if grace else 0.0, 10.0))

        threads = [threading.Thread(target=stop, args=(c,), daemon=True) for c in self.inits + self.containers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        # Names as of now, not of the last refresh: a Job made right after the pod it calls turned
        # Ready (the operator's gate Jobs) must find it.
        self.write_hosts(self.runner.refresh_services())
        restart_policy = self.pod["spec"].get("restartPolicy", "Always")
        volumes = self._prepare_until_ready()
        if volumes is None:
            return
        for spec in self.pod["spec"].get("initContainers") or []:
            run = self._container(spec, volumes, init=True)
            if run is None:
                return
            self.inits.append(run)
        for run in self.inits:
            while not self.stopping.is_set():
                if run.process is None or (run.finished and run.finished["exitCode"] != 0 and restart_policy != "Never"
                                           and time.monotonic() >= run.restart_at):
                    if run.process is not None:
                        run.last_finished, run.restarts = run.finished, run.restarts + 1
                    run.start()
                code = run.poll()
                if code == 0:
                    break
                if code is not None:
                    if restart_policy == "Never":
                        self.init_failed = True
                        self._report()
                        return self._wait_deleted()
                    if not run.restart_at or run.restart_at < time.monotonic() - 1:
                        run.restart_at = time.monotonic() + self._backoff(run)
                        run.waiting = ("CrashLoopBackOff", f"back-off restarting failed container {run.name}")
                self._report()
                self.stopping.wait(TICK)
            if self.stopping.is_set():
                return
        self.init_done = True
        for spec in self.pod["spec"]["containers"]:
            run = self._container(spec, volumes)
            if run is None:
                return
            self.containers.append(run)
        for run in self.containers:
            run.start()
        while not self.stopping.is_set():
            for run in self.containers:
                code = run.poll()
                if code is None and run.process is not None and run.finished is None:
                    if advance_probes(run, self.pod_ip) == "restart":
                        with open(run.log_path, "ab") as out:
                            out.write(f"--- {now()} probe failed: restarting\n".encode())
                        run.stop(min(float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)), 10.0))
                        run.poll()
                elif run.finished is not None:
                    again = restart_policy == "Always" or (restart_policy == "OnFailure" and run.finished["exitCode"])
                    if again:
                        if not run.restart_at:
                            run.restart_at = time.monotonic() + self._backoff(run)
                        elif time.monotonic() >= run.restart_at:
                            run.last_finished, run.restarts, run.restart_at = run.finished, run.restarts + 1, 0.0
                            run.start()
            self._report()
            if self._phase() in ("Succeeded", "Failed"):
                return self._wait_deleted()
            self.stopping.wait(TICK)

    def _wait_deleted(self) -> None:
        while not self.stopping.wait(1.0):
            pass

    def _backoff(self, run: ContainerRun) -> float:
        return min(1.0 * 2 ** run.restarts, 20.0)

    def stop(self, grace: float, pre_stop: bool = False) -> None:
        self.grace, self.pre_stop = grace, pre_stop and grace > 0
        self.stopping.set()

    # -- preparation --
    def _prepare_until_ready(self) -> dict[str, Path] | None:
        while not self.stopping.is_set():
            try:
                return self.runner.prepare_volumes(self)
            except SandboxError as exc:
                self.problem = (exc.reason, exc.message)
                self._report()
            self.stopping.wait(2.0)
        return None

    def _container(self, spec: dict[str, Any], volumes: dict[str, Path], init: bool = False) -> ContainerRun | None:
        while not self.stopping.is_set():
            try:
                argv, env = self.runner.program(self, spec, volumes)
                self.problem = None
                return ContainerRun(spec, argv, env, self.logs / f"{spec['name']}.log",
                                    self.dir / f"{spec['name']}.termination-log", init=init)
            except SandboxError as exc:
                self.problem = (exc.reason, exc.message)
                self._report()
            self.stopping.wait(2.0)
        return None

    def write_hosts(self, services: dict[tuple[str, str], list[str]]) -> None:
        text = sandbox.hosts_file(self.pod_name, self.pod_ip, self.namespace, services)
        with self._hosts_lock:
            if not self.hosts.exists() or self.hosts.read_text() != text:
                with open(self.hosts, "a+") as out:  # in place: the pods see this inode
                    out.seek(0)
                    out.truncate()
                    out.write(text)

    # -- status --
    def _phase(self) -> str:
        restart_policy = self.pod["spec"].get("restartPolicy", "Always")
        exits = [None if c.finished is None else c.finished["exitCode"] for c in self.containers]
        if not self.init_done:
            return sandbox.pod_phase(restart_policy, self.init_failed, [])
        return sandbox.pod_phase(restart_policy, False, exits)

    def _report(self) -> None:
        stamp = now()
        ready = self.init_done and bool(self.containers) and all(c.ready for c in self.containers)
        before = {c["type"]: c for c in self.conditions}
        conditions = [sandbox.condition("PodScheduled", True, self.started),
                      sandbox.condition("Initialized", self.init_done, stamp, "ContainersNotInitialized",
                                        before.get("Initialized")),
                      sandbox.condition("ContainersReady", ready, stamp, "ContainersNotReady",
                                        before.get("ContainersReady")),
                      sandbox.condition("Ready", ready, stamp, "ContainersNotReady", before.get("Ready"))]
        self.conditions = conditions
        spec_containers = self.pod["spec"]["containers"]
        statuses = [c.status() for c in self.containers] or [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
             "started": False, "state": {"waiting": {"reason": (self.problem or ("PodInitializing", ""))[0],
                                                     **({"message": self.problem[1]} if self.problem else {})}}}
            for c in spec_containers]
        inits = [c.status() for c in self.inits]
        status = {"phase": self._phase(), "hostIP": self.runner.address, "hostIPs": [{"ip": self.runner.address}],
                  "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}], "startTime": self.started,
                  "conditions": conditions, "containerStatuses": statuses}
        if inits:
            status["initContainerStatuses"] = inits
        # A change is written at once (the transition times would make every report new), and the
        # same status again every STATUS_RESYNC_S, as a kubelet's status manager does: what the API
        # server lost (a write refused during an outage) or what another writer changed (the node
        # lifecycle controller marking the pods NotReady while the node's Lease lapsed) is put right.
        key = json.dumps({**status, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                                   for c in conditions]}, sort_keys=True)
        if key == self.reported and time.monotonic() - self.reported_at < STATUS_RESYNC_S:
            return
        if self.runner.patch_status(self, status):
            self.reported, self.reported_at = key, time.monotonic()


# --- the node ---------------------------------------------------------------------------------------

BLOCK_LOCKS = Path(os.environ.get("TMPDIR", "/tmp")) / "rankops-pod-runner-blocks"


def _listening_ipv4() -> set[ipaddress.IPv4Address]:
    found = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":  # LISTEN
            found.add(ipaddress.IPv4Address(bytes.fromhex(fields[1].split(":")[0])[::-1]))
    return found


def claim_address_block(requested: str) -> tuple[str, Any]:
    """`requested`, or the next block of its size in 127/8 when another pod runner on this machine
    holds it (a lock file, held for this runner's life) or something listens in it: pod runners of
    concurrent sessions never hand out the same pod IP (a probe would reach the other's pod)."""
    import fcntl

    net = ipaddress.ip_network(requested)
    BLOCK_LOCKS.mkdir(parents=True, exist_ok=True)
    listening = _listening_ipv4()
    candidate = net
    while candidate.subnet_of(ipaddress.ip_network("127.0.0.0/8")):
        handle = open(BLOCK_LOCKS / str(candidate.network_address), "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not any(ip in candidate for ip in listening):
                return str(candidate), handle
        except OSError:
            pass
        handle.close()
        candidate = ipaddress.ip_network((int(candidate.network_address) + candidate.num_addresses, candidate.prefixlen))
    raise RuntimeError(f"no free loopback block like {requested} for the pod IPs")


class PodRunner:
    def __init__(self, kubeconfig: str, node: str, work_dir: Path, *, host_root: Path | None = None,
                 labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
                 capacity: dict[str, str] | None = None,
                 address_block: str = "127.77.0.0/16", kubelet_version: str = "v1.34.4") -> None:
        self.api = Api(kubeconfig)
        self.node = node
        self.work_dir = Path(work_dir)
        self.host_root = host_root
        self.labels = labels or {}
        self.taints = [PROCESS_NODE_TAINT] if taints is None else taints
        self.capacity = capacity or {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi",
                                     "nvidia.com/gpu": "4"}
        address_block, self._block_lock = claim_address_block(address_block)
        hosts = ipaddress.ip_network(address_block).hosts()
        self.address = str(next(hosts))
        self._free_ips = [str(ip) for ip, _ in zip(hosts, range(4000))]
        self.kubelet_version = kubelet_version
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self._services: dict[tuple[str, str], list[str]] = {}
        self.stopping = threading.Event()
        parsed = urlparse(self.api.server)
        self.api_host, self.api_port = parsed.hostname or "127.0.0.1", str(parsed.port or 443)

    # -- node --
    def register(self) -> None:
        manifest = node_manifest(self.node, self.address, self.labels, self.taints, self.capacity, self.kubelet_version)
        if self.api.call("GET", f"/api/v1/nodes/{self.node}") is None:
            self.api.call("POST", "/api/v1/nodes", manifest)
        self.api.call("PATCH", f"/api/v1/nodes/{self.node}/status", {"status": manifest["status"]},
                      content_type="application/merge-patch+json")

    def heartbeat(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.node, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": stamp}}
        if self.api.call("GET", path) is None:
            self.api.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        else:
            self.api.call("PATCH", path, {"spec": lease["spec"]}, content_type="application/merge-patch+json")
        status = node_status(self.address, self.capacity, self.kubelet_version)
        self.api.call("PATCH", f"/api/v1/nodes/{self.node}/status", {"status": {"conditions": status["conditions"]}},
                      content_type="application/merge-patch+json")

    # -- Services -> addresses, for every pod's /etc/hosts --
    def services(self) -> dict[tuple[str, str], list[str]]:
        with self.lock:
            return dict(self._services)

    def refresh_services(self) -> dict[tuple[str, str], list[str]]:
        services = (self.api.call("GET", "/api/v1/services") or {}).get("items", [])
        # Pods of every process node (their addresses answer; kwok's do not), not only this one's.
        nodes = (self.api.call("GET", "/api/v1/nodes", query=[("labelSelector", f"{PROCESS_NODE_LABEL}=true")])
                 or {}).get("items", [])
        pods = [pod for node in {n["metadata"]["name"] for n in nodes} | {self.node}
                for pod in (self.api.call("GET", "/api/v1/pods", query=[("fieldSelector", f"spec.nodeName={node}")])
                            or {}).get("items", [])]
        found = sandbox.service_addresses(services, pods)
        with self.lock:
            self._services = found
            workers = list(self.workers.values())
        for worker in workers:
            if worker.hosts.parent.exists():
                worker.write_hosts(found)
        return found

    # -- pods --
    def sync(self, pod: dict[str, Any], deleted: bool = False) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self.lock:
            worker = self.workers.get(uid)
        if deleted:
            if worker:
                worker.stop(0)
            return
        if meta.get("deletionTimestamp"):
            if worker is None:
                self._remove(pod)
            else:
                # A deleted pod's hooks run; a stopping runner's do not (a node that dies runs none).
                worker.stop(float(meta.get("deletionGracePeriodSeconds") or 0), pre_stop=True)
            return
        if worker is None and not (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            with self.lock:
                ip = self._free_ips.pop(0)
                worker = PodWorker(self, pod, ip)
                self.workers[uid] = worker
            worker.start()

    def worker_done(self, worker: PodWorker) -> None:
        with self.lock:
            self.workers.pop(worker.uid, None)
            self._free_ips.append(worker.pod_ip)
        if worker.stopping.is_set():
            self._remove(worker.pod)

    def _remove(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}
        try:
            self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
        except Exception as exc:  # noqa: BLE001 - a conflict means it is already gone
            log.info("delete %s/%s: %s", meta["namespace"], meta["name"], exc)

    def patch_status(self, worker: PodWorker, status: dict[str, Any]) -> bool:
        """Whether the API server took it (else the next report writes it again)."""
        try:
            self.api.call("PATCH", f"/api/v1/namespaces/{worker.namespace}/pods/{worker.pod_name}/status",
                          {"metadata": {"uid": worker.uid}, "status": status},
                          content_type="application/merge-patch+json")
            return True
        except Exception as exc:  # noqa: BLE001 - the next report retries
            log.warning("status of %s/%s: %s", worker.namespace, worker.pod_name, exc)
            return False

    # -- volumes --
    def prepare_volumes(self, worker: PodWorker) -> dict[str, Path]:
        dirs: dict[str, Path] = {}
        root = worker.dir / "volumes"
        for volume in worker.pod["spec"].get("volumes") or []:
            name = volume["name"]
            target = root / name
            if "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume or "secret" in volume:
                self._write_source(worker, target, volume.get("configMap") or volume.get("secret"), "secret" in volume)
            elif "projected" in volume:
                target.mkdir(parents=True, exist_ok=True)
                for source in volume["projected"].get("sources") or []:
                    if "serviceAccountToken" in source:
                        token = self._token(worker, source["serviceAccountToken"])
                        (target / source["serviceAccountToken"].get("path", "token")).write_text(token)
                    elif "configMap" in source or "secret" in source:
                        self._write_source(worker, target, source.get("configMap") or source.get("secret"),
                                           "secret" in source)
                    elif "downwardAPI" in source:
                        self._write_downward(worker, target, source["downwardAPI"])
            elif "downwardAPI" in volume:
                self._write_downward(worker, target, volume["downwardAPI"])
            elif "hostPath" in volume:
                target = self._host_path(volume["hostPath"])
            elif "persistentVolumeClaim" in volume:
                target = self._claim_path(worker.namespace, volume["persistentVolumeClaim"]["claimName"])
            else:
                kind = next((k for k in volume if k != "name"), "?")
                raise SandboxError("FailedMount", f"volume {name!r}: {kind} volumes are not supported by the pod runner "
                                                  "(emptyDir, configMap, secret, projected, downwardAPI, hostPath, "
                                                  "persistentVolumeClaim are)")
            dirs[name] = target
        return dirs

    def _host_path(self, host_path: dict[str, Any]) -> Path:
        path = Path(host_path["path"])
        where = self.host_root / path.relative_to("/") if self.host_root else path
        kind = host_path.get("type", "")
        # The kubelet's type checks. A sample host tree holds regular files where a real host has
        # devices: a CharDevice there may be one, and one the sample lacks is an empty file (which
        # the checks read as they read a device they may not open: no value).
        if kind == "CharDevice" and self.host_root and not where.exists():
            where.parent.mkdir(parents=True, exist_ok=True)
            where.touch()
        if kind == "DirectoryOrCreate" and not where.exists():
            where.mkdir(parents=True)
        if kind == "FileOrCreate" and not where.exists():
            where.parent.mkdir(parents=True, exist_ok=True)
            where.touch()
        if kind == "Directory" and not where.is_dir():
            raise SandboxError("FailedMount", f"hostPath type check failed: {path} is not a directory")
        if kind == "File" and not where.is_file():
            raise SandboxError("FailedMount", f"hostPath type check failed: {path} is not a file")
        if kind == "CharDevice" and not (where.is_char_device() or (self.host_root and where.is_file())):
            raise SandboxError("FailedMount", f"hostPath type check failed: {path} is not a character device")
        return where

    def _claim_path(self, namespace: str, claim: str) -> Path:
        """A claim's directory: the hostPath or local path of the PersistentVolume it is bound to."""
        found = self.api.call("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if found is None:
            raise SandboxError("FailedMount", f'persistentvolumeclaim "{claim}" not found')
        volume = (found.get("spec") or {}).get("volumeName")
        if not volume or (found.get("status") or {}).get("phase") != "Bound":
            raise SandboxError("FailedMount", f'persistentvolumeclaim "{claim}" is not bound')
        pv = self.api.call("GET", f"/api/v1/persistentvolumes/{volume}") or {}
        source = (pv.get("spec") or {}).get("hostPath") or (pv.get("spec") or {}).get("local")
        if not source:
            raise SandboxError("FailedMount", f"persistentvolume {volume}: only hostPath and local volumes "
                                              "are mounted on a process node")
        return self._host_path({"path": source["path"], "type": "Directory"})

    def _read(self, namespace: str, name: str, secret: bool) -> dict[str, str] | None:
        kind = "secrets" if secret else "configmaps"
        found = self.api.call("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if found is None:
            return None
        data = dict(found.get("data") or {})
        if secret:
            return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}
        data.update({k: base64.b64decode(v).decode("latin-1") for k, v in (found.get("binaryData") or {}).items()})
        return data

    def _write_source(self, worker: PodWorker, target: Path, source: dict[str, Any], secret: bool) -> None:
        name = source.get("secretName") if secret else source.get("name")
        data = self._read(worker.namespace, name, secret)
        target.mkdir(parents=True, exist_ok=True)
        if data is None:
            if source.get("optional"):
                return
            kind = "secret" if secret else "configmap"
            raise SandboxError("FailedMount", f'{kind} "{name}" not found')
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                raise SandboxError("FailedMount", f"couldn't find key {item['key']} in {name}")
            path = target / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(data[item["key"]])

    def _write_downward(self, worker: PodWorker, target: Path, source: dict[str, Any]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for item in source.get("items") or []:
            if "fieldRef" in item:
                value = sandbox.field_value(worker.pod, item["fieldRef"]["fieldPath"], worker.pod_ip, self.node)
                (target / item["path"]).write_text(value)

    def _token(self, worker: PodWorker, source: dict[str, Any]) -> str:
        account = worker.pod["spec"].get("serviceAccountName") or "default"
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": max(int(source.get("expirationSeconds", 3607)), 600),
                            "audiences": [source["audience"]] if source.get("audience") else None,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": worker.pod_name,
                                               "uid": worker.uid}}}
        if request["spec"]["audiences"] is None:
            del request["spec"]["audiences"]
        answer = self.api.call("POST", f"/api/v1/namespaces/{worker.namespace}/serviceaccounts/{account}/token", request)
        if not answer:
            raise SandboxError("FailedMount", f"serviceaccount {account!r} not found")
        return answer["status"]["token"]

    # -- images --
    def program(self, worker: PodWorker, spec: dict[str, Any], volumes: dict[str, Path]) -> tuple[list[str], dict]:
        """The bwrap command line and environment for one container."""
        image = spec.get("image", "")
        kind = sandbox.image_kind(image)
        if kind is None:
            raise SandboxError("ErrImageNeverPull", f"image {image!r} has no local stand-in on a process node "
                                                    "(tritonserver and rankops images run here)")
        config_maps, secrets = self._env_sources(worker, spec)
        base = {"PATH": BASE_PATH, "HOME": "/root", "HOSTNAME": worker.pod_name,
                "KUBERNETES_SERVICE_HOST": self.api_host, "KUBERNETES_SERVICE_PORT": self.api_port,
                "KUBERNETES_SERVICE_PORT_HTTPS": self.api_port, "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
        mounts = sandbox.volume_mounts(spec, volumes)
        if kind == "triton":
            from rankops_dev import triton

            install = triton.ensure_installed(install=False)
            missing = install.missing()
            if missing:
                raise SandboxError("ErrImageNeverPull", f"the real-Triton fixture is not installed ({missing[0]} "
                                                        "missing): run `rankops dev triton install`")
            base = install.environment(base)
            mounts = [self._cpu_config(worker, spec, m) for m in mounts]
        else:
            venv_bin = str(Path(sys.executable).parent)
            base = {**base, "PATH": f"{venv_bin}:{BASE_PATH}", "VIRTUAL_ENV": str(Path(venv_bin).parent)}
        import rankops

        # The source roots of both distributions: the venv's `rankops` loads rankops-dev's entry point.
        programs = [Path(sys.prefix), Path(sys.base_prefix), Path(rankops.__file__).parents[1],
                    Path(__file__).parents[1]]
        if kind == "triton":
            programs.append(install.root)
        mounts = [*mounts, *sandbox.program_mounts(programs)]
        env = sandbox.container_env(spec, worker.pod, base, config_maps, secrets, worker.pod_ip, self.node)
        argv = sandbox.command_line(spec, env)
        if not argv:
            raise SandboxError("CreateContainerConfigError", f"container {spec['name']} has no command")
        if kind == "triton" and Path(argv[0]).name == "tritonserver":
            argv = [str(install.server_bin), *triton.local_arguments(argv[1:], worker.pod_ip, install)]
        elif kind == "rankops" and argv[0] in ("rankops", "python", "python3"):
            argv = [str(Path(sys.executable).parent / ("rankops" if argv[0] == "rankops" else "python")), *argv[1:]]
        termination = spec.get("terminationMessagePath") or "/dev/termination-log"
        full = sandbox.bwrap_argv(argv, mounts, worker.hosts, worker.dir / f"{spec['name']}.termination-log",
                                  termination, worker.pod_name, spec.get("workingDir"))
        (worker.dir / f"{spec['name']}.termination-log").touch()
        return full, env

    def _cpu_config(self, worker: PodWorker, spec: dict[str, Any], mount: sandbox.BindMount) -> sandbox.BindMount:
        """Triton's config.pbtxt with the CPU edits of the fixture (KIND_GPU -> KIND_CPU), said in the log."""
        from rankops_dev import triton

        if not mount.target.endswith("/config.pbtxt") or not mount.source.is_file():
            return mount
        text, edits = triton.cpu_config(mount.source.read_text())
        edited = worker.dir / "cpu-configs" / mount.target.strip("/").replace("/", "_")
        edited.parent.mkdir(parents=True, exist_ok=True)
        edited.write_text(text)
        with open(worker.logs / f"{spec['name']}.log", "ab") as out:
            for edit in edits:
                out.write(f"--- pod runner, CPU stand-in: {mount.target}: {edit}\n".encode())
        return sandbox.BindMount(edited, mount.target, True)

    def _env_sources(self, worker: PodWorker, spec: dict[str, Any]) -> tuple[dict, dict]:
        config_maps: dict[str, dict[str, str]] = {}
        secrets: dict[str, dict[str, str]] = {}
        refs = [s.get("secretRef") or s.get("configMapRef") for s in spec.get("envFrom") or []]
        kinds = ["secretRef" in s for s in spec.get("envFrom") or []]
        for item in spec.get("env") or []:
            source = (item.get("valueFrom") or {})
            if "secretKeyRef" in source or "configMapKeyRef" in source:
                refs.append(source.get("secretKeyRef") or source.get("configMapKeyRef"))
                kinds.append("secretKeyRef" in source)
        for ref, secret in zip(refs, kinds):
            data = self._read(worker.namespace, ref["name"], secret)
            if data is not None:
                (secrets if secret else config_maps)[ref["name"]] = data
        return config_maps, secrets

    # -- main loop --
    def run(self) -> None:
        self.register()
        threading.Thread(target=self._every, args=(10.0, self.heartbeat), daemon=True, name="lease").start()
        threading.Thread(target=self._every, args=(0.5, self.refresh_services), daemon=True, name="hosts").start()
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                listed = self.api.call("GET", "/api/v1/pods", query=[("fieldSelector", selector)])
                for pod in listed.get("items", []):
                    self.sync(pod)
                self._watch(selector, listed["metadata"]["resourceVersion"])
            except Exception as exc:  # noqa: BLE001 - reconnect; the list catches up
                if not self.stopping.is_set():
                    log.warning("pod watch: %s", exc)
                    time.sleep(1)

    def _watch(self, selector: str, version: str) -> None:
        response = self.api.stream("/api/v1/pods", [("fieldSelector", selector), ("watch", "true"),
                                                     ("resourceVersion", version), ("timeoutSeconds", "60"),
                                                     ("allowWatchBookmarks", "false")])
        try:
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        return
                    self.sync(event["object"], deleted=event["type"] == "DELETED")
        finally:
            response.release_conn()

    def _every(self, seconds: float, what: Any) -> None:
        while not self.stopping.is_set():
            try:
                what()
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: %s", getattr(what, "__name__", what), exc)
            self.stopping.wait(seconds)

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.stop(5)
        for worker in workers:
            worker.join(timeout=20)


def parse_taint(text: str) -> dict[str, str]:
    """'nvidia.com/gpu=present:NoSchedule' -> a taint (the value may be empty: 'key:NoSchedule')."""
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise SystemExit(f"--taint {text!r}: expected KEY=VALUE:EFFECT with EFFECT NoSchedule, PreferNoSchedule "
                         "or NoExecute")
    return {"key": key, **({"value": value} if value else {}), "effect": effect}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rankops_dev.pod_runner",
                                     description="run the pods bound to one node as local processes (test harness)")
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig of the local control plane")
    parser.add_argument("--node", required=True, help="the Node to register and run pods for")
    parser.add_argument("--work-dir", required=True, type=Path, help="pod directories and container logs go here")
    parser.add_argument("--host-root", type=Path, help="the node's filesystem for hostPath volumes (default: /)")
    parser.add_argument("--label", action="append", default=[], metavar="K=V", help="an extra node label")
    parser.add_argument("--taint", action="append", metavar="KEY=VALUE:EFFECT",
                        help=f"a taint of the node, instead of {PROCESS_NODE_LABEL}=true:NoSchedule (repeatable)")
    parser.add_argument("--gpus", type=int, default=4, help="nvidia.com/gpu capacity to advertise (scheduling only)")
    parser.add_argument("--address-block", default="127.77.0.0/16", help="loopback block for the node and pod IPs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    if shutil.which("bwrap") is None:
        print("pod runner: bwrap (bubblewrap) not found on PATH: apt-get install bubblewrap", file=sys.stderr)
        return 2
    from rankops_dev.binaries import k8s_version

    labels = dict(item.split("=", 1) for item in args.label)
    taints = None if args.taint is None else [parse_taint(text) for text in args.taint]
    capacity = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi",
                "nvidia.com/gpu": str(args.gpus)}
    runner = PodRunner(args.kubeconfig, args.node, args.work_dir, host_root=args.host_root, labels=labels,
                       taints=taints, capacity=capacity, address_block=args.address_block,
                       kubelet_version=k8s_version())
    signal.signal(signal.SIGTERM, lambda *_: runner.stopping.set())
    thread = threading.Thread(target=runner.run, daemon=True, name="watch")
    thread.start()
    try:
        while not runner.stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    runner.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
