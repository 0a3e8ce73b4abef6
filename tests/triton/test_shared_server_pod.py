"""Issue 42: a shared server's rendered pod, its three containers run as processes with their own
command lines (render/shared_server.server_deployment), on one real tritonserver.

- `stage` (`rankops stage-members`) fetches every member's artifact with the strict fetcher from a
  real HTTP store, from the ConfigMap's members.json as the kubelet mounts it;
- `triton` starts with the rendered arguments and no model;
- `route` (`rankops route`) opens one port per member from the ConfigMap's routes.json.
The shell's part is done here as the operator will do it, from the server's plan
(serverplan.plan_server) each round: the pod's index read, the ConfigMap written as planned, the
planned loads (each member with its own config) and unloads sent. Then a fourth member joins and
leaves by the plan alone: the Deployment's template is the same, Triton keeps its process, the
stager fetches and removes the member's directory, the route opens and closes its port.

Only the paths and ports of this machine are changed in the command lines: /models and the
ConfigMap's mount point become directories here, Triton's port and the members' ports free ports.
"""
from __future__ import annotations

import functools
import http.client
import http.server
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankops import serverplan
from rankops.api.rankingmodel import RankingModel
from rankops.api.sharedserver import SharedServerSpec
from rankops.render import serving
from rankops.render.shared_server import MEMBERS_DIR
from rankops.controller.shared_pods import ServerPod, ServerPods
from rankops.triton.repository import Repository, config_json
from rankops.fetcher.members import parse_members
from rankops.triton.route import parse_routes
from rankops_dev import spec_models, triton
from rankops_dev.ports import free_port
from test_shared_server_on_triton import SHAPES, _ask, _infer_through, _wait_listening
from test_shared_server_on_triton import member as shared_member

STAGING_WAIT_S = 2.0       # how long one member's files may take to arrive here (a cluster: its fetch deadline)
SERVER = SharedServerSpec(gpuMemoryMiB=15360, resources={"cpu": "1", "memory": "2Gi"})


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real HTTP store holding every member's version 1 (model.onnx)."""
    root = tmp_path_factory.mktemp("store")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def member(name: str, store_url: str, path: str = "") -> RankingModel:
    """A member fetched from the store (`path` in it, by default its own), sized for admission: a
    T4-sized card, small members."""
    max_batch = SHAPES[name][2]
    return shared_member(name, f"{store_url}/{path or f'{name}/1/model.onnx'}", warmReplicas={"enabled": False},
                         replicas=2,
                         slo={"p99LatencyMs": 100, "targetQps": 10},
                         planning={"latencyProfile": {1: 1.0, max_batch: 4.0},
                                   "memory": {"weightsMiB": 500, "activationMiBPerItem": 1, "runtimeReserveMiB": 1024}})


