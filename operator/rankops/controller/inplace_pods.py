"""The in-place switch's shell (issue 41): carries out what rollout/inplace.py's `step` asks of
running Triton pods, and reads their repository indexes back for the next step.

- Load / Unload: a load through Triton's repository API (triton/repository.py) whose config
  override is the model's config.pbtxt (`config_text`, the rendered one; else the pod's file) with
  a version policy listing exactly `keep`. Locally (`stage` given) a version whose directory is
  missing is staged first.
- RemoveFiles: locally, the version's directory in the model's directory, and nothing outside it.
- RunGate: the gates library (gates/warmup.py, gates/equivalence.py) with the gate Job's settings
  and requests (rollout/jobs.py, render/gate_requests.py), against that one pod BY VERSION:
  warmup on `model:new`, equivalence of `model:new` against `model:stable` on the same pod.

Every action runs on a worker thread (controller/pod_work.py), at most one per pod and version (a
pod's repository loads, whatever the version, one at a time: two loads with different policies
would race), and every request to a pod is bounded (bounded_http's deadline): a pod that accepts
and never answers costs a worker its deadline, never the loop. An action asked again while it is
in flight is not sent twice; one that failed is tried again when the machine asks again (its error
is kept for status).

Two modes, by who owns the pod's files:

- In a cluster (`stage` None, `config_text` given) the operator reaches a pod only by HTTP: the
  pod's stager (`rankops stage-versions`, fetcher/stager.py) fetches what the versions.json the
  operator writes into the model's ConfigMap lists, and removes what it stops listing. The
  Executor never touches files: RemoveFiles is a no-op (the list's job), and a Load sent before the
  stager has fetched the version is no failure. Triton loads the listed versions it finds and
  skips a missing directory without a word (200, the version absent from its index), or, finding
  none, refuses (serverplan.NO_VERSION_DIRECTORY): the Executor notes that as waiting (`waiting`), not as an error,
  and the machine, seeing the version absent, asks again each round until loadTimeout.
- Locally (tests, `rankops dev`: `stage` given, each PodTarget's `model_dir` this process's view
  of the pod's model directory) `stage(pod, version)` puts a missing version there and RemoveFiles
  deletes it. `fetched_from` stages with the project's strict fetcher (fetcher/fetch.py) from any
  URI it reads, a local file:// directory included: the version lands as the fetcher lands it (a
  symlink to a hidden complete copy).

`Switcher.round` is one read -> step -> execute; the controller will call it per reconcile.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankops.api.rankingmodel import RankingModel
from rankops.controller.pod_work import PodWork
from rankops.serverplan import NO_VERSION_DIRECTORY
from rankops.fetcher import fetch as fetcher
from rankops.fetcher.stager import remove_version_dir
from rankops.gates.equivalence import Criteria, run_equivalence
from rankops.gates.verdict import Verdict, error_verdict
from rankops.gates.warmup import WarmupConfig, run_warmup
from rankops.render import gate_requests
from rankops.render.tritonconfig import triton_version
from rankops.rollout import inplace
from rankops.rollout.jobs import EQUIVALENCE_SAMPLES
from rankops.rollout.machine import reference_version_of
from rankops.triton.client import GATE_PRIORITY, Endpoint
from rankops.triton.repository import (INDEX_DEADLINE_S, KeyRefused, Repository, RepositoryError, config_json,
                                       with_versions)
from rankops.triton import bounded_http
from rankops.triton.route import DRAIN_PATH
from rankops.triton.samples import Sample, generate_samples, parse_input_spec

# Triton's latency window is 60 s; the gate Job waits 70 s for it to hold only warm requests.
WARMUP_WINDOW_WAIT_S = 70.0
DRAIN_ASK_TIMEOUT_S = 5.0      # a swap's drain ask to a pod's router


@dataclass(frozen=True)
class DrainAnswer:
    """A pod's router's answer to a drain ask: for how long it was asked (0: not to drain), when the ask
    was sent, the member's connections still open, its version directories on the volume."""
    seconds: float
    asked_at: dt.datetime
    open: int
    staged: frozenset[int] | None

    @classmethod
    def parse(cls, data: Any, seconds: float, asked_at: dt.datetime) -> "DrainAnswer":
        number = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0     # noqa: E731
        if not isinstance(data, dict) or not number(data.get("open")):
            raise RepositoryError("the router's drain answer has no count of open connections")
        staged = data.get("staged")
        listed = frozenset(staged) if isinstance(staged, list) and len(staged) <= 64 and all(map(number, staged)) \
            else None
        return cls(seconds, asked_at, data["open"], listed)


