"""kube-score over everything rankops puts in a cluster: the chart in each value combination
tests/test_chart.py renders, and `rankops render --gate-jobs` of the examples (Triton Deployments,
the validator DaemonSet, the gate Jobs) plus a latencyIsolation model whose equivalence reference
is fetched (the gate Job's fetch-reference init container).

Every finding must be excepted in tests/lint-exceptions.yaml, with the kinds it applies to and why;
an exception that matches no finding fails too, so the list cannot outlive what it excuses.
kube-score is built by dev/rankops_dev/build.sh (pinned there) beside helm.
"""
from __future__ import annotations

import copy
import fnmatch
import functools
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from rankops.commands.render import load_documents, render_documents
from tests.test_chart import BIN_DIR, COMBINATIONS, render as helm_template

ROOT = Path(__file__).resolve().parents[1]
EXCEPTIONS = Path(__file__).parent / "lint-exceptions.yaml"
EXAMPLES = ROOT / "manifests" / "examples"
BUILD_SH = ROOT / "dev" / "rankops_dev" / "build.sh"
KUBERNETES = "v1.34"
# Optional kube-score checks we hold the objects to as well.
OPTIONAL_CHECKS = ("container-seccomp-profile",)
ENTRY_KEYS = {"check", "kinds", "containers", "objects", "summary", "why", "pending"}


def kube_score_version() -> str:
    found = re.search(r"KUBE_SCORE_VERSION=\$\{KUBE_SCORE_VERSION:-(v[0-9.]+)\}", BUILD_SH.read_text())
    assert found, f"{BUILD_SH} pins no KUBE_SCORE_VERSION"
    return found.group(1)


@functools.lru_cache(maxsize=None)
def kube_score() -> Path:
    path = BIN_DIR / "kube-score"
    want = kube_score_version()
    install = (f"run dev/rankops_dev/build.sh (CI does; it builds github.com/zegl/kube-score/cmd/"
               f"kube-score@{want} into {BIN_DIR}), or point RANKOPS_K8S_BIN at a directory holding it")
    if not path.is_file():
        pytest.fail(f"kube-score not found at {path}: {install}")
    said = subprocess.run([str(path), "version"], capture_output=True, text=True, timeout=30).stdout
    if f"version: {want}," not in said:
        pytest.fail(f"{path} is not kube-score {want} ({said.strip()!r}): {install}")
    return path


@dataclass(frozen=True)
class Finding:
    source: str      # which rendering
    kind: str
    name: str
    check: str
    container: str   # "" where kube-score names none
    summary: str

    def __str__(self) -> str:
        where = f" ({self.container})" if self.container else ""
        return f"{self.source}: {self.kind} {self.name}{where}: {self.check}: {self.summary}"


def score(source: str, objects: list[dict[str, Any]]) -> list[Finding]:
    """kube-score's findings (every comment of every check graded below OK) on one set of objects,
    scored together (a Service or a NetworkPolicy is checked against the pods beside it)."""
    args = [str(kube_score()), "score", "--kubernetes-version", KUBERNETES, "--output-format", "json",
            "--disable-ignore-checks-annotations"]
    for check in OPTIONAL_CHECKS:
        args += ["--enable-optional-test", check]
    done = subprocess.run([*args, "-"], input=yaml.safe_dump_all(objects), capture_output=True, text=True,
                          timeout=120)
    try:
        scored = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"kube-score on {source} failed (exit {done.returncode}):\n{done.stderr}")
    found = []
    for obj in scored:
        for check in obj["checks"]:
            if check["skipped"] or check["grade"] >= 10:
                continue
            for comment in check["comments"] or [{"path": "", "summary": check["check"]["name"]}]:
                found.append(Finding(source, obj["type_meta"]["kind"], obj["object_meta"]["name"],
                                     check["check"]["id"], comment.get("path") or "", comment["summary"]))
    return found


def latency_isolated_model() -> dict[str, Any]:
    """The ctr-ranker example, Guaranteed (latencyIsolation), its equivalence reference fetched."""
    doc = copy.deepcopy(yaml.safe_load((EXAMPLES / "rankingmodel-ctr-ranker.yaml").read_text()))
    doc["metadata"]["name"] = "ctr-isolated"
    doc["spec"].update(latencyIsolation=True, resources={"cpu": "4", "memory": "8Gi"})
    doc["spec"].setdefault("rollout", {})["equivalence"] = {
        "reference": {"torchscriptUri": "s3://models/ctr-ranker/3-reference.pt"}}
    return doc


