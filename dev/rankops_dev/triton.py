"""A real Triton Inference Server on this machine, for the tests, e2e, benchmarks and `rankops dev`.

Test harness, not part of the operator. The `nvidia-pytriton` wheel carries a real `tritonserver`
(2.51) with its Python backend and response cache; `ensure_installed()` unpacks it once per
machine under the rankops cache (like the control-plane binaries), with

- a backend directory: the Python backend, its stub for the stub's Python, and CPU stand-ins for
  the onnxruntime, pytorch and tensorrt backends (`triton_standin.py`);
- the stand-ins' own virtualenv (numpy < 2, which the stub needs, and onnxruntime), kept apart
  from the project's: the stub runs the first `python3` on its PATH, ignoring PYTHONPATH, so the
  server starts with that virtualenv first on PATH; torch is linked in from the running
  interpreter's site-packages by a .pth file (after numpy 1.26, which therefore wins).

`TritonServer.for_rendered()` starts `tritonserver` with exactly the arguments of a rendered
Deployment's `triton` container, changing only the model repository, the ports (local
addresses) and the backend and cache directories, over a model repository laid out as the pod's
(`/models/<model>/config.pbtxt` and the version directory). What a CPU cannot take is changed in
one place, `cpu_config()`, which returns the edits it made so tests can print them.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .ports import free_ports

PYTRITON_VERSION = "0.7.0"          # ships tritonserver 2.51.0
TRITON_VERSION = "2.51.0"
# The Python backend's stub returns empty tensors with numpy 2 (see shared notes).
STUB_REQUIREMENTS = ("numpy==1.26.4", "onnxruntime==1.19.2")
STANDIN_BACKENDS = ("onnxruntime", "pytorch", "tensorrt")
STUB_PYTHON = "3.11"                 # the stub embeds this libpython (Debian's libpython3.11)
# NVIDIA's perf_analyzer ships inside the tritonclient wheels up to 2.43.0.
PERF_ANALYZER_WHEEL = "tritonclient==2.43.0"

# What Triton logs on every CPU-only start (seen on 2.51); any other warning or error is a finding.
HARMLESS_WARNINGS = (
    "Failed to initialize NVML",
    "DCGM unable to start",
    "failed to allocate pinned system memory",
    "Unable to allocate pinned system memory",
    "CudaDriverHelper has not been initialized",
)


class TritonError(RuntimeError):
    """The server could not be installed, started or made ready; the message says why."""


def cache_root() -> Path:
    base = Path(os.environ.get("RANKOPS_CACHE") or Path.home() / ".cache" / "rankops")
    return base / "triton" / TRITON_VERSION


@dataclass(frozen=True)
class TritonInstall:
    root: Path

    @property
    def package(self) -> Path:
        return self.root / "wheel" / "pytriton" / "tritonserver"

    @property
    def server_bin(self) -> Path:
        return self.package / "bin" / "tritonserver"

    @property
    def lib_dir(self) -> Path:
        return self.root / "wheel" / "nvidia_pytriton.libs"

    @property
    def backend_dir(self) -> Path:
        return self.root / "backends"

    @property
    def cache_dir(self) -> Path:
        return self.package / "caches"

    @property
    def stub_venv(self) -> Path:
        return self.root / "stub-venv"

    @property
    def stub_site(self) -> Path:
        return self.stub_venv / "lib" / f"python{STUB_PYTHON}" / "site-packages"

    @property
    def perf_analyzer(self) -> Path:
        return self.root / "perf_analyzer" / "bin" / "perf_analyzer"

    def perf_analyzer_environment(self) -> dict[str, str]:
        """perf_analyzer needs libb64 and libcudart under their plain names (linked into lib/)."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.perf_analyzer.parent.parent / "lib"),
                                                               str(self.lib_dir), env.get("LD_LIBRARY_PATH")]))
        return env

    def missing(self) -> list[str]:
        wanted = [self.server_bin, self.perf_analyzer, self.backend_dir / "python" / "triton_python_backend_stub",
                  self.stub_site / "numpy", self.stub_site / "onnxruntime",
                  *(self.backend_dir / b / "model.py" for b in STANDIN_BACKENDS)]
        return [str(p) for p in wanted if not p.exists()]

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's environment (on `base`, default ours): its libraries, and the stand-ins'
        virtualenv first on PATH."""
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.lib_dir), env.get("LD_LIBRARY_PATH")]))
        others = [p for p in env.get("PATH", "").split(os.pathsep)
                  if p and not (env.get("VIRTUAL_ENV") and p.startswith(env["VIRTUAL_ENV"]))]
        env["PATH"] = os.pathsep.join([str(self.stub_venv / "bin"), *others])
        env["VIRTUAL_ENV"] = str(self.stub_venv)
        for name in ("PYTHONPATH", "PYTHONHOME"):
            env.pop(name, None)
        # One thread per stand-in instance: Triton's instances, not BLAS threads, are the parallelism.
        env.setdefault("OMP_NUM_THREADS", "1")
        return env


def _torch_site() -> list[str]:
    """Where the running interpreter has torch (for the pytorch stand-in); empty without torch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    return [str(Path(spec.origin).parent.parent)] if spec and spec.origin else []