@dataclass(frozen=True)
class PodTarget:
    """One serving pod: its Triton's HTTP (and metrics) address and, locally only, its model's
    directory on the repository volume (/models/<model> in the pod) as this process sees it."""
    name: str
    uid: str
    host: str
    http_port: int
    model_dir: Path | None = None                 # None in a cluster: the pod's files are its stager's
    metrics_port: int | None = None
    headers: Mapping[str, str] | None = None      # the model's restricted-API key header
    serving: bool = True                          # Ready, not deleted, on a live node (rollout/readiness)
    route_port: int | None = None                 # a shared server's: the member's port on the pod's router

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    def repository(self) -> Repository:
        return Repository(self.host, self.http_port, self.headers)

    def version_dir(self, version: str) -> Path:
        if self.model_dir is None:
            raise ValueError(f"{self.name}: no local view of its model directory")
        return self.model_dir / str(triton_version(version))


Stage = Callable[[PodTarget, str], None]
# Triton's (2.51) refusal of a load whose version policy lists no version directory on the volume.
# (pod, gate, version, stable, reference=) -> verdict; reference: the pod holding `stable` (a swap's), else None
GateRunner = Callable[..., Verdict]


def no_gates(*_: Any, **__: Any) -> None:
    """The runner of an executor whose gates are set later (a switch's, once its pods are known)."""
    return None


def fetched_from(uris: Mapping[str, str], limits: fetcher.Limits = fetcher.Limits()) -> Stage:
    """A stage that fetches version -> URI with the strict fetcher into the pod's version directory."""
    def stage(pod: PodTarget, version: str) -> None:
        if version not in uris:
            raise fetcher.FetchError(f"no URI for version {version}")
        fetcher.fetch(uris[version], pod.version_dir(version), limits=limits)
    return stage


def remove_version_files(model_dir: Path, version: str) -> None:
    """Remove `version`'s directory from `model_dir` (the stager's rule: fetcher/stager.py)."""
    remove_version_dir(model_dir, triton_version(version))


def gate_samples(rm: RankingModel, gate: str, recorded: Sequence[Sample] | None = None) -> list[Sample]:
    """The requests the gate's Job sends: `recorded` (its samples ConfigMap, read by the caller), or
    generated from the input spec as the Job generates them (same count, batch sizes and seed)."""
    if recorded is not None:
        return list(recorded)
    spec = rm.spec
    count = gate_requests.warmup_sample_count(spec, spec.rollout.warmup.requests) if gate == "warmup" \
        else EQUIVALENCE_SAMPLES
    return generate_samples(parse_input_spec([t.to_wire() for t in spec.inputs]), count,
                            gate_requests.batch_sizes(spec))


