"""Fixtures for the e2e suite: a live cluster, API clients, a namespace per test, GPU nodes.

With $KUBECONFIG set, the suite runs against its current context, which must be a test
cluster (see support.ALLOWED_CONTEXTS). Without it, the suite starts the local control plane
(building it first if needed). A cluster that cannot be set up FAILS the run; nothing skips.
Set RANKOPS_E2E_KEEP=1 to keep the local control plane's directory (data, logs) afterwards.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.support import ALLOW_ENV, Cluster, allowed_context, wait_for

NAMESPACE_LABEL = "e2e.rankops.io/test"


SERVER_LINE = pytest.StashKey[str]()


def _report(config: pytest.Config, line: str) -> None:
    """Print past output capture now, and again in the summary: CI logs must show which
    server the suite really ran against."""
    config.stash[SERVER_LINE] = line
    capture = config.pluginmanager.get_plugin("capturemanager")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    line = config.stash.get(SERVER_LINE, None)
    if line:
        terminalreporter.write_sep("-", line)


def _external_cluster(kubeconfig: str) -> Cluster:
    from kubernetes import client, config

    try:
        _, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception as exc:  # noqa: BLE001 - any unreadable kubeconfig is a failed setup
        pytest.fail(f"KUBECONFIG={kubeconfig} cannot be read: {exc}", pytrace=False)
    context = current["name"]
    if not allowed_context(context, os.environ.get(ALLOW_ENV)):
        pytest.fail(
            f"refusing to run e2e tests against context {context!r} (KUBECONFIG={kubeconfig}): "
            f"it is not a test cluster. Allowed: rankops-local, kind-*, kwok-*, or patterns in "
            f"${ALLOW_ENV}. Unset KUBECONFIG to use the local control plane.", pytrace=False)
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        info = client.VersionApi(api).get_code()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"cluster {context!r} is not reachable: {exc}", pytrace=False)
    finally:
        api.close()
    return Cluster(kubeconfig=kubeconfig, context=context, version=info.to_dict(), local=False)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The cluster under test (see module docstring); logs its server version."""
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        found = _external_cluster(kubeconfig)
        _report(request.config, f"e2e cluster: context {found.context}, server "
                                f"{found.version.get('git_version')} (KUBECONFIG={kubeconfig})")
        yield found
        return

    from rankops_dev.binaries import BinariesMissing, ensure_binaries
    from rankops_dev.controlplane import ControlPlaneError, LocalControlPlane

    problem = None
    try:
        bin_dir = ensure_binaries(build=True)
        plane = LocalControlPlane(bin_dir, keep=os.environ.get("RANKOPS_E2E_KEEP") == "1")
        plane.start()
    except (BinariesMissing, ControlPlaneError) as exc:
        problem = str(exc)
    if problem:  # failed outside the except block, so the report is the message alone
        pytest.fail(f"the local control plane did not start: {problem}", pytrace=False)
    try:
        version = plane.version()
        _report(request.config, f"e2e cluster: local control plane, server {version['gitVersion']} "
                                f"at {plane.server} (kubeconfig {plane.kubeconfig})")
        yield Cluster(kubeconfig=str(plane.kubeconfig), context="rankops-local",
                      version={"git_version": version["gitVersion"], "major": version["major"],
                               "minor": version["minor"]},
                      local=True, bin_dir=bin_dir, plane=plane)
        plane.check_alive()  # a component that died mid-run fails the session loudly
    except BaseException:
        plane.failed = True
        raise
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[Any]:
    """A kubernetes ApiClient for the cluster; the library's global config is left alone."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=cluster.kubeconfig)
    yield api
    api.close()


@dataclass(frozen=True)
class Clients:
    api_client: Any
    core: Any  # CoreV1Api
    apps: Any  # AppsV1Api
    batch: Any  # BatchV1Api
    custom: Any  # CustomObjectsApi
    apiextensions: Any  # ApiextensionsV1Api


@pytest.fixture(scope="session")
def k8s(api_client: Any) -> Clients:
    """Typed API groups over one ApiClient."""
    from kubernetes import client

    return Clients(api_client, client.CoreV1Api(api_client), client.AppsV1Api(api_client),
                   client.BatchV1Api(api_client), client.CustomObjectsApi(api_client),
                   client.ApiextensionsV1Api(api_client))


@contextlib.contextmanager
def _fresh_namespace(request: pytest.FixtureRequest, k8s: Clients, prefix: str,
                     manifest: Callable[[str], dict]) -> Iterator[str]:
    """A namespace named after the test, deleted afterwards (without waiting for it to go)."""
    from kubernetes.client.exceptions import ApiException

    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:44 - len(prefix)].strip("-")
    name = f"{prefix}-{slug}-{secrets.token_hex(3)}"
    k8s.core.create_namespace(manifest(name))
    # Pods are refused until the controller-manager has made the namespace's default account.
    wait_for(lambda: k8s.core.read_namespaced_service_account("default", name), 30,
             f"ServiceAccount default in namespace {name}")
    try:
        yield name
    finally:
        try:
            k8s.core.delete_namespace(name, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def namespace(request: pytest.FixtureRequest, k8s: Clients) -> Iterator[str]:
    """A fresh namespace for one test."""
    with _fresh_namespace(request, k8s, "e2e", lambda name: {
            "metadata": {"name": name, "labels": {NAMESPACE_LABEL: "true"}}}) as name:
        yield name


@dataclass(frozen=True)
class GpuNodes:
    """The simulated nodes, by role. `by_product` maps nvidia.com/gpu.product to node names."""

    gpu: tuple[str, ...]
    cpu: tuple[str, ...]
    by_product: dict[str, tuple[str, ...]]


@pytest.fixture(scope="session")
def gpu_nodes(cluster: Cluster, k8s: Clients) -> GpuNodes:
    """The e2e node set (2x T4 g4dn.xlarge, 1x L4 g6.xlarge, 1 CPU node), all Ready.

    On the local control plane the fixture creates them; elsewhere (kind) the workflow has
    (`rankops dev nodes --set e2e`) and the fixture only checks they are there and Ready.
    """
    from rankops_dev.nodes import E2E_NODES, SIM_LABEL, wait_nodes_ready

    names = [name for name, _ in E2E_NODES]
    if cluster.local:
        from rankops_dev.cluster import add_nodes

        add_nodes(cluster.kubeconfig, E2E_NODES)
    else:
        try:
            wait_nodes_ready(k8s.api_client, names, timeout=60)
        except TimeoutError as exc:
            pytest.fail(f"{exc}; create them with `rankops dev nodes --set e2e`", pytrace=False)
    gpu: list[str] = []
    cpu: list[str] = []
    by_product: dict[str, list[str]] = {}
    for node in k8s.core.list_node(label_selector=SIM_LABEL).items:
        if node.metadata.name not in names:
            continue
        product = (node.metadata.labels or {}).get("nvidia.com/gpu.product")
        if product:
            gpu.append(node.metadata.name)
            by_product.setdefault(product, []).append(node.metadata.name)
        else:
            cpu.append(node.metadata.name)
    return GpuNodes(tuple(sorted(gpu)), tuple(sorted(cpu)),
                    {product: tuple(sorted(n)) for product, n in by_product.items()})


@pytest.fixture(scope="session")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The operator as a local process, authenticated as the chart's ServiceAccount.

    The chart is installed with Helm (on kind the workflow already did; `helm upgrade` keeps it),
    so CRDs, RBAC and admission policies are the chart's; the operator runs with a token of the
    chart's ServiceAccount, which proves the chart's RBAC is enough. Its log is printed when a
    test fails (see pytest_runtest_makereport) and kept under the session's tmp dir.
    """
    from rankops_dev.operator_process import OperatorProcess

    work = tmp_path_factory.mktemp("operator")
    process = OperatorProcess(chart_operator_kubeconfig(cluster, work), work / "operator.log",
                              extra_args=("--service-monitors",))
    process.start()
    OPERATOR_LOG["process"] = process
    yield process
    process.stop()