class Pod:
    """The rendered pod's containers as processes, and the ConfigMap volume as a directory."""

    def __init__(self, install, work: Path, store_url: str, key: str | None = None, index: int = 0):
        self.work, self.store_url = work, store_url
        self.repository, self.mount = work / "models", work / "server"
        self.repository.mkdir()
        self.mount.mkdir()
        self.models = {name: member(name, store_url) for name in SHAPES}
        self.ports: dict[str, int] = {}          # the planned ports, read back each round as the routes
        self.local: dict[int, int] = {}          # planned port -> a free port here
        self.held: set[str] = set()
        self.key = key or secrets.token_hex(16)
        self.members = ("coarse", "fine", "rerank")
        plan = self.plan([])
        self.deployment = self.written(plan)["Deployment"]
        containers = {c["name"]: c for c in self.deployment["spec"]["template"]["spec"]["containers"]}
        self.triton = triton.TritonServer(install=install, container_args=containers["triton"]["args"],
                                          repository=self.repository, log_path=work / "tritonserver.log",
                                          env={serving.API_KEY_ENV: self.key})
        self.triton.start()
        self.processes = [self._run(containers["stage"]["command"] + ["--interval", "0.3"], "stage"),
                          self._run(containers["route"]["command"] + ["--host", "127.0.0.1", "--reload-s", "0.3"],
                                    "route")]
        self.repo = Repository(self.triton.host, self.triton.ports["http"], headers={serving.API_KEY_HEADER: self.key})
        # The operator's shell for the pod (controller/shared_pods.py); the one edit is the CPU stand-in's
        # (KIND_GPU -> KIND_CPU), which the image's shim makes to files but a load's override never passes.
        self.shell = ServerPods({serving.API_KEY_HEADER: self.key}, staging_wait_s=STAGING_WAIT_S,
                                load_config=lambda text: config_json(triton.cpu_config(text)[0]), retry_first_s=1.0)
        self.server_pod = ServerPod(f"ranking-shared-{index}", f"uid-{index}", self.triton.host, True,
                                    port=self.triton.ports["http"], metrics_port=self.triton.ports["metrics"])

    def plan(self, pods: list[serverplan.PodView]) -> serverplan.ServerPlan:
        """The server's plan from what a shell reads: the members (held at version 1 once they served),
        the pods as the shell saw them, and the ConfigMap as last written."""
        members = [serverplan.MemberView(n, self.models[n].spec, "1" if n in self.held else None) for n in self.members]
        written = self.mount / "members.json"
        staged = parse_members(written.read_text(), "ranking") if written.exists() else ()
        return serverplan.plan_server("ranking", "reco", SERVER, members, pods, self.ports,
                                      serving.pool_placement(None, None), previous_staged=staged)

    def written(self, plan: serverplan.ServerPlan) -> dict:
        """Apply the plan's ConfigMap the way the kubelet shows it to the pod (a directory), routes on
        free ports here; return the plan's objects by kind."""
        by_kind = {o["kind"]: o for o in plan.objects}
        self.ports = dict(plan.ports)
        config = by_kind["ConfigMap"]["data"]
        routes = parse_routes(config["routes.json"])
        for port in routes:
            self.local.setdefault(port, free_port())
        (self.mount / "members.json.tmp").write_text(config["members.json"])
        (self.mount / "members.json.tmp").replace(self.mount / "members.json")
        (self.mount / "routes.json.tmp").write_text(json.dumps({str(self.local[p]): m for p, m in routes.items()}))
        (self.mount / "routes.json.tmp").replace(self.mount / "routes.json")
        return by_kind

    def _run(self, command: list[str], name: str) -> subprocess.Popen:
        here = {serving.MODEL_REPOSITORY: str(self.repository), MEMBERS_DIR: str(self.mount),
                f"{MEMBERS_DIR}/members.json": str(self.mount / "members.json"),
                f"{MEMBERS_DIR}/routes.json": str(self.mount / "routes.json"),
                f"127.0.0.1:{serving.HTTP_PORT}": f"127.0.0.1:{self.triton.ports['http']}"}
        assert command[0] == "rankops"
        args = [here.get(a, a) for a in command[1:]]
        log = (self.work / f"{name}.log").open("w")
        return subprocess.Popen([sys.executable, "-m", "rankops", *args], stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.work, env={**os.environ, serving.API_KEY_ENV: self.key})

    def converge(self, names, timeout_s: float = 90.0, until: Callable[[dict, serverplan.PodActions], bool] | None = None,
                 ) -> tuple[dict[str, str], dict, serverplan.ServerPlan]:
        """The operator's rounds (ServerPods.round: read the index, plan, send the planned unloads and
        loads), the ConfigMap written as planned, until the members' states satisfy `until`, nothing is
        in flight or asked, and members.json lists exactly `names`. Returns what was sent ("loaded" /
        "unloaded" per member), the last plan's objects by kind, and the plan. `until` (states, what the
        pod is asked): by default, every member serves and nothing is asked."""
        until = until or (lambda states, asked: set(states.values()) == {serverplan.SERVING} and asked.nothing)
        self.members = tuple(names)
        sent = len(self.shell.sent)
        deadline = time.monotonic() + timeout_s
        while True:
            plan = self.shell.round(self.plan, [self.server_pod], self.members)
            objects = self.written(plan)
            states = {o.name: o.state for o in plan.members}
            self.held |= {name for name, state in states.items() if state == serverplan.SERVING}
            staged = {m.model for m in parse_members(objects["ConfigMap"]["data"]["members.json"], "ranking")}
            asked = plan.actions.get(self.server_pod.name, serverplan.PodActions())
            if until(states, asked) and staged == set(names) and not self.shell.in_flight():
                did = {member: f"{action}ed" for _, action, member in self.shell.sent[sent:]}
                return did, objects, plan
            assert time.monotonic() < deadline, (states, plan.members, self.logs())
            self.shell.settle(timeout_s=120)
            time.sleep(0.3)

    def port(self, name: str) -> int:
        return self.local[self.ports[name]]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.work.glob("*.log")))

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(10)
        self.triton.stop()