def ensure_installed(install: bool = True, say: Callable[[str], None] | None = None) -> TritonInstall:
    """The installed server, unpacking and installing what is missing when `install`."""
    found = TritonInstall(cache_root())
    missing = found.missing()
    if not missing:
        _link_standins(found)
        return found
    if not install:
        raise TritonError(f"the real-Triton fixture is not installed ({missing[0]} missing): "
                          "run `rankops dev triton install`")
    say = say or (lambda line: print(line, file=sys.stderr))
    root = found.root
    root.mkdir(parents=True, exist_ok=True)
    if not found.server_bin.exists():
        say(f"triton: downloading nvidia-pytriton=={PYTRITON_VERSION} (tritonserver {TRITON_VERSION}, ~55 MB)")
        downloads = root / "downloads"
        _pip("download", "--no-deps", "--only-binary=:all:", f"nvidia-pytriton=={PYTRITON_VERSION}",
             "-d", str(downloads))
        wheel = next(downloads.glob(f"nvidia_pytriton-{PYTRITON_VERSION}-*.whl"))
        staging = root / "wheel.partial"
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(staging)
        for binary in [staging / "pytriton" / "tritonserver" / "bin" / "tritonserver",
                       *(staging / "pytriton" / "tritonserver" / "python_backend_stubs").glob("*/triton_python_backend_stub")]:
            binary.chmod(0o755)
        shutil.rmtree(root / "wheel", ignore_errors=True)
        staging.rename(root / "wheel")
    if not (found.stub_site / "onnxruntime").exists() or not (found.stub_site / "numpy").exists():
        say(f"triton: installing the stand-ins' virtualenv ({', '.join(STUB_REQUIREMENTS)})")
        shutil.rmtree(found.stub_venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run([base, "-m", "venv", str(found.stub_venv)], "python -m venv")
        _run([str(found.stub_venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *STUB_REQUIREMENTS],
             "pip install")
    if not found.perf_analyzer.exists():
        say(f"triton: unpacking perf_analyzer from {PERF_ANALYZER_WHEEL}")
        downloads = root / "downloads"
        _pip("download", "--no-deps", "--only-binary=:all:", PERF_ANALYZER_WHEEL, "-d", str(downloads))
        wheel = next(downloads.glob("tritonclient-2.43.0-*manylinux*.whl"))
        target = found.perf_analyzer
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith("/bin/perf_analyzer"))
            target.with_suffix(".partial").write_bytes(archive.read(member))
        lib = target.parent.parent / "lib"
        lib.mkdir(exist_ok=True)
        for plain, pattern in (("libb64.so.0d", "libb64-*.so.0d"), ("libcudart.so.12", "libcudart-*.so.12*")):
            link = lib / plain
            link.unlink(missing_ok=True)
            link.symlink_to(next(found.lib_dir.glob(pattern)))
        target.with_suffix(".partial").chmod(0o755)
        target.with_suffix(".partial").rename(target)
    python_backend = found.backend_dir / "python"
    python_backend.mkdir(parents=True, exist_ok=True)
    shipped = found.package / "backends" / "python"
    stub = found.package / "python_backend_stubs" / STUB_PYTHON / "triton_python_backend_stub"
    for source in (shipped / "libtriton_python.so", shipped / "triton_python_backend_utils.py", stub):
        # Copy then rename: a running server may be executing the old file.
        partial = python_backend / f"{source.name}.partial"
        shutil.copy2(source, partial)
        os.replace(partial, python_backend / source.name)
    _link_standins(found)
    still = found.missing()
    if still:
        raise TritonError(f"the real-Triton fixture is incomplete after installing: {still[0]} missing")
    say(f"triton: installed under {root}")
    return found


def _link_standins(found: TritonInstall) -> None:
    # torch for the pytorch stand-in: the running interpreter's, after the stub's own packages.
    (found.stub_site / "rankops-torch.pth").write_text("".join(f"{p}\n" for p in _torch_site()))
    source = Path(__file__).with_name("triton_standin.py")
    for backend in STANDIN_BACKENDS:
        target = found.backend_dir / backend / "model.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() and target.resolve() == source.resolve():
            continue
        target.unlink(missing_ok=True)
        target.symlink_to(source)


def _pip(*args: str) -> None:
    _run([sys.executable, "-m", "pip", *args], f"pip {' '.join(args[:3])}")


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise TritonError(f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}")


# --- What a CPU cannot take ---------------------------------------------------------------

def cpu_config(config_text: str) -> tuple[str, list[str]]:
    """The rendered config.pbtxt as a CPU-only server can load it, and the edits made.

    Only two: instance groups of KIND_GPU become KIND_CPU (a CPU-only Triton refuses KIND_GPU),
    and GPU execution accelerators (ONNX Runtime's TensorRT) are dropped. Everything else —
    batching, warmup, version policy, the response cache — is loaded as rendered.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    edits = []
    for group in config.instance_group:
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU:
            group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
            edits.append(f"instance_group: KIND_GPU -> KIND_CPU (count {group.count})")
    accelerators = config.optimization.execution_accelerators
    if accelerators.gpu_execution_accelerator:
        names = ", ".join(a.name for a in accelerators.gpu_execution_accelerator)
        del accelerators.gpu_execution_accelerator[:]
        edits.append(f"optimization: gpu_execution_accelerator [{names}] dropped")
        if not accelerators.cpu_execution_accelerator:
            config.optimization.ClearField("execution_accelerators")
        if not config.optimization.ListFields():
            config.ClearField("optimization")
    return text_format.MessageToString(config), edits


# --- The server ---------------------------------------------------------------------------

# Every flag local_arguments may replace; the rest of the container's arguments stay as rendered.
LOCAL_FLAGS = ("--model-repository", "--http-port", "--grpc-port", "--metrics-port", "--http-address",
               "--grpc-address", "--metrics-address", "--backend-directory", "--cache-directory")


def local_arguments(container_args: Sequence[str], host: str, install: TritonInstall,
                    repository: Path | None = None, ports: dict[str, int] | None = None) -> list[str]:
    """The container's arguments with only the local addresses and paths changed: listen on
    `host`, load the stand-in backends; a new model repository and ports when given (a pod in
    its own mount namespace keeps the container's /models and ports)."""
    replaced = {"--http-address", "--grpc-address", "--metrics-address", "--backend-directory", "--cache-directory"}
    replaced |= {"--model-repository"} if repository is not None else set()
    replaced |= {"--http-port", "--grpc-port", "--metrics-port"} if ports is not None else set()
    kept = [a for a in container_args if a.split("=", 1)[0] not in replaced]
    args = [*kept, *([f"--model-repository={repository}"] if repository is not None else []),
            f"--http-address={host}", f"--grpc-address={host}", f"--metrics-address={host}",
            f"--backend-directory={install.backend_dir}"]
    if ports is not None:
        args += [f"--http-port={ports['http']}", f"--grpc-port={ports['grpc']}", f"--metrics-port={ports['metrics']}"]
    if any(a.startswith("--cache-config") for a in kept):
        args.append(f"--cache-directory={install.cache_dir}")
    return args



_PORT_ATTEMPTS = 3
_PORT_TAKEN = re.compile(r"already in use|cannot listen to HTTP requests and GRPC")

# glog lines (W1201 08:49:35.05 ...) and the plain ones printed before logging starts ("Warning: ...").
_FINDING = re.compile(r"^([WEF]\d{4} |Warning:|Error:)")


@dataclass
class TritonServer:
    """One running tritonserver; use as a context manager, or start()/stop()."""
    install: TritonInstall
    container_args: list[str]
    repository: Path
    log_path: Path
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    cpu_edits: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    # The container's environment as the kubelet gives it ($(VAR) in its arguments expanded from it);
    # `secrets`: the Secrets it reads (name -> data), a fresh key for each one not given.
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def for_rendered(cls, deployment: dict[str, Any], config_map: dict[str, Any], artifacts: dict[str, Path],
                     workdir: Path, install: TritonInstall | None = None, host: str = "127.0.0.1",
                     secrets: dict[str, dict[str, str]] | None = None) -> "TritonServer":
        """A server for a rendered Deployment and its ConfigMap.

        `artifacts` maps a Triton version directory name ("3") to a local directory holding the
        artifact files, laid out as the fetch-model init container leaves them. `secrets`: the
        Secrets the container's environment reads (default: each with a random key, as the
        operator creates the restricted-API key).
        """
        import secrets as random_keys

        from rankops_dev.container_env import container_env
        install = install or ensure_installed()
        triton = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton")
        model = _model_name(triton["args"])
        repository = workdir / "models"
        model_dir = repository / model
        model_dir.mkdir(parents=True, exist_ok=True)
        text, edits = cpu_config(config_map["data"]["config.pbtxt"])
        (model_dir / "config.pbtxt").write_text(text)
        for version_dir, source in artifacts.items():
            target = model_dir / str(version_dir)
            if target.exists() or target.is_symlink():
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            target.symlink_to(Path(source).resolve(), target_is_directory=True)
        given = dict(secrets or {})
        for item in triton.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref and ref["name"] not in given:
                given[ref["name"]] = {ref["key"]: random_keys.token_hex(32)}
        env = container_env(triton, deployment["spec"]["template"], {}, {}, given, host, "local")
        return cls(install=install, container_args=list(triton["args"]), repository=repository,
                   log_path=workdir / "tritonserver.log", host=host, cpu_edits=edits, env=env, secrets=given)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"{self.host}:{self.ports['metrics']}"

    def arguments(self) -> list[str]:
        from rankops_dev.container_env import expand

        args = [expand(a, self.env) for a in self.container_args]
        return local_arguments(args, self.host, self.install, self.repository, self.ports)

    def start(self, timeout_s: float = 120.0) -> "TritonServer":
        if self.ports:
            return self._start(timeout_s)
        # Ports it picks itself: another process may bind one between the pick and Triton's
        # bind, so a start that fails on a taken port is tried again on fresh ones.
        for attempt in range(_PORT_ATTEMPTS):
            self.ports = dict(zip(("http", "grpc", "metrics"), free_ports(3, self.host)))
            try:
                return self._start(timeout_s)
            except TritonError:
                if attempt + 1 == _PORT_ATTEMPTS or not _PORT_TAKEN.search(self.log_text()):
                    raise
        raise AssertionError("unreachable")

    def _start(self, timeout_s: float) -> "TritonServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen([str(self.install.server_bin), *self.arguments()], stdout=log,
                                        stderr=subprocess.STDOUT, env=self.install.environment(),
                                        start_new_session=True)
        log.close()
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline, metrics = time.monotonic() + timeout_s, self._serves_metrics()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TritonError(f"tritonserver exited with {self.process.returncode} before it was ready:\n"
                                  f"{self.log_tail()}")
            if self._answers("/v2/health/ready", self.http_url) and (
                    not metrics or self._answers("/metrics", self.metrics_url)):
                return
            time.sleep(0.2)
        self.stop()
        raise TritonError(f"tritonserver was not ready within {timeout_s:g}s:\n{self.log_tail()}")

    @staticmethod
    def _answers(path: str, address: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{address}{path}", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _serves_metrics(self) -> bool:
        # Triton opens its metrics port after HTTP reports ready: a caller that reads
        # /metrics straight after start() would otherwise meet a refused connection.
        return "--allow-metrics=false" not in self.arguments()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> "TritonServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def findings(self) -> list[str]:
        """Warning and error lines of the log that a CPU-only start does not explain."""
        return [line.strip() for line in self.log_text().splitlines()
                if _FINDING.match(line) and not any(h in line for h in HARMLESS_WARNINGS)]

    def infer(self, model: str, inputs: dict[str, Any]) -> dict[str, Any]:
        """One request through the gates' own client (binary tensors over HTTP)."""
        from rankops.triton.client import Endpoint
        from rankops.triton.samples import Sample

        connection = Endpoint(self.http_url, model).connect()
        try:
            return connection.infer(connection.build_request(Sample(line=1, inputs=inputs), connection.model_info()))
        finally:
            connection.close()


def _model_name(args: Sequence[str]) -> str:
    for arg in args:
        if arg.startswith("--load-model="):
            return arg.split("=", 1)[1]
    raise TritonError("the triton container has no --load-model=NAME argument")


def scratch_dir(prefix: str = "rankops-triton-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def rendered_serving(doc: dict[str, Any], version: str | None = None) -> tuple[Any, dict, dict]:
    """(RankingModel, Deployment, ConfigMap) the operator renders to serve `version` (default
    spec.version) as the stable track."""
    import copy

    from rankops.api.rankingmodel import RankingModel
    from rankops.render.desired import ServingState, desired_objects, resolve_shape

    rm = RankingModel.model_validate(copy.deepcopy(doc))
    objects = desired_objects(rm, ServingState(stable_version=version or rm.spec.version), resolve_shape(rm.spec))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    return rm, deployment, config_map


def server_for_model(doc: dict[str, Any], workdir: Path, version: str | None = None, seed: int = 0,
                     fp16_weights: bool = False, install: TritonInstall | None = None,
                     host: str = "127.0.0.1") -> tuple[Any, TritonServer]:
    """A (not yet started) server for a RankingModel manifest: the operator's rendering, over a
    small model of the spec's tensors exported in the version's format (spec_models)."""
    from rankops.render.tritonconfig import triton_version
    from rankops_dev import spec_models

    rm, deployment, config_map = rendered_serving(doc, version)
    name = version or rm.spec.version
    served = rm.spec.version_named(name)
    if served is None:
        raise TritonError(f"version {name!r} is not in spec.versions")
    directory = workdir / "artifacts" / f"v{name}"
    spec_models.export(rm.spec, served.format, directory, seed=seed, fp16_weights=fp16_weights)
    server = TritonServer.for_rendered(deployment, config_map, {str(triton_version(name)): directory}, workdir,
                                       install=install, host=host)
    return rm, server