OPERATOR_LOG: dict[str, Any] = {}


def chart_operator_kubeconfig(cluster: Cluster, work: Any) -> Any:
    """Install the chart (on kind `helm upgrade` keeps it) and return a kubeconfig of the chart's
    operator ServiceAccount; a failure fails the run with the reason."""
    from rankops_dev.operator_process import install_chart, service_account_kubeconfig

    try:
        install_chart(cluster.kubeconfig, bin_dir=cluster.bin_dir, values=("monitoring.tritonServiceMonitors=true",))
        return service_account_kubeconfig(cluster.kubeconfig, work / "kubeconfig")
    except Exception as exc:  # noqa: BLE001 - set-up failure is a failed run, with the reason
        pytest.fail(f"installing the chart for the operator failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3-compatible server process (rankops_dev/objectstore.py), on loopback."""
    from rankops_dev.objectstore import ObjectStore

    store = ObjectStore(tmp_path_factory.mktemp("object-store"))
    try:
        store.start()
    except Exception as exc:  # noqa: BLE001
        store.stop()
        pytest.fail(f"the S3 server did not start: {exc}", pytrace=False)
    yield store
    store.stop()


EXPECTED_ERRORS_MARK = "operator_errors"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{EXPECTED_ERRORS_MARK}(*patterns): operator log errors this test "
                            "provokes on purpose (regular expressions); any other fails it")