@pytest.fixture(scope="module")
def pod(triton_install, store, tmp_path_factory):
    root, url = store
    for name in SHAPES:
        rm = member(name, url)
        spec_models.export(rm.spec, rm.spec.versions[0].format, root / name / "1")
    running = Pod(triton_install, tmp_path_factory.mktemp("pod"), url)
    yield running
    running.stop()


THREE = ("coarse", "fine", "rerank")


def answers_on_its_port(pod: Pod, name: str) -> bool:
    outputs = _infer_through(pod.port(name), pod.models[name], name)
    return bool(outputs) and all(len(v) == 5 for v in outputs.values())


def test_the_rendered_pod_fetches_loads_and_serves_each_member_on_its_own_port(pod):
    pod.converge(THREE)
    for name in THREE:
        _wait_listening(pod.port(name))
        assert answers_on_its_port(pod, name)
    # the stager fetched each from the store with the strict fetcher: the version a link to a complete copy
    for name in THREE:
        version = pod.repository / name / "1"
        assert version.is_symlink() and (version / "model.onnx").stat().st_size > 0
    status, _ = _ask(pod.port("coarse"), "GET", "/v2/models/fine/ready")   # coarse's port passes coarse only
    assert status == 404


def test_a_fourth_member_joins_and_leaves_by_the_config_map_alone(pod):
    pod.converge(THREE)
    pid, template = pod.triton.process.pid, pod.deployment["spec"]["template"]
    did, objects, _ = pod.converge((*THREE, "extra"))
    assert objects["Deployment"]["spec"]["template"] == template, "a member joining changed the pod template"
    assert did.get("extra") == "loaded" and set(did) == {"extra"}
    _wait_listening(pod.port("extra"))
    assert answers_on_its_port(pod, "extra") and all(answers_on_its_port(pod, n) for n in THREE)

    # it leaves: unloaded, its port and Service at once; its files once the pod no longer holds it
    extra_port = pod.port("extra")
    did, objects, _ = pod.converge(THREE)
    assert did == {"extra": "unloaded"}
    assert objects["Deployment"]["spec"]["template"] == template
    _wait_listening(extra_port, up=False)
    deadline = time.monotonic() + 30
    while (pod.repository / "extra").exists():
        assert time.monotonic() < deadline, pod.logs()
        time.sleep(0.2)
    assert all(answers_on_its_port(pod, n) for n in THREE)
    assert pod.triton.process.poll() is None and pod.triton.process.pid == pid
    assert all(p.poll() is None for p in pod.processes), pod.logs()


