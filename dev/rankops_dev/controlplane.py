"""A real Kubernetes control plane run as local processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and kwok to play the kubelets.

No container engine is needed. With `netns=NAME` (the real node, real_node.py) every component runs
inside that network namespace, the API server on `advertise_address` there (the address the pod
network reaches the `kubernetes` Service's endpoint at), and the host reaches it through a
forwarder on its own loopback. Everything lives in one temporary directory (data, certificates,
tokens, logs, the kubeconfig) that is removed on a clean stop and kept when anything fails.
"""
from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from . import netns as ns
from .ports import free_ports

CONTEXT_NAME = "rankops-local"
STAGES_DIR = Path(__file__).with_name("kwok")
KWOK_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.1/16"  # kwok hands out pod IPs from here; a /16 leaves room for many pods
ADMIN_USER = "rankops-admin"


class ControlPlaneError(RuntimeError):
    """The control plane could not start; the message says which component and where its log is."""


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path



def _die_with_parent() -> None:
    # Linux PR_SET_PDEATHSIG: if the Python process is killed outright, the components get
    # SIGTERM instead of lingering as orphans holding ports and CPU.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def terminate(process: subprocess.Popen | None, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; a process that has exited is left alone."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def render_kubeconfig(server: str, ca_pem: bytes, token: str, context: str = CONTEXT_NAME) -> str:
    """An admin kubeconfig whose only context is `context`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": ADMIN_USER}}],
        "current-context": context,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


class LocalControlPlane:
    """Start with `start()` (or `with LocalControlPlane(bin_dir) as cp:`), stop with `stop()`.

    After start: `kubeconfig` (path), `server` (https URL), `token` (admin bearer token,
    group system:masters), `work_dir`, `logs_dir`.
    """

    def __init__(self, bin_dir: Path, *, work_dir: Path | None = None, keep: bool = False,
                 stages_dir: Path = STAGES_DIR, log: Callable[[str], None] | None = None,
                 netns: str | None = None, advertise_address: str = "127.0.0.1") -> None:
        self.bin_dir = Path(bin_dir)
        self.keep = keep
        self.stages_dir = stages_dir
        self.say = log or (lambda msg: print(f"[control-plane] {msg}", file=sys.stderr, flush=True))
        self._given_work_dir = work_dir
        self.work_dir: Path = Path()
        self.components: list[_Component] = []
        self.token = secrets.token_hex(24)
        self.server = ""
        self.kubeconfig = Path()
        self._ssl: ssl.SSLContext | None = None
        self.failed = False
        self.netns = netns
        self.advertise_address = advertise_address
        self.inside_server = ""  # the API server's URL from inside the namespace (netns mode)
        self._forwarders: list[ns.Forwarder] = []

    # -- public -------------------------------------------------------------------------------

    @property
    def logs_dir(self) -> Path:
        return self.work_dir / "logs"

    def start(self, timeout: float = 120.0) -> "LocalControlPlane":
        """Start every component and wait until the API serves and controllers run."""
        deadline = time.monotonic() + timeout
        if self._given_work_dir:
            self.work_dir = Path(self._given_work_dir)
            self.work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="rankops-cp-"))
        self.logs_dir.mkdir(exist_ok=True)
        try:
            self._start_all(deadline)
        except BaseException as exc:
            self.failed = True
            self.stop()
            if isinstance(exc, ControlPlaneError):
                raise
            if isinstance(exc, Exception):
                raise ControlPlaneError(f"{exc} (logs kept in {self.logs_dir})") from exc
            raise
        return self

    def stop(self) -> None:
        """Stop the components (newest first: SIGTERM, SIGKILL after 10 s) and clean up."""
        for component in reversed(self.components):
            terminate(component.process, 10)
        self.components.clear()
        for forwarder in self._forwarders:
            forwarder.close()
        self._forwarders.clear()
        if not self.work_dir.parts:
            return
        if self.failed or self.keep:
            self.say(f"kept {self.work_dir} (logs: {self.logs_dir})")
        elif self._given_work_dir is None:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def version(self) -> dict[str, Any]:
        """The API server's /version document."""
        status, body = self.get("/version")
        if status != 200:
            raise ControlPlaneError(f"/version answered {status}: {body[:200]!r}")
        return json.loads(body)

    def get(self, path: str) -> tuple[int, bytes]:
        """GET `path` on the API server as the admin; returns (status, body)."""
        request = urllib.request.Request(self.server + path,
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    @contextlib.contextmanager
    def outage(self, component: str = "kube-apiserver"):
        """The component stopped (SIGSTOP) while the block runs, then resumed (SIGCONT): an API
        server that hangs, as one behind a lost network or a stalled etcd does, for the clients'
        timeouts, reconnects and what the node lifecycle controller does after it."""
        (found,) = [c for c in self.components if c.name == component]
        found.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            found.process.send_signal(signal.SIGCONT)

    def check_alive(self) -> None:
        """Raise ControlPlaneError naming the first component that has exited."""
        for component in self.components:
            code = component.process.poll()
            if code is not None:
                self.failed = True
                raise ControlPlaneError(
                    f"{component.name} exited with code {code}; log {component.log_path}:\n"
                    f"{tail(component.log_path)}")

    def __enter__(self) -> "LocalControlPlane":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None and not issubclass(exc_info[0], KeyboardInterrupt):  # type: ignore[arg-type]
            self.failed = True
        self.stop()

    def _audit_flags(self) -> list[str]:
        """RANKOPS_DEV_APISERVER_AUDIT=FILE: who asks what, one JSON line a request (metadata only),
        for finding which client makes a request (a benchmark's question), never on by default."""
        path = os.environ.get("RANKOPS_DEV_APISERVER_AUDIT")
        if not path:
            return []
        policy = self.work_dir / "audit-policy.yaml"
        policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
                          "rules:\n- level: Metadata\n")
        return [f"--audit-policy-file={policy}", f"--audit-log-path={path}", "--audit-log-format=json"]

    # -- steps --------------------------------------------------------------------------------

    def _start_all(self, deadline: float) -> None:
        started = time.monotonic()
        pki = self.work_dir / "pki"
        pki.mkdir(exist_ok=True)
        sa_key = self._service_account_key(pki)
        tokens = self.work_dir / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)

        etcd_port, peer_port, api_port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            "--name=rankops",
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=rankops=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync=true",  # throwaway data: skip fsync, the slowest thing on CI disks
            "--quota-backend-bytes=2147483648",
            "--log-level=warn",
        ])
        etcd_health = f"{etcd_url}/health"
        if self.netns:
            etcd_health = f"http://127.0.0.1:{self._forward(etcd_port, ('127.0.0.1', etcd_port))}/health"
        self._wait("etcd health", deadline, lambda: _http_ok(etcd_health))

        self.server = f"https://127.0.0.1:{api_port}"
        self.inside_server = f"https://{self.advertise_address}:{api_port}"
        if self.netns:
            self._forward(api_port, (self.advertise_address, api_port))
            # Nodes' names resolve nowhere; logs and exec go to the kubelet's InternalIP.
            serving = [*self._serving_certificate(pki), "--kubelet-preferred-address-types=InternalIP"]
        else:
            serving = [f"--cert-dir={pki}"]  # it self-signs its serving certificate there
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            f"--bind-address={'0.0.0.0' if self.netns else '127.0.0.1'}",
            f"--advertise-address={self.advertise_address}",  # no default route on CI machines
            f"--secure-port={api_port}",
            *serving,
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            "--allow-privileged=true",
            # A namespace can pin its pods to the real nodes (scheduler.alpha.kubernetes.io/
            # node-selector and defaultTolerations annotations), keeping every other pod on kwok's.
            "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
            "--enable-priority-and-fairness=false",  # one user, no need for fairness queues
            # /debug/pprof, for benchmarks/reconcile_bench.py --profile-cpu only.
            f"--profiling={'true' if os.environ.get('RANKOPS_DEV_APISERVER_PROFILING') else 'false'}",
            *self._audit_flags(),
        ])
        ca_file = pki / "apiserver.crt"
        self._wait("the API server's certificate", deadline, ca_file.exists)
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._wait("kube-apiserver /readyz", deadline, lambda: self.get("/readyz")[0] == 200)

        self.kubeconfig = self.work_dir / "kubeconfig"
        self.kubeconfig.write_text(render_kubeconfig(self.server, ca_file.read_bytes(), self.token))
        self.kubeconfig.chmod(0o600)

        kube = f"--kubeconfig={self.kubeconfig}"
        self._spawn("kube-controller-manager", [
            kube,
            "--leader-elect=false",
            "--secure-port=0",  # nothing scrapes it; no serving certs or delegated auth needed
            f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={ca_file}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ])
        self._spawn("kube-scheduler", [
            kube,
            "--leader-elect=false",
            "--secure-port=0",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ])
        stages = sorted(self.stages_dir.glob("*.yaml"))
        if not stages:
            raise ControlPlaneError(f"no kwok stages in {self.stages_dir}")
        (self.work_dir / "kwok").mkdir(exist_ok=True)
        self._spawn("kwok", [
            kube,
            "--config=" + ",".join(str(p) for p in stages),
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
            f"--cidr={POD_CIDR}",
            # kwok renews node Leases only when given a duration; without them the node lifecycle
            # controller marks every node NotReady ~40 s after its last status update.
            "--node-lease-duration-seconds=40",
        ], env={"KWOK_WORKDIR": str(self.work_dir / "kwok")})  # ignore a user's ~/.kwok config

        # The controller-manager is running once it has made the default ServiceAccount.
        self._wait("kube-controller-manager (default ServiceAccount)", deadline,
                   lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200)
        self.say(f"ready in {time.monotonic() - started:.1f}s at {self.server}; "
                  f"kubeconfig {self.kubeconfig}")

    def _forward(self, host_port: int, target: tuple[str, int]) -> int:
        assert self.netns
        forwarder = ns.Forwarder(self.netns, host_port, target)
        self._forwarders.append(forwarder)
        return forwarder.port

    def _serving_certificate(self, pki: Path) -> list[str]:
        """A self-signed serving certificate valid for the host's loopback (through the
        forwarder), the namespace address and the `kubernetes` Service (IP and names), so pods,
        the kubelet and the host's clients verify one CA: pki/apiserver.crt."""
        cert, key = pki / "apiserver.crt", pki / "apiserver.key"
        result = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                                 "-keyout", str(key), "-out", str(cert), "-days", "7",
                                 "-subj", "/CN=kube-apiserver", "-addext",
                                 "subjectAltName=" + serving_sans(self.advertise_address, SERVICE_CIDR)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise ControlPlaneError(f"openssl req failed: {result.stderr.strip()}")
        return [f"--tls-cert-file={cert}", f"--tls-private-key-file={key}"]

    def _service_account_key(self, pki: Path) -> Path:
        key = pki / "service-account.key"
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl not found on PATH: it makes the service-account "
                                    "signing key; install it (e.g. `apt-get install openssl`)")
        result = subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise ControlPlaneError(f"openssl genrsa failed: {result.stderr.strip()}")
        return key

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        binary = self.bin_dir / name
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"{binary} is missing; build it with "
                                    f"bash {Path(__file__).with_name('build.sh')}")
        log_path = self.logs_dir / f"{name}.log"
        prefix = ns.enter_command(self.netns) if self.netns else []
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                [*prefix, str(binary), *args], stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                start_new_session=True,  # Ctrl-C reaches us only; we stop them in order
                preexec_fn=_die_with_parent)
        self.components.append(_Component(name, process, log_path))

    def _wait(self, what: str, deadline: float, ready: Callable[[], bool]) -> None:
        while True:
            self.check_alive()
            try:
                if ready():
                    return
            except (OSError, ssl.SSLError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                newest = self.components[-1] if self.components else None
                hint = f"\nlast lines of {newest.log_path}:\n{tail(newest.log_path)}" if newest else ""
                raise ControlPlaneError(f"timed out waiting for {what}; logs in {self.logs_dir}{hint}")
            time.sleep(0.2)


def serving_sans(address: str, service_cidr: str) -> str:
    """subjectAltName of the API server's certificate in netns mode: loopback, `address`, the
    first address of `service_cidr` (the `kubernetes` Service) and its DNS names."""
    import ipaddress

    service_ip = next(ipaddress.ip_network(service_cidr).hosts())
    names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", "localhost"]
    ips = list(dict.fromkeys(["127.0.0.1", address, str(service_ip)]))
    return ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in names)])


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except urllib.error.URLError:
        return False
