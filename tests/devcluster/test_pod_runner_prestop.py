"""The process-node runner stops a deleted pod as a kubelet does: each container's exec preStop
hook first, in the container's namespaces, then SIGTERM, within the grace period (issue 25 item 2:
a Triton pod's endpoint goes before Triton stops)."""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rankops_dev import pod_sandbox as sandbox
from rankops_dev.pod_runner import ContainerRun, PodWorker
from rankops_dev.pod_sandbox import BindMount

# Says when it got SIGTERM, into the volume the test reads.
PROGRAM = ("trap 'echo term $(date +%s.%N) >> /work/order; exit 0' TERM; "
           "while true; do sleep 0.05; done")


def container(tmp_path: Path, pre_stop: list[str] | None) -> ContainerRun:
    work = tmp_path / "work"
    work.mkdir()
    hosts, term = tmp_path / "hosts", tmp_path / "term"
    hosts.write_text(sandbox.hosts_file("pod-a", "127.77.0.5", "reco", {}))
    term.write_text("")
    spec = {"name": "triton", **({"lifecycle": {"preStop": {"exec": {"command": pre_stop}}}} if pre_stop else {})}
    argv = sandbox.bwrap_argv(["sh", "-c", PROGRAM], [BindMount(work, "/work")], hosts, term,
                              "/dev/termination-log", "pod-a")
    run = ContainerRun(spec, argv, {"PATH": "/usr/bin:/bin"}, tmp_path / "triton.log", term)
    run.start()
    deadline = time.monotonic() + 10
    while run.inner_pid() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)   # the trap is set
    return run


def worker(tmp_path: Path, run: ContainerRun) -> PodWorker:
    pod = {"metadata": {"namespace": "reco", "name": "pod-a", "uid": "0123456789ab"}, "spec": {"containers": []}}
    found = PodWorker(SimpleNamespace(work_dir=tmp_path), pod, "127.77.0.5")
    found.containers = [run]
    return found


def lines(tmp_path: Path) -> list[list[str]]:
    order = tmp_path / "work" / "order"
    return [line.split() for line in order.read_text().splitlines()] if order.exists() else []


HOOK = ["sh", "-c", "echo prestop $(date +%s.%N) >> /work/order; sleep 1"]


def test_a_deleted_pods_pre_stop_hook_runs_in_the_container_before_sigterm(tmp_path):
    run = container(tmp_path, HOOK)
    pod = worker(tmp_path, run)
    pod.stop(10, pre_stop=True)
    started = time.monotonic()
    pod._terminate()
    assert run.process.poll() not in (None, -9), "stopped by its SIGTERM, not killed"
    (hook, at_hook), (term, at_term) = lines(tmp_path)
    assert (hook, term) == ("prestop", "term")
    assert float(at_term) - float(at_hook) >= 0.9, "SIGTERM waits for the hook"
    assert time.monotonic() - started < 5
    assert "preStop: sh -c" in run.log_path.read_text()


@pytest.mark.parametrize("grace,pre_stop", [(5, False), (0, True)], ids=["runner-stopping", "forced"])
def test_no_hook_when_the_runner_stops_or_the_pod_is_deleted_at_once(tmp_path, grace, pre_stop):
    run = container(tmp_path, HOOK)
    pod = worker(tmp_path, run)
    pod.stop(grace, pre_stop=pre_stop)
    pod._terminate()
    assert [word for word, _ in lines(tmp_path)] == (["term"] if grace else [])
    assert run.process.poll() is not None


def test_a_hook_longer_than_the_grace_period_is_cut_short(tmp_path):
    run = container(tmp_path, ["sleep", "30"])
    pod = worker(tmp_path, run)
    pod.stop(1, pre_stop=True)
    started = time.monotonic()
    pod._terminate()
    # The hook is stopped at the grace period; the container then gets its minimum 2 s to go.
    assert time.monotonic() - started < 6
    assert run.process.poll() is not None
    assert "preStop done: timed out" in run.log_path.read_text()