def test_the_load_read_counts_each_members_requests_on_the_real_servers_metrics(pod):
    """What spec.autoscaling reads (ServerPods.read_load): Triton's own metrics page, every member's
    series in one pass; coarse's requests through its port move coarse's count alone."""
    import datetime as dt

    pod.converge(THREE)
    _wait_listening(pod.port("coarse"))
    metrics_pod = ServerPod("ranking-shared-0", "uid-0", pod.triton.host, True, port=pod.triton.ports["http"],
                            metrics_port=pod.triton.ports["metrics"])
    clock = lambda: dt.datetime.now(dt.timezone.utc)  # noqa: E731
    before, problems, _ = pod.shell.read_load([metrics_pod], THREE, clock)
    assert not problems and set(before["ranking-shared-0"]["requests"]) == set(THREE), before
    for _ in range(4):
        assert answers_on_its_port(pod, "coarse")
    deadline = time.monotonic() + 10
    while True:        # Triton's page is refreshed on its own interval
        after, problems, _ = pod.shell.read_load([metrics_pod], THREE, clock)
        moved = {n: after["ranking-shared-0"]["requests"][n] - before["ranking-shared-0"]["requests"][n] for n in THREE}
        if moved["coarse"] >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not problems and moved == {"coarse": 4.0, "fine": 0.0, "rerank": 0.0}, moved
    # each member's served requests and their queue time (autoscaling.maxAvgQueueMs), Triton's own counters
    served = {n: after["ranking-shared-0"]["served"][n] - before["ranking-shared-0"]["served"][n] for n in THREE}
    queued = {n: after["ranking-shared-0"]["queueUs"][n] - before["ranking-shared-0"]["queueUs"][n] for n in THREE}
    assert served == moved and queued["coarse"] >= 0 and queued["fine"] == queued["rerank"] == 0, (served, queued)


def test_a_member_whose_files_never_come_waits_then_fails_alone(pod):
    """ghost's artifact is not in the store: the stager cannot fetch it, so the pod refuses its loads
    for missing files. The shell waits for them (Loading, "waiting for its files": 4 x STAGING_WAIT_S,
    ghost being 4th in line), then says Failed with Triton's words, and tries again only after a
    backoff; the three keep serving on their ports throughout, and ghost leaves like any member."""
    pod.converge(THREE)
    pod.models["ghost"] = member("extra", pod.store_url, path="ghost/1/model.onnx")
    began = time.monotonic()
    waiting = []

    def ghost_failed(states: dict, asked: serverplan.PodActions) -> bool:
        if states["ghost"] == serverplan.LOADING:
            waiting.append(time.monotonic())
        return states["ghost"] == serverplan.FAILED and all(states[n] == serverplan.SERVING for n in THREE)
    try:
        _, _, plan = pod.converge((*THREE, "ghost"), until=ghost_failed)
        failed_at = time.monotonic()
        ghost = next(o for o in plan.members if o.name == "ghost")
        assert ghost.reason == serverplan.REASON_LOAD_FAILED and "ranking-shared-0" in ghost.message, ghost
        assert failed_at - began >= 4 * STAGING_WAIT_S and waiting, "failed before the wait for its files was over"
        assert all(answers_on_its_port(pod, n) for n in THREE)

        # backed off: loaded again 1 s, then 2 s after it failed, ... not on every round (0.3 s apart)
        before, rounds = len(pod.shell.sent), 0
        while time.monotonic() - failed_at < 3.5:
            pod.written(pod.shell.round(pod.plan, [pod.server_pod], pod.members))
            pod.shell.settle(30)
            rounds += 1
            time.sleep(0.3)
        retried = [a for a in pod.shell.sent[before:] if a[1:] == ("load", "ghost")]
        assert 1 <= len(retried) <= 3 < rounds, (rounds, retried)
        assert all(answers_on_its_port(pod, n) for n in THREE)
    finally:
        pod.converge(THREE)         # it leaves: the others untouched
        pod.models.pop("ghost")
    assert all(answers_on_its_port(pod, n) for n in THREE)