@dataclass(frozen=True)
class PodGates:
    """The gates of rollout.warmup / rollout.equivalence run against one pod, by version."""
    rm: RankingModel
    window_wait_s: float = WARMUP_WINDOW_WAIT_S
    recorded: Mapping[str, Sequence[Sample]] | None = None      # gate -> its samples ConfigMap's requests
    timeout_s: float = 30.0                                     # per request, as the Job's default

    def __call__(self, pod: PodTarget, gate: str, version: str, stable: str,
                 reference: PodTarget | None = None) -> Verdict:
        """`reference`: the pod `stable` is compared on (a swap's: `pod` holds only `version`)."""
        model, spec = self.rm.metadata["name"], self.rm.spec
        samples = gate_samples(self.rm, gate, (self.recorded or {}).get(gate))

        def endpoint(v: str, on: PodTarget = pod) -> Endpoint:
            return Endpoint(on.http_url, model, str(triton_version(v)), timeout_s=self.timeout_s,
                            priority=GATE_PRIORITY)

        if gate == "warmup":
            w = spec.rollout.warmup
            metrics = f"{pod.host}:{pod.metrics_port}" if pod.metrics_port else ""
            return run_warmup(endpoint(version), samples, WarmupConfig(
                requests=w.requests, concurrency=w.concurrency, max_p99_ms=w.max_p99_ms,
                unique=spec.response_cache, metrics_url=metrics, window_wait_s=self.window_wait_s,
                judge_on=w.judge_on.value))
        if gate == "equivalence":
            e = spec.rollout.equivalence
            if isinstance(e.reference, str) and reference_version_of(spec, stable) is None:
                criteria = Criteria(abs_tolerance=e.abs_tolerance, rel_tolerance=e.rel_tolerance, top_k=e.top_k,
                                    min_topk_overlap=e.min_top_k_overlap,
                                    min_rank_correlation=e.min_rank_correlation)
                return run_equivalence(samples, endpoint(version), criteria,
                                       reference=endpoint(stable, reference or pod), output=e.output)
            return error_verdict(gate, "ReferenceNotInPod", f"in place, {version} is compared with the stable "
                                 f"{stable} loaded beside it; rollout.equivalence.reference "
                                 f"{e.reference!r} is not loaded in {pod.name}")
        return error_verdict(gate, "UnknownGate", f"no gate named {gate!r}")


