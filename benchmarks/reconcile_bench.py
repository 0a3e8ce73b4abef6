"""The operator at scale on the local control plane (issue 13): N pool-less RankingModels.

Starts the local control plane with enough kwok A100 nodes and installs the chart. First the
baseline: the children the operator would create for the same N models (rendered by the project's
own renderers: ConfigMap, Deployment, Services, PodDisruptionBudget, the API key's Secret),
server-side applied in parallel into a namespace of their own, timed until every Deployment is Ready; that namespace is then deleted and waited for.
Then it runs `rankops run` as the chart's ServiceAccount (as the e2e suite does), creates N models
at once and prints: time to all Ready and its ratio to the raw apply; steady-state requests per model per minute, from the operator's own counter
(rankops_api_requests_total) and from the API server's apiserver_request_total (all clients,
minus the same window with the operator stopped); how long a spec change takes to reach the
child ConfigMap and a deleted Deployment to come back (median, max); the operator's CPU and RSS
(now and peak), and the load average (the machine may be shared).

    .venv/bin/python benchmarks/reconcile_bench.py [--models 100] [--idle 60] [--interval 10] [--samples 5]
        [--no-raw] [--profile-memory DUMP] [--profile-cpu PREFIX]

Both "all Ready" times come from a watch started before the work (no polling), and each phase
also prints the CPU seconds of every process on the machine (the API server, the controller
manager, etcd, the operator...) and, for the operator, a timeline (when its Deployments were
created and Available and its models Ready) and the API server's requests by verb and resource.

`--profile-memory DUMP`: the operator runs under tracemalloc (slower, more memory: for finding
where memory goes, not for the RSS figure) and writes its top allocations to DUMP after the idle window,
with pymalloc's and glibc's own accounts (RANKOPS_BENCH_TRACEMALLOC_FRAMES=0: those alone, at full speed).
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.models import GROUP, PLURAL, VERSION, model_manifest  # noqa: E402
from rankops.controller import watches  # noqa: E402
from rankops.controller.kube import open_stream, send  # noqa: E402
from rankops_dev.binaries import ensure_binaries  # noqa: E402
from rankops_dev.cluster import add_nodes, api_client  # noqa: E402
from rankops_dev.controlplane import LocalControlPlane  # noqa: E402
from rankops_dev.operator_process import (OperatorProcess, install_chart,  # noqa: E402
                                          service_account_kubeconfig)
from rankops.render import names  # noqa: E402
from rankops_dev.ports import free_port  # noqa: E402

NAMESPACE = "bench"
RAW_NAMESPACE = "bench-raw"
MEMORY_HOOK = Path(__file__).resolve().parent / "memhook"   # sitecustomize.py: tracemalloc, dumped on SIGUSR2
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+)")


def scrape(text: str, metric: str, where: str = "") -> float:
    """Sum of a metric's samples whose labels contain `where`."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == metric and where in (m.group(2) or ""):
            total += float(m.group(3))
    return total


def apiserver_metrics(api) -> str:
    answer = send(api, "GET", "/metrics", headers={"Accept": "text/plain"}, timeout=120)
    if answer.status != 200:
        raise RuntimeError(f"/metrics answered {answer.status}")
    return answer.data.decode()


def apiserver_requests(api) -> float:
    """apiserver_request_total summed (WATCHes count once, when opened), read as the admin."""
    return scrape(apiserver_metrics(api), "apiserver_request_total")