def test_a_members_new_version_is_switched_in_inside_the_running_pod_under_traffic_and_a_failing_one_is_not(
        pod, store):
    """coarse 1 -> 2 (the same weights: equivalent) in place, by the operator's switch shell
    (controller/server_switches.py) on the real server: 2 staged beside 1 by the pod's stager,
    loaded beside it, gated there by version (warm-up, equivalence against 1 in the same pod), then
    1 unloaded, while requests run through coarse's port: none fails, Triton keeps its process and
    the others serve on. Then 2 -> 3 (other weights): equivalence fails, 3 is unloaded, 2 serves."""
    import datetime as dt

    from rankops.controller.server_switches import Switches

    root, url = store
    pod.converge(THREE)
    base = pod.models["coarse"]
    for version, seed in (("2", 0), ("3", 7)):
        spec_models.export(base.spec, base.spec.versions[0].format, root / "coarse" / version, seed=seed)
    doc = base.to_wire()
    doc["spec"]["versions"] = [{"name": v, "modelUri": f"{url}/coarse/{v}/model.onnx", "format": "onnx"}
                               for v in ("1", "2", "3")]
    doc["spec"]["rollout"] = {"warmup": {"requests": 40, "concurrency": 2, "maxP99Ms": 5000}}
    server_pod = ServerPod("ranking-shared-0", "uid-0", pod.triton.host, True, port=pod.triton.ports["http"],
                           metrics_port=pod.triton.ports["metrics"])
    switches = Switches(pod.shell.load_config)
    held = {name: "1" for name in THREE}
    records: dict = {}
    sent, failures, stop = [0], [], threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                assert answers_on_its_port(pod, "coarse")
                sent[0] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                failures.append(repr(exc))
            time.sleep(0.02)

    def switch_to(version: str, until: set[str], timeout_s: float = 150.0) -> serverplan.ServerPlan:
        doc["spec"]["version"] = version
        pod.models["coarse"] = RankingModel.model_validate(doc)
        deadline = time.monotonic() + timeout_s
        while True:
            members = [serverplan.MemberView(n, pod.models[n].spec, held[n], switch=records.get(n)) for n in THREE]
            read_began = time.monotonic()
            read = pod.shell.read([server_pod], THREE)
            seen = switches.seen(members, [server_pod], read, read_began, pod.shell, "reco", pod.shell.headers)
            staged = parse_members((pod.mount / "members.json").read_text(), "ranking")
            plan = serverplan.plan_server("ranking", "reco", SERVER, members, read, pod.ports,
                                          serving.pool_placement(None, None), previous_staged=staged,
                                          switch_seen=seen, now=dt.datetime.now(dt.timezone.utc))
            pod.written(plan)
            pod.shell.adopt(plan.adopted)      # as controller/servers.reconcile does
            pod.shell.execute(plan)
            switches.execute(plan.switches, plan.switch_configs)
            held.update({o.name: o.version for o in plan.members if o.version})
            records.update({n: s.record for n, s in plan.switches.items()})
            record = records.get("coarse")
            if record is not None and record.phase in until:
                return plan
            assert time.monotonic() < deadline, (record, plan.members, pod.logs()[-4000:])
            time.sleep(0.3)

    pid, shell_sent = pod.triton.process.pid, len(pod.shell.sent)
    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        plan = switch_to("2", {"Switched", "RolledBack", "FellBack"})
        record = records["coarse"]
        assert record.phase == "Switched" and held["coarse"] == "2", record
        coarse = next(o for o in plan.members if o.name == "coarse")
        assert coarse.version == "2" and coarse.state == serverplan.SERVING, coarse
        index = {(e.name, e.version): e.state for e in pod.repo.index()}
        assert index[("coarse", 2)] == "READY" and index.get(("coarse", 1)) != "READY", index
        served_before = sent[0]

        plan = switch_to("3", {"Switched", "RolledBack", "FellBack"})
        record = records["coarse"]
        assert record.phase == "RolledBack" and record.failed_gate == "equivalence" and held["coarse"] == "2", record
        index = {(e.name, e.version): e.state for e in pod.repo.index()}
        assert index[("coarse", 2)] == "READY" and index.get(("coarse", 3)) != "READY", index
        time.sleep(1.0)
    finally:
        stop.set()
        sender.join(30)
        switches.close()
        pod.models["coarse"] = base
    print(f"\n2 -> 3: {record.reason}\ncoarse requests during both switches: {sent[0]}, {len(failures)} failed")
    assert sent[0] > served_before > 10 and not failures, (sent[0], failures[:5])
    assert pod.triton.process.poll() is None and pod.triton.process.pid == pid
    assert all(answers_on_its_port(pod, n) for n in ("fine", "rerank"))
    # every load of coarse was the switch's: the server's shell reloaded it nowhere, not even once it ended
    assert not [a for a in pod.shell.sent[shell_sent:] if a[2] == "coarse"], pod.shell.sent[shell_sent:]
    # 3's files go once the record stops listing it; 1's went with the switch
    deadline = time.monotonic() + 30
    while (pod.repository / "coarse" / "3").exists() or (pod.repository / "coarse" / "1").exists():
        assert time.monotonic() < deadline, sorted(p.name for p in (pod.repository / "coarse").iterdir())
        time.sleep(0.3)