def in_place_model() -> dict[str, Any]:
    """The ctr-ranker example with rollout.strategy inPlace (the stage-versions init container and
    the stage sidecar)."""
    doc = copy.deepcopy(yaml.safe_load((EXAMPLES / "rankingmodel-ctr-ranker.yaml").read_text()))
    doc["metadata"]["name"] = "ctr-in-place"
    doc["spec"].setdefault("rollout", {})["strategy"] = "inPlace"
    return doc


def rendered(extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    docs = load_documents(str(p) for p in sorted(EXAMPLES.glob("*.yaml")))
    docs += [(f"{d['metadata']['name']}#1", d) for d in extra]
    return render_documents(docs, gate_jobs=True)


SOURCES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    **{f"chart-{name}": functools.partial(lambda sets: list(helm_template(sets)), sets)
       for name, sets in COMBINATIONS.items()},
    "render-examples": rendered,
    "render-latency-isolation": lambda: rendered((latency_isolated_model(),)),
    "render-in-place": lambda: rendered((in_place_model(),)),
}


@functools.lru_cache(maxsize=None)
def findings(source: str) -> tuple[Finding, ...]:
    return tuple(score(source, SOURCES[source]()))


@functools.lru_cache(maxsize=None)
def exceptions() -> tuple[dict[str, Any], ...]:
    entries = yaml.safe_load(EXCEPTIONS.read_text())
    for i, e in enumerate(entries):
        where = f"{EXCEPTIONS.name} entry {i + 1} ({e.get('check')})"
        assert set(e) <= ENTRY_KEYS, f"{where}: unknown keys {sorted(set(e) - ENTRY_KEYS)}"
        assert isinstance(e.get("check"), str) and e["check"], f"{where}: no check"
        assert isinstance(e.get("kinds"), list) and e["kinds"], f"{where}: no kinds"
        assert isinstance(e.get("why"), str) and e["why"].strip() and "\n" not in e["why"].strip(), \
            f"{where}: `why` must be one line"
        assert "pending" not in e or str(e["pending"]).startswith("issue "), f"{where}: pending names an issue"
    return tuple(entries)


def matches(entry: dict[str, Any], f: Finding) -> bool:
    return (entry["check"] == f.check and f.kind in entry["kinds"]
            and ("containers" not in entry or f.container in entry["containers"])
            and ("objects" not in entry or any(fnmatch.fnmatchcase(f.name, g) for g in entry["objects"]))
            and ("summary" not in entry or entry["summary"] in f.summary))


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_kube_score_finds_nothing_not_excepted(source):
    assert {o["kind"] for o in SOURCES[source]()} >= ({"Deployment"} if source.startswith("chart") else
                                                      {"Deployment", "DaemonSet", "Job", "PodDisruptionBudget"})
    unexcepted = [f for f in findings(source) if not any(matches(e, f) for e in exceptions())]
    assert not unexcepted, ("kube-score findings without an exception in tests/lint-exceptions.yaml "
                            "(fix them, or add an exception with its reason):\n"
                            + "\n".join(f"  {f}" for f in unexcepted))


def test_every_exception_still_matches_a_finding():
    everything = [f for source in SOURCES for f in findings(source)]
    stale = [e for e in exceptions() if not any(matches(e, f) for f in everything)]
    assert not stale, ("exceptions in tests/lint-exceptions.yaml that no finding needs any more (delete them):\n"
                       + "\n".join(f"  {e['check']} {e['kinds']}: {e['why']}" for e in stale))


def test_the_gate_jobs_and_their_fetch_are_linted():
    """What `rankops render` leaves out without --gate-jobs is in the linted set."""
    jobs = [o for o in SOURCES["render-latency-isolation"]() if o["kind"] == "Job"]
    containers = {c["name"] for j in jobs for part in ("initContainers", "containers")
                  for c in j["spec"]["template"]["spec"].get(part) or []}
    assert len(jobs) == 6 and {"gate", "fetch-reference"} <= containers