@pytest.fixture
def operator_logs_no_errors(request: pytest.FixtureRequest, operator: Any) -> Iterator[None]:
    """Whatever a test does, the operator must not log an ERROR or a traceback doing it
    (a 403 from RBAC the chart lacks shows up here first), except the errors the test declares
    with @pytest.mark.operator_errors(pattern, ...)."""
    mark = request.node.get_closest_marker(EXPECTED_ERRORS_MARK)
    expected = [re.compile(p) for p in (mark.args if mark else ())]
    before = len(operator.errors())
    yield
    assert [line for line in operator.errors()[before:] if not any(p.search(line) for p in expected)] == []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    process = OPERATOR_LOG.get("process")
    if report.failed and process is not None:
        report.sections.append(("operator log (tail)", process.log_tail(120)))
    real = OPERATOR_LOG.get("real")
    if report.failed and real is not None and "real" in getattr(item, "fixturenames", ()):
        report.sections.append(("real-container cluster: operator pod", real.diagnostics(REAL_OPERATOR_NAMESPACE)))
        if OPERATOR_LOG.get("real_namespace_in"):
            report.sections.append(("real-container cluster: the test's namespace",
                                    real.diagnostics(OPERATOR_LOG["real_namespace_in"])))


# -- Real containers (issue 38) ------------------------------------------------------------------

REAL_OPERATOR_NAMESPACE = "rankops-system"