class Executor:
    """Runs the machine's actions against the pods, on worker threads (see the module's docstring).

    `stage` None: cluster mode, the pods stage and remove their own files. `config_text`: the
    model's rendered config.pbtxt, the base of every load's override; None reads each pod's
    `model_dir`/config.pbtxt (local mode)."""

    def __init__(self, model: str, pods: Mapping[str, PodTarget], stage: Stage | None, gates: GateRunner,
                 load_deadline_s: float = 600.0, index_deadline_s: float = INDEX_DEADLINE_S, workers: int = 8,
                 config_text: str | None = None):
        self.model, self.pods, self.stage, self.gates = model, dict(pods), stage, gates
        # Parsed once: a config Triton could not take fails here, not in every pod's load.
        self.config = config_json(config_text) if config_text is not None else None
        self.load_deadline_s, self.index_deadline_s = load_deadline_s, index_deadline_s
        # Reads on threads of their own: loads (up to their deadline) and gates never hold a read up.
        self._work = PodWork(workers, "inplace")
        self._lock = threading.Lock()
        self.verdicts: dict[tuple[str, str], inplace.GateVerdict] = {}   # (gate, version) -> the last verdict
        self.errors: dict[tuple[str, ...], str] = {}                      # action key -> its last error
        self.waiting: dict[str, str] = {}       # pod -> why its last load loaded nothing (its files not there yet)
        # pod -> its router's answer to the last drain ask (a swap's); absent: not known (none, or it failed)
        self.drained: dict[str, DrainAnswer] = {}
        self.sent: list[tuple[str, ...]] = []                             # every action started, in order
        # A load that ended after the last read began is not in that read's index: the machine asks
        # for it again, and it is not sent twice (pod -> (the versions kept, when it ended)). One
        # that ended before is sent again: a version whose files were missing then may be there now.
        self._written: dict[str, tuple[frozenset[int], float]] = {}
        self._read_at = 0.0

    # --- reads
    def read(self, known: Mapping[str, inplace.PodIndex] | None = None,
             read_at: float | None = None) -> tuple[inplace.PodIndex, ...]:
        """Every pod's repository index, read at once, each within the index deadline. `known`: pod ->
        its index as the caller read it this round, from `read_at` (time.monotonic) on: not read again."""
        self._read_at = time.monotonic() if read_at is None else min(read_at, time.monotonic())
        missing = [self.pods[name] for name in sorted(self.pods) if name not in (known or {})]
        read = {pod.name: index for pod, index in zip(missing, self._work.read_all(self._index, missing))}
        return tuple((known or {}).get(name) or read[name] for name in sorted(self.pods))

    def _index(self, pod: PodTarget) -> inplace.PodIndex:
        try:
            entries = pod.repository().versions(self.model, self.index_deadline_s)
        except KeyRefused as exc:
            return inplace.PodIndex(pod.name, pod.uid, pod.serving, None, unread=str(exc), key_refused=True)
        except RepositoryError as exc:
            return inplace.PodIndex(pod.name, pod.uid, pod.serving, None, unread=str(exc))
        except Exception as exc:  # noqa: BLE001 - a pod answers what it likes: never an exception out of a read
            return inplace.PodIndex(pod.name, pod.uid, pod.serving, None,
                                    unread=f"{pod.name}: index not read ({type(exc).__name__})")
        versions = {v: inplace.VersionState(e.state, e.reason) for v, e in entries.items()}
        return inplace.PodIndex(pod.name, pod.uid, pod.serving, versions)

    def drain_answers(self) -> dict[str, "DrainAnswer"]:
        with self._lock:
            return dict(self.drained)

    def gate_verdicts(self, version: str) -> dict[str, inplace.GateVerdict]:
        with self._lock:
            return {gate: v for (gate, for_version), v in self.verdicts.items() if for_version == version}

    # --- actions
    def submit(self, actions: Sequence[Any], record: inplace.Record) -> list[tuple[str, ...]]:
        """Start each action not already in flight; the keys of those started."""
        started = []
        for action in actions:
            key, run = self._plan(action, record)
            if key is None:
                continue
            if not self._work.start(key, lambda key=key, run=run: self._guarded(key, run)):
                continue
            with self._lock:
                self.sent.append(key)
            started.append(key)
        return started

    def in_flight(self) -> list[tuple[str, ...]]:
        return self._work.in_flight()

    def settle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the actions in flight; for tests and shutdown."""
        self._work.settle(timeout_s)

    def close(self) -> None:
        self._work.close()

    @property
    def closed(self) -> bool:
        return self._work.closed

    def _plan(self, action: Any, record: inplace.Record) -> tuple[tuple[str, ...] | None, Callable[[], None]]:
        if getattr(action, "pod", None) is not None and action.pod not in self.pods:
            return None, lambda: None   # a pod no longer read (gone since): the machine asks again as it sees fit
        if isinstance(action, (inplace.Load, inplace.Unload)):
            pod, keep = self.pods[action.pod], frozenset(triton_version(v) for v in action.keep)
            with self._lock:
                written = self._written.get(pod.name)
            if written is not None and written[0] == keep and written[1] >= self._read_at:
                return None, lambda: None
            if not action.keep:     # a swap's unload: Triton's unload of the model, every version at once
                return ("repository", pod.name), lambda: self._unload(pod)
            return ("repository", pod.name), lambda: self._load(pod, action.keep)
        if isinstance(action, inplace.Drain):
            pod = self.pods[action.pod]
            if pod.route_port is None:
                return None, lambda: None
            # one ask per pod at a time (two in flight could arrive out of order): the next round asks again
            return ("drain", pod.name), lambda: self._drain(pod, action.seconds)
        if isinstance(action, inplace.RemoveFiles):
            if self.stage is None:      # the pod's stager removes it once versions.json stops listing it
                return None, lambda: None
            pod = self.pods[action.pod]
            return ("files", pod.name, action.version), lambda: remove_version_files(pod.model_dir, action.version)
        if isinstance(action, inplace.RunGate):
            pod, reference = self.pods[action.pod], self.pods.get(action.reference or "")
            if action.reference and reference is None:
                return None, lambda: None   # the reference pod is gone: the machine picks another
            return (("gate", pod.name, action.version, action.gate),
                    lambda: self._gate(pod, action.gate, action.version, record.from_version, reference))
        return None, lambda: None       # FallBack: the controller's (the pods strategy), not a pod's

    def _load(self, pod: PodTarget, keep: tuple[str, ...]) -> None:
        if self.stage is not None:
            for version in keep:
                if not pod.version_dir(version).exists():
                    self.stage(pod, version)
        versions = frozenset(triton_version(v) for v in keep)
        try:
            pod.repository().load(self.model, with_versions(self._config(pod), versions),
                                  deadline_s=self.load_deadline_s)
        except RepositoryError as exc:
            if NO_VERSION_DIRECTORY not in str(exc):   # the model's directory is always there
                raise
            # Nothing written: the machine asks again next round and this is sent again.
            with self._lock:
                self.waiting[pod.name] = f"none of {sorted(versions)} on {pod.name}'s volume yet ({exc})"
            return
        with self._lock:
            self.waiting.pop(pod.name, None)
            self._written[pod.name] = (versions, time.monotonic())

    def _drain(self, pod: PodTarget, seconds: float) -> None:
        """Ask the pod's router to drain the member for `seconds` (0: not to; triton/route.py), with the
        server's key, within one deadline; its answer is kept (DrainAnswer), any failure forgets it."""
        asked_at = dt.datetime.now(dt.timezone.utc)
        try:
            status, said = bounded_http.exchange(
                pod.host, pod.route_port, "POST", DRAIN_PATH, json.dumps({"seconds": seconds}).encode(),
                deadline_s=DRAIN_ASK_TIMEOUT_S, max_bytes=1024, headers=dict(pod.headers or {}),
                redirect_note="a pod's router is asked itself", error_bodies=True, http11=True)
            if status != 200:
                raise RepositoryError(f"{pod.name}: drain of {self.model} refused ({status}): "
                                      f"{said[:200].decode('utf-8', 'replace')}")
            answer = DrainAnswer.parse(json.loads(said), seconds, asked_at)
        except Exception:
            with self._lock:
                self.drained.pop(pod.name, None)     # not known: a drain is then waited out in full
            raise
        with self._lock:
            self.drained[pod.name] = answer

    def _unload(self, pod: PodTarget) -> None:
        pod.repository().unload(self.model, deadline_s=self.load_deadline_s)
        with self._lock:
            self._written[pod.name] = (frozenset(), time.monotonic())

    def _config(self, pod: PodTarget) -> dict[str, Any]:
        """The base of a load's override: `config_text` when given, else the pod's config.pbtxt
        (local mode), else the config the pod's Triton has the model loaded with (cluster mode: what
        the pod was started with, so a load changes its version policy and nothing else)."""
        if self.config is not None:
            return self.config
        if pod.model_dir is None:
            return pod.repository().model_config(self.model)
        return config_json((pod.model_dir / "config.pbtxt").read_text())

    def _gate(self, pod: PodTarget, gate: str, version: str, stable: str, reference: PodTarget | None = None) -> None:
        verdict = self.gates(pod, gate, version, stable, reference=reference)
        with self._lock:
            self.verdicts[(gate, version)] = inplace.GateVerdict(verdict.outcome, verdict.summary, pod.uid)

    def _guarded(self, key: tuple[str, ...], run: Callable[[], None]) -> None:
        try:
            run()
        except Exception as exc:     # a worker's failure is an answer for status, not a dead thread
            with self._lock:
                self.errors[key] = f"{type(exc).__name__}: {exc}"
        else:
            with self._lock:
                self.errors.pop(key, None)


@dataclass
class Switcher:
    """The loop the controller will run per reconcile: read the pods -> step -> execute."""
    executor: Executor
    policy: inplace.Policy
    record: inplace.Record

    def round(self, now: Any, stable_p99_ms: float | None, abort: str | None = None) -> inplace.Switch:
        observed = inplace.Observed(now, self.executor.read(), self.executor.gate_verdicts(self.record.version),
                                    stable_p99_ms, abort)
        switch = inplace.step(self.record, observed, self.policy)
        self.executor.submit(switch.actions, switch.record)
        self.record = switch.record
        return switch