def requests_by_kind(text: str) -> dict[str, float]:
    """apiserver_request_total by verb, resource[/subresource] and dry run (all clients)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != "apiserver_request_total":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        key = f"{labels.get('verb')} {labels.get('resource')}" + (f"/{labels['subresource']}" if labels.get("subresource") else "") \
            + (" dry-run" if labels.get("dry_run") else "")
        found[key] = found.get(key, 0.0) + float(m.group(3))
    return found


def requests_between(before: str, after: str, n: float, floor: float = 0.05) -> str:
    was, now = requests_by_kind(before), requests_by_kind(after)
    delta = sorted(((now[k] - was.get(k, 0.0)) / n, k) for k in now)
    return ", ".join(f"{k}: {v:.2f}" for v, k in reversed(delta) if v >= floor)


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of every process on this machine: pid -> (command name, seconds).
    By pid: a process of the same name still ending (the last run's cluster) is no part of it, and a
    kernel worker whose name says its current work is not counted from its start."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if name.startswith("python") or name == "rankops":   # the operator, or this script
            try:
                argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
            except OSError:
                argv = []
            name = "operator" if b"run" in argv else "bench" if any(a.endswith(b"_bench.py") for a in argv) else name
        found[int(stat.parent.name)] = (name, (int(rest[11]) + int(rest[12])) / ticks)
    return found


def cpu_between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], top: int = 7) -> str:
    """The processes (by name) that used the most CPU in between (a process that ended is not counted)."""
    by_name: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        was = before.get(pid)
        by_name[name] = by_name.get(name, 0.0) + seconds - (was[1] if was else 0.0)
    used = sorted((v, k) for k, v in by_name.items())
    return ", ".join(f"{k} {v:.0f} s" for v, k in reversed(used[-top:]) if v >= 1)


def operator_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def model_ready(rm: dict) -> bool:
    return (rm.get("status") or {}).get("phase") == "Ready" \
        and rm["status"].get("observedGeneration") == rm["metadata"]["generation"]


def deployment_ready(d: dict) -> bool:
    spec, st = d.get("spec") or {}, d.get("status") or {}
    want = spec.get("replicas", 1)
    return st.get("readyReplicas", 0) == want and st.get("updatedReplicas", 0) == want \
        and st.get("observedGeneration", 0) >= d["metadata"].get("generation", 0)


class ReadyWatch(threading.Thread):
    """Counts the objects at `path` that are ready, from a watch (started before the work it
    times): no listing every half second, which cost the API server more while the operator ran
    (models were polled from their creation; the raw Deployments only once applied)."""

    def __init__(self, api, path: str, is_ready, n: int):
        super().__init__(daemon=True)
        self.api, self.path, self.is_ready, self.n = api, path, is_ready, n
        self.ready: set[str] = set()
        self.at: float | None = None
        self.done = threading.Event()
        self.started_watching = threading.Event()

    def run(self) -> None:
        import json as _json
        version = None
        while not self.done.is_set():
            query = [("watch", "true"), ("timeoutSeconds", "60"), ("allowWatchBookmarks", "true")]
            if version:
                query.append(("resourceVersion", version))
            response = open_stream(self.api, self.path, query)
            self.started_watching.set()
            for line in watches.lines(response):
                event = _json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":   # e.g. 410 Gone: start over
                    version = None
                    break
                version = obj["metadata"].get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if event["type"] != "DELETED" and self.is_ready(obj):
                    self.ready.add(name)
                else:
                    self.ready.discard(name)
                if len(self.ready) >= self.n:
                    self.at = time.monotonic()
                    self.done.set()
                    break
            response.release_conn()

    def wait(self, timeout: float, what: str) -> float:
        if not self.done.wait(timeout):
            raise TimeoutError(f"{what}: {len(self.ready)} of {self.n} after {timeout:.0f} s")
        return self.at


def ready_watch(api, path: str, is_ready, n: int) -> ReadyWatch:
    watcher = ReadyWatch(api, path, is_ready, n)
    watcher.start()
    if not watcher.started_watching.wait(30):
        raise TimeoutError(f"watch of {path} did not start")
    return watcher


def wait(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError(what)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of steady state measured")
    parser.add_argument("--interval", type=float, default=10.0, help="rankops run --interval")
    parser.add_argument("--extra", action="append", default=[], help="more rankops run arguments")
    parser.add_argument("--samples", type=int, default=5, help="spec changes and deletions timed")
    parser.add_argument("--no-raw", dest="raw", action="store_false", help="skip the raw server-side apply baseline")
    parser.add_argument("--raw-threads", type=int, default=16, help="parallel applies of the baseline")
    parser.add_argument("--profile-memory", metavar="DUMP", help="tracemalloc in the operator, top allocations to DUMP")
    parser.add_argument("--profile-cpu", metavar="PREFIX",
                        help="during the burst (from 20 s after the models are created, 40 s): the API server's "
                             "CPU profile to PREFIX.apiserver.pprof (go tool pprof -top) and the operator's "
                             "(py-spy, if installed) to PREFIX.operator.txt; the raw apply's, from 20 s in, to "
                             "PREFIX.raw.apiserver.pprof")
    args = parser.parse_args()
    from kubernetes import client

    n = args.models
    if args.profile_cpu:
        os.environ["RANKOPS_DEV_APISERVER_PROFILING"] = "1"
    bin_dir = ensure_binaries()
    work = Path(tempfile.mkdtemp(prefix="reconcile-bench-"))
    plane = LocalControlPlane(bin_dir, log=lambda _: None).start()
    op = None
    try:
        add_nodes(plane.kubeconfig, [(f"kwok-a100-{i}", "a100") for i in range(math.ceil(n / 8) + 1)], timeout=120)
        install_chart(str(plane.kubeconfig), bin_dir=bin_dir)
        sa = service_account_kubeconfig(str(plane.kubeconfig), work / "kubeconfig")
        api = api_client(plane.kubeconfig)
        api.configuration.connection_pool_maxsize = max(args.raw_threads, 16) + 4   # one connection per thread
        core, custom, apps = client.CoreV1Api(api), client.CustomObjectsApi(api), client.AppsV1Api(api)
        print(f"N={n} models, interval {args.interval}s, extra {args.extra}; load average {_load()}")
        raw = _raw_apply(api, core, apps, n, args.raw_threads, args.profile_cpu) if args.raw else None
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        wait(lambda: _exists(core.read_namespaced_service_account, "default", NAMESPACE), 30, "default SA")
        port = free_port()
        if args.profile_memory:
            Path(args.profile_memory).unlink(missing_ok=True)
            os.environ["RANKOPS_BENCH_TRACEMALLOC"] = str(Path(args.profile_memory).resolve())
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(MEMORY_HOOK), os.environ.get("PYTHONPATH")]))
        op = OperatorProcess(sa, work / "operator.log", interval=args.interval,
                             extra_args=("--metrics-port", str(port), *args.extra))
        op.start()
        print(f"operator log {work / 'operator.log'}")

        burst_before, cpu_before = apiserver_metrics(api), cpu_by_process()
        models_ready = ready_watch(api, f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}", model_ready, n)
        t0, wall0 = time.monotonic(), time.time()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, model_manifest(f"m{i:04d}")), range(n)))
        created = time.monotonic() - t0
        if args.profile_cpu:
            threading.Thread(target=_profile_cpu, args=(api, op.process.pid, args.profile_cpu, t0 + 20, 40),
                             daemon=True).start()
        took = models_ready.wait(60 + 3 * n, "all Ready") - t0
        at_ready = operator_metrics(port)
        print(f"operator: all {n} Ready {took:.1f} s (creates took {created:.1f} s)"
              + (f"; raw apply {raw:.1f} s; ratio {took / raw:.2f}x" if raw else "")
              + f"; operator CPU {scrape(at_ready, 'process_cpu_seconds_total'):.0f} s so far, "
              f"RSS {scrape(at_ready, 'process_resident_memory_bytes') / 2**20:.0f} MiB; load average {_load()}")
        print(_timeline(apps, custom, wall0))
        print(f"    CPU until then: {cpu_between(cpu_before, cpu_by_process())}")
        print(f"    API server requests per model until then (all clients): "
              f"{requests_between(burst_before, apiserver_metrics(api), n)}")
        model_reconciles = scrape(at_ready, "rankops_reconciles_total", 'kind="RankingModel"')
        print(f"    until then, per model: {model_reconciles / n:.1f} "
              f"reconciles, {scrape(at_ready, 'rankops_api_requests_total') / n:.1f} requests of the reconcilers "
              f"({_by_label(at_ready, 'rankops_api_requests_total', n)}); kopf's refused with 429: "
              f"{op.log_path.read_text(errors='replace').count('status=429')}")
        spent = scrape(at_ready, "rankops_reconcile_duration_seconds_sum", 'kind="RankingModel"')
        print(f"    a model's reconcile took {1000 * spent / max(model_reconciles, 1):.0f} ms on average (wall, "
              f"{model_reconciles:.0f} reconciles: {spent:.0f} s of the workers' time)")

        # Steady state starts once reconciles stop: kopf's executor may still be working through
        # create handlers and ticks queued during the burst (no-ops by then, but requests).
        quiet = _settle(port)
        print(f"    reconciles stopped {quiet:.0f} s after all Ready")
        time.sleep(5)
        before_op, before_text, t1 = operator_metrics(port), apiserver_metrics(api), time.monotonic()
        time.sleep(args.idle)
        after_op, after_text, t2 = operator_metrics(port), apiserver_metrics(api), time.monotonic()
        before_api = scrape(before_text, "apiserver_request_total")
        after_api = scrape(after_text, "apiserver_request_total")
        minutes = (t2 - t1) / 60
        own = (scrape(after_op, "rankops_api_requests_total") - scrape(before_op, "rankops_api_requests_total"))
        by = {}
        for line in after_op.splitlines():
            m = _SAMPLE.match(line)
            if m and m.group(1) == "rankops_api_requests_total":
                by[m.group(2)] = float(m.group(3)) - scrape(before_op, "rankops_api_requests_total", m.group(2))
        total = after_api - before_api
        print(f"    API server requests per model per minute in that window (all clients): "
              f"{requests_between(before_text, after_text, n * (t2 - t1) / 60, floor=0.01)}")
        print(f"steady state over {t2 - t1:.0f} s: operator's own requests {own / n / minutes:.2f} per model per minute")
        for labels, count in sorted(by.items(), key=lambda kv: -kv[1]):
            if count:
                print(f"    {labels}: {count / n / minutes:.2f}")
        reconciles = (scrape(after_op, "rankops_reconciles_total", 'kind="RankingModel"')
                      - scrape(before_op, "rankops_reconciles_total", 'kind="RankingModel"'))
        print(f"    reconciles: {reconciles / n / minutes:.2f} per model per minute")
        cpu = scrape(after_op, "process_cpu_seconds_total") - scrape(before_op, "process_cpu_seconds_total")
        print(f"operator CPU {cpu / (t2 - t1) * 100:.1f}% of a core idle; "
              f"RSS {scrape(after_op, 'process_resident_memory_bytes') / 2**20:.0f} MiB "
              f"(peak {_peak_rss(op.process.pid)}); load average {_load()}")
        if args.profile_memory:
            os.kill(op.process.pid, signal.SIGUSR2)
            wait(lambda: Path(args.profile_memory).exists(), 300, "the memory dump", interval=0.5)
            print(f"top allocations in {args.profile_memory}")

        changes, deletions = [], []
        try:
            _react(args, n, core, custom, apps, changes, deletions)
        except TimeoutError as exc:
            print(f"a reaction did not come: {exc}")
        for what, values in (("spec change -> ConfigMap updated", changes),
                             ("deleted Deployment -> re-created", deletions)):
            if values:
                print(f"{what}: median {statistics.median(values):.2f} s, max {max(values):.2f} s "
                      f"({len(values)} samples)")

        op.stop()
        time.sleep(3)
        b0, s0 = apiserver_requests(api), time.monotonic()
        time.sleep(min(args.idle, 30))
        background = (apiserver_requests(api) - b0) / ((time.monotonic() - s0) / 60)
        print(f"API server: {total / minutes:.0f} requests/min with the operator idle, {background:.0f}/min "
              f"without it: operator ~{(total / minutes - background) / n:.2f} per model per minute")
        if op.errors():
            print(f"operator logged {len(op.errors())} error lines, e.g. {op.errors()[:3]}")
        api.close()
    finally:
        if op is not None:
            op.kill()
        plane.stop()


def _timeline(apps, custom, wall0: float) -> str:
    """When, after the models were created, their stable Deployments were created and became
    Available, and the models Ready (from the objects' own timestamps, whole seconds): which of
    the operator's writes, the control plane's work and the operator's status lags."""
    from datetime import datetime

    def since(stamp: str | None) -> float | None:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - wall0 if stamp else None

    def conditions(obj, kind: str):
        return next((since(c.get("lastTransitionTime")) for c in (obj.get("status") or {}).get("conditions") or []
                     if c.get("type") == kind and c.get("status") == "True"), None)

    deployments = apps.api_client.sanitize_for_serialization(apps.list_namespaced_deployment(NAMESPACE).items)
    models = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
    rows = (("stable Deployment created", [since(d["metadata"].get("creationTimestamp")) for d in deployments]),
            ("Deployment Available", [conditions(d, "Available") for d in deployments]),
            ("model Ready", [conditions(m, "Ready") for m in models]))
    out = []
    for what, values in rows:
        values = sorted(v for v in values if v is not None)
        if values:
            out.append(f"{what} p50 {values[len(values) // 2]:.0f} s, p90 {values[int(len(values) * 0.9)]:.0f} s, "
                       f"last {values[-1]:.0f} s")
    # Per model: how long a user watched Pending over Available pods (issue 27: p99 <= 2 s).
    available = {d["metadata"]["labels"].get("rankops.io/model"): conditions(d, "Available") for d in deployments}
    lags = sorted(ready - available[m["metadata"]["name"]] for m in models
                  if (ready := conditions(m, "Ready")) is not None and available.get(m["metadata"]["name"]) is not None)
    if lags:
        out.append(f"Deployment Available -> model Ready lag p50 {lags[len(lags) // 2]:.0f} s, "
                   f"p99 {lags[min(len(lags) - 1, int(len(lags) * 0.99))]:.0f} s, max {lags[-1]:.0f} s "
                   "(whole seconds of both timestamps)")
    return "    timeline: " + "; ".join(out)


def _profile_cpu(api, operator_pid: int | None, prefix: str, start: float, seconds: int) -> None:
    import shutil
    import subprocess

    time.sleep(max(0.0, start - time.monotonic()))
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    operator = subprocess.Popen([spy, "record", "-p", str(operator_pid), "-d", str(seconds), "-f", "raw",
                                 "-o", f"{prefix}.operator.txt", "--nonblocking", "--gil"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) \
        if operator_pid and Path(spy).exists() else None
    answer = send(api, "GET", "/debug/pprof/profile", query=[("seconds", str(seconds))], timeout=seconds + 60)
    Path(f"{prefix}.apiserver.pprof").write_bytes(answer.data)
    if operator:
        operator.wait(timeout=120)
    print(f"    CPU profiles: {prefix}.apiserver.pprof ({answer.status})" + (f", {prefix}.operator.txt" if operator else ""))


def _by_label(text: str, metric: str, n: int) -> str:
    found = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == metric and float(m.group(3)) / n >= 0.05:
            found.append((float(m.group(3)) / n, m.group(2)))
    return ", ".join(f"{labels}: {count:.1f}" for count, labels in sorted(found, reverse=True))


def _settle(port: int, still_s: float = 15.0, timeout: float = 600.0) -> float:
    """Seconds until the operator's reconcile count stays the same for `still_s`."""
    t0 = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - t0 < timeout:
        count = scrape(operator_metrics(port), "rankops_reconciles_total")
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return since - t0
        time.sleep(1)
    return timeout


def _quiet(api, rate: float = 5.0, still_s: float = 6.0, timeout: float = 300.0) -> float:
    """Seconds until the cluster's controllers have no work left: writes to the API server (all
    clients; the nodes' lease heartbeats left out) stay below `rate` per second for `still_s`. The
    raw namespace's deletion leaves work queued after the namespace is gone (the endpoints
    controller deleted ~1.2 Endpoints per model for a minute): it must not run into the operator's phase."""
    def writes() -> float:
        return sum(v for k, v in requests_by_kind(apiserver_metrics(api)).items()
                   if k.split()[0] in {"POST", "PUT", "PATCH", "APPLY", "DELETE"} and k.split()[1] != "leases")

    t0 = time.monotonic()
    last, at, since = writes(), time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < timeout:
        time.sleep(2)
        now, now_at = writes(), time.monotonic()
        if (now - last) / (now_at - at) >= rate:
            since = now_at
        elif now_at - since >= still_s:
            return now_at - t0
        last, at = now, now_at
    return timeout


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _peak_rss(pid: int) -> str:
    try:
        found = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return "?"
    return f"{int(found.group(1)) / 1024:.0f} MiB" if found else "?"


def _raw_apply(api, core, apps, n: int, threads: int, profile: str | None = None) -> float:
    """The baseline: the N models' children, rendered as the operator renders them for a new model,
    server-side applied `threads` at a time into RAW_NAMESPACE in the order the operator creates
    them (writes.creation_order, then the key's Secret); seconds until every Deployment is Ready.
    The namespace is deleted and waited for afterwards, so the operator's run starts clean.

    A Service made before its pods are Ready has its Endpoints and EndpointSlices written twice
    (empty, then with the pod). The operator creates a model's Deployment a few writes after its
    Services, and that is every time (2.0 updates of each per model); the baseline, 16 objects in
    flight at once, a model's together, wins that race for 20-65% of its Services
    (0.7-1.6 updates of each per model over six runs, in render order and in this one)."""
    from rankops.api.rankingmodel import RankingModel
    from rankops.controller.kube import Kube
    from rankops.controller.writes import creation_order
    from rankops.render import serving
    from rankops.render.desired import desired_objects, initial_state, resolve_shape

    core.create_namespace({"metadata": {"name": RAW_NAMESPACE}})
    wait(lambda: _exists(core.read_namespaced_service_account, "default", RAW_NAMESPACE), 30, "default SA")
    objects = []
    for i in range(n):
        body = model_manifest(f"m{i:04d}")
        body["metadata"]["namespace"] = RAW_NAMESPACE
        rm = RankingModel.model_validate(body)   # no uid: no ownerReference
        objects += creation_order(desired_objects(rm, initial_state(rm), resolve_shape(rm.spec)))
        # The restricted-API key's Secret is a child too (controller/models.ensure_api_key creates it, last).
        objects.append(serving.api_key_secret(rm.metadata["name"], RAW_NAMESPACE, secrets.token_hex(32)))
    kube = Kube(api)
    deployments_ready = ready_watch(api, f"/apis/apps/v1/namespaces/{RAW_NAMESPACE}/deployments", deployment_ready, n)
    cpu_before, requests_before = cpu_by_process(), apiserver_metrics(api)
    t0 = time.monotonic()
    if profile:
        threading.Thread(target=_profile_cpu, args=(api, None, f"{profile}.raw", t0 + 20, 40), daemon=True).start()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(kube.apply, objects))
    applied = time.monotonic() - t0
    took = deployments_ready.wait(60 + 3 * n, "raw Deployments Ready") - t0
    print(f"raw parallel server-side apply of {len(objects)} objects ({threads} at a time): all {n} Deployments "
          f"Ready {took:.1f} s (applies took {applied:.1f} s); load average {_load()}")
    print(f"    CPU until then: {cpu_between(cpu_before, cpu_by_process())}")
    print(f"    API server requests per model until then (all clients): "
          f"{requests_between(requests_before, apiserver_metrics(api), n)}")
    t1 = time.monotonic()
    core.delete_namespace(RAW_NAMESPACE)
    wait(lambda: not _exists(core.read_namespace, RAW_NAMESPACE), 600, "raw namespace gone", interval=1)
    print(f"    its namespace deleted in {time.monotonic() - t1:.0f} s; the controllers quiet "
          f"{_quiet(api):.0f} s later")
    return took


def _react(args, n, core, custom, apps, changes, deletions) -> None:
    for i in range(min(args.samples, n)):
        name = f"m{i:04d}"
        delay = 1000 + 7 * (i + 1)
        t = time.monotonic()
        custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name, {
            "spec": {"batching": {"maxBatchSize": 512, "preferredBatchSizes": [256, 512],
                                  "maxQueueDelayMicroseconds": delay}}})
        cm = names.config_map_name(name, names.STABLE)
        wait(lambda: str(delay) in str(core.read_namespaced_config_map(cm, NAMESPACE).data), 60,
             f"{cm} updated")
        changes.append(time.monotonic() - t)
        dep = names.deployment_name(name, names.STABLE)
        old = apps.read_namespaced_deployment(dep, NAMESPACE).metadata.uid
        t = time.monotonic()
        apps.delete_namespaced_deployment(dep, NAMESPACE)
        wait(lambda: _new_uid(apps, dep, old), 120, f"{dep} re-created")
        deletions.append(time.monotonic() - t)


def _exists(read, *a) -> bool:
    try:
        read(*a)
        return True
    except Exception:  # noqa: BLE001
        return False


def _new_uid(apps, name: str, old: str) -> bool:
    try:
        return apps.read_namespaced_deployment(name, NAMESPACE).metadata.uid != old
    except Exception:  # noqa: BLE001
        return False


if __name__ == "__main__":
    main()