@pytest.fixture(scope="module")
def real(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A cluster whose pods run in real containers, one per test module (rankops_dev/real_cluster.py):
    the control plane, its real nodes and an S3 server in a network namespace of their own, the
    chart installed with its operator running as the chart's pod from the operator image built
    here. A module names the images it needs in `REAL_IMAGES` (default: the operator's and the
    Triton test image), may ask for the kubelet's static CPU manager (`REAL_CPU_MANAGER_POLICY`)
    and for more real nodes (`REAL_NODES`, default 1). Building the images (cached by content),
    starting the nodes or the operator failing FAILS the module; nothing skips."""
    import tempfile
    from pathlib import Path

    from rankops_dev.real_cluster import (DEFAULT_IMAGES_DIR, SERVING_IMAGES, ExistingCluster, RealCluster,
                                          images_from_env)

    images = getattr(request.module, "REAL_IMAGES", SERVING_IMAGES)
    real_nodes = getattr(request.module, "REAL_NODES", 1)
    work = Path(tempfile.mkdtemp(prefix="rankops-real-", dir="/tmp"))  # short paths: unix sockets
    cluster: Any = None
    problem = None
    try:
        if os.environ.get("KUBECONFIG"):
            # kind: the workflow (or e2e/kind/setup.sh) loaded the images on the real workers and said where.
            missing = [v for v in ("RANKOPS_E2E_REAL_NODE", "RANKOPS_E2E_IMAGES", "RANKOPS_E2E_STORE_HOST")
                       if not os.environ.get(v)]
            if missing:
                raise RuntimeError(f"{', '.join(missing)} not set: on a cluster of your own the real-pod tests need "
                                   "workers with the images loaded (e2e/kind/setup.sh sets them)")
            refs = images_from_env(os.environ["RANKOPS_E2E_IMAGES"])
            absent = [image for image in images if image not in refs]
            if absent:
                raise RuntimeError(f"RANKOPS_E2E_IMAGES names no {', '.join(absent)}")
            cluster = ExistingCluster(os.environ["KUBECONFIG"], os.environ["RANKOPS_E2E_REAL_NODE"], refs, work,
                                      os.environ["RANKOPS_E2E_STORE_HOST"],
                                      engine=os.environ.get("RANKOPS_E2E_ENGINE", "docker"),
                                      control_plane=os.environ.get("RANKOPS_E2E_CONTROL_PLANE",
                                                                   "rankops-e2e-control-plane"))
            if len(cluster.node_names) < real_nodes:
                raise RuntimeError(f"the module needs {real_nodes} real nodes, the cluster has {cluster.node_names} "
                                   "(nodes labelled rankops.io/real-node=true)")
        else:
            cluster = RealCluster(DEFAULT_IMAGES_DIR, work, images=images, build_images=True, real_nodes=real_nodes,
                                  cpu_manager_policy=getattr(request.module, "REAL_CPU_MANAGER_POLICY", "none"))
            cluster.start()
        cluster.install_operator(*getattr(request.module, "REAL_CHART_VALUES", ()))
    except Exception as exc:  # noqa: BLE001 - set-up failure is a failed run, with the reason
        problem = f"{exc}\n{cluster.diagnostics(REAL_OPERATOR_NAMESPACE) if cluster is not None else ''}"
    if problem:
        if cluster is not None:
            cluster.failed = True
            cluster.stop()
        pytest.fail(f"the real-container cluster did not start: {problem}", pytrace=False)
    OPERATOR_LOG["real"] = cluster
    try:
        yield cluster
    except BaseException:
        cluster.failed = True
        raise
    finally:
        OPERATOR_LOG.pop("real", None)
        cluster.stop()


@pytest.fixture(scope="module")
def real_k8s(real: Any) -> Iterator[Clients]:
    """Typed API groups for the real-container cluster."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=real.kubeconfig)
    yield Clients(api, client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api),
                  client.CustomObjectsApi(api), client.ApiextensionsV1Api(api))
    api.close()


@pytest.fixture
def real_namespace_in(request: pytest.FixtureRequest, real: Any, real_k8s: Clients) -> Iterator[str]:
    """A fresh namespace on the real-container cluster, its pods pinned to the real nodes."""
    from rankops_dev.real_cluster import pinned_to_real_nodes

    with _fresh_namespace(request, real_k8s, "e2e", lambda name: {
            "metadata": {"name": name, "labels": {NAMESPACE_LABEL: "true"},
                         "annotations": pinned_to_real_nodes()}}) as name:
        OPERATOR_LOG["real_namespace_in"] = name
        yield name


def real_operator_log(real: Any) -> str:
    """The chart's operator pod's log (every line), through the API server."""
    pods = real.kubectl("-n", REAL_OPERATOR_NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/instance=rankops",
                        "-o", "name").split()
    return "".join(real.kubectl("-n", REAL_OPERATOR_NAMESPACE, "logs", pod, "--tail=-1", check=False) for pod in pods)


@pytest.fixture
def real_operator_logs_no_errors(request: pytest.FixtureRequest, real: Any) -> Iterator[None]:
    """As operator_logs_no_errors, for the operator that runs as the chart's pod."""
    from rankops_dev.operator_process import error_lines

    mark = request.node.get_closest_marker(EXPECTED_ERRORS_MARK)
    expected = [re.compile(p) for p in (mark.args if mark else ())]
    before = len(error_lines(real_operator_log(real)))
    yield
    errors = error_lines(real_operator_log(real))[before:]
    assert [line for line in errors if not any(p.search(line) for p in expected)] == []