def test_a_members_version_too_large_to_sit_beside_the_held_one_is_swapped_pod_by_pod_under_traffic(
        pod, store, triton_install, tmp_path_factory):
    """Two pods of the server (a second real tritonserver with its own stager and router), coarse's
    stated weights too large for 1 and 4 on one card together: its switch 1 -> 4 is a swap. Each pod in
    turn leaves coarse's EndpointSlice, is drained, has 1 unloaded and 4 loaded alone (Triton's own
    unload and load, through the restricted API), and the first is gated there: warm-up, and
    equivalence of 4 against 1 on the other pod. The client keeps its connection alive, as a pooled
    client behind kube-proxy does: it reconnects (to a pod of the plan's EndpointSlice) only when its
    connection ends, so it stays on a pod taken out of the endpoints until the pod's router drains
    it (Connection: close). None of its requests fails; fine and rerank serve on both pods."""
    import datetime as dt

    from rankops.controller.server_switches import Switches

    root, url = store
    second = Pod(triton_install, tmp_path_factory.mktemp("pod-b"), url, key=pod.key, index=1)
    by_name = {p.server_pod.name: p for p in (pod, second)}
    base = pod.models["coarse"]
    spec_models.export(base.spec, base.spec.versions[0].format, root / "coarse" / "4", seed=0)  # 1's weights
    doc = base.to_wire()
    doc["spec"]["versions"] = [{"name": v, "modelUri": f"{url}/coarse/{v}/model.onnx", "format": "onnx"}
                               for v in ("1", "4")]
    doc["spec"]["planning"]["memory"]["weightsMiB"] = 6000
    doc["spec"]["rollout"] = {"warmup": {"requests": 40, "concurrency": 2, "maxP99Ms": 5000}}
    models = {**pod.models, "coarse": RankingModel.model_validate(doc)}
    switches = Switches(pod.shell.load_config)
    held: dict[str, str | None] = {name: None for name in THREE}
    records: dict = {}
    endpoints: list[str] = []
    sent, failures, stop = {name: 0 for name in by_name}, [], threading.Event()
    taken_seen: set[str] = set()

    def round_() -> serverplan.ServerPlan:
        members = [serverplan.MemberView(n, models[n].spec, held[n], switch=records.get(n)) for n in THREE]
        server_pods = [p.server_pod for p in (pod, second)]
        read_began = time.monotonic()
        read = pod.shell.read(server_pods, THREE)
        seen = switches.seen(members, server_pods, read, read_began, pod.shell, "reco", pod.shell.headers,
                             route_port=lambda name, member: by_name[name].port(member))
        staged = parse_members((pod.mount / "members.json").read_text(), "ranking")
        plan = serverplan.plan_server("ranking", "reco", SERVER, members, read, pod.ports,
                                      serving.pool_placement(None, None), previous_staged=staged,
                                      switch_seen=seen, now=dt.datetime.now(dt.timezone.utc))
        for each in (pod, second):
            each.written(plan)
        pod.shell.adopt(plan.adopted)
        pod.shell.execute(plan)
        switches.execute(plan.switches, plan.switch_configs)
        held.update({o.name: o.version for o in plan.members if o.version})
        records.update({n: s.record for n, s in plan.switches.items()})
        slice_ = next(o for o in plan.objects if o["kind"] == "EndpointSlice"
                      and o["metadata"]["labels"].get("kubernetes.io/service-name", "").startswith("coarse"))
        endpoints[:] = sorted(e["targetRef"]["name"] for e in slice_["endpoints"] if e["conditions"]["ready"])
        record = records.get("coarse")
        if record is not None and record.load_pod:
            taken_seen.add(record.load_pod)
            assert record.load_pod not in endpoints, (record, endpoints)
        return plan

    def until(done: Callable[[serverplan.ServerPlan], bool], timeout_s: float) -> serverplan.ServerPlan:
        deadline = time.monotonic() + timeout_s
        while True:
            plan = round_()
            if done(plan):
                return plan
            assert time.monotonic() < deadline, (records.get("coarse"), plan.members, pod.logs()[-3000:],
                                                 second.logs()[-3000:])
            pod.shell.settle(timeout_s=60)
            time.sleep(0.3)

    types = {"float32": "FP32", "int64": "INT64", "int32": "INT32", "float16": "FP16"}
    arrays = spec_models.request_arrays(models["coarse"].spec, candidates=5)
    body = json.dumps({"inputs": [{"name": n, "shape": list(a.shape), "datatype": types[str(a.dtype)],
                                   "data": a.flatten().tolist()} for n, a in arrays.items()]}).encode()
    told_to_leave = [0]

    def traffic() -> None:
        """One kept-alive connection, on one pod until it ends (kube-proxy keeps an established one)."""
        turn, connection, at = 0, None, ""
        while not stop.is_set():
            if connection is None:
                targets = list(endpoints)
                if not targets:
                    time.sleep(0.02)
                    continue
                at, turn = targets[turn % len(targets)], turn + 1
                connection = http.client.HTTPConnection("127.0.0.1", by_name[at].port("coarse"), timeout=10)
            try:
                connection.request("POST", "/v2/models/coarse/infer", body, {"Content-Type": "application/json"})
                answer = connection.getresponse()
                data = answer.read()
                assert answer.status == 200, (answer.status, data[:300])
                sent[at] += 1
                if (answer.getheader("Connection") or "").lower() == "close":
                    told_to_leave[0] += 1
                    connection.close()
                    connection = None
            except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                failures.append(f"{at}: {exc!r}")
                connection.close()
                connection = None
            time.sleep(0.02)

    sender = threading.Thread(target=traffic, daemon=True)
    try:
        # every member serving at 1 on both pods (the second pod's stager fetches them)
        until(lambda plan: all(o.state == serverplan.SERVING for o in plan.members) and len(endpoints) == 2
              and all(a.nothing for a in plan.actions.values()) and not pod.shell.in_flight(), 120)
        sender.start()
        time.sleep(2)        # coarse's P99 in both Tritons' windows before the first load
        doc["spec"]["version"] = "4"
        models["coarse"] = RankingModel.model_validate(doc)
        until(lambda plan: (records.get("coarse") is not None
                           and records["coarse"].phase in ("Switched", "RolledBack", "FellBack")), 240)
        time.sleep(1.0)
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(30)
        switches.close()
        second.stop()
    record = records["coarse"]
    print(f"\nswap: {record.message}; requests by pod {sent}, {len(failures)} failed; pods taken {sorted(taken_seen)}; "
          f"told to leave a pod {told_to_leave[0]} times")
    assert record.swap and record.phase == "Switched" and held["coarse"] == "4", record
    assert taken_seen == set(by_name), "each pod was taken, out of coarse's endpoints, in its turn"
    assert not failures and all(n > 10 for n in sent.values()), (sent, failures[:5])
    assert told_to_leave[0] >= 2, "the client left each pod taken when its router drained it"
    index = {(e.name, e.version): e.state for e in pod.repo.index()}
    assert index[("coarse", 4)] == "READY" and index.get(("coarse", 1)) != "READY", index
    assert all(answers_on_its_port(pod, n) for n in ("fine", "rerank"))
    pod.models["coarse"] = base
