"""Two operator replicas with kopf peering, as the chart runs them (`--peering`, random priority):
exactly one acts, the other stands by; the standby takes over when the active one is killed,
and a replica that comes back joins without two ever acting at once.

Both run as local processes with the chart's ServiceAccount (so the chart's peering RBAC is
enough). The session's standalone operator (fixture `operator`), if another test file started
it, is stopped while these run: it does not take part in peering.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import models
from e2e.conftest import OPERATOR_LOG, chart_operator_kubeconfig
from e2e.support import wait_for
from rankops.render import names

PEERING = "rankops-operator"  # the chart's fullname, which it passes as --peering
LIFETIME = 10  # --peering-lifetime: how long a killed active replica holds the standby back

pytestmark = pytest.mark.usefixtures("gpu_nodes")


def acting(process: Any) -> bool:
    """Whether kopf in this process is serving: it starts paused, and logs each resume and pause."""
    text = process.log_path.read_text(errors="replace") if process.log_path.exists() else ""
    start = text.rfind("===== start ")
    state = False
    for line in text[start:].splitlines():
        if "Resuming operations" in line:
            state = True
        elif "Pausing operations" in line:
            state = False
    return state and process.running


def handled(process: Any, after: int) -> list[str]:
    """The per-object lines (kopf's warnings about an object, rankops' reconciles: each is logged
    the first time a process reconciles a model) logged after byte `after`."""
    text = process.log_path.read_text(errors="replace")[after:]
    return [line for line in text.splitlines() if "kopf.objects" in line or _RECONCILED.search(line)]


_RECONCILED = re.compile(r"rankops\.handlers .* reconciled \S+/\S+ generation")


def changed(process: Any, after: int) -> bool:
    """A RankingModel reconciled after byte `after`: first seen, created, or its spec updated."""
    return any(_RECONCILED.search(line) for line in handled(process, after))


def log_size(process: Any) -> int:
    return process.log_path.stat().st_size


@pytest.fixture(scope="module")
def replicas(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    from rankops_dev.operator_process import OperatorProcess

    session_operator = OPERATOR_LOG.get("process")
    paused_session = session_operator is not None and session_operator.running
    if paused_session:
        session_operator.stop()
    work = tmp_path_factory.mktemp("standby")
    kubeconfig = chart_operator_kubeconfig(cluster, work)
    peers = [OperatorProcess(kubeconfig, work / f"replica-{i}.log",
                             extra_args=("--peering", PEERING, "--peering-lifetime", str(LIFETIME)))
             for i in range(2)]
    try:
        for peer in peers:
            peer.start()
        yield peers
    finally:
        for peer in peers:
            peer.stop()
        if paused_session:
            session_operator.start()


def one_acting(peers: list[Any], settle: float = LIFETIME / 2) -> Any:
    """Wait until exactly one replica acts, and still the same one `settle` seconds later (a
    returning replica of higher priority takes over a moment after it joined), and return it."""
    def settled() -> Any:
        active = [p for p in peers if acting(p)]
        if len(active) != 1:
            return None
        time.sleep(settle)
        return active[0] if [p for p in peers if acting(p)] == active else None
    return wait_for(settled, 60 + settle, "exactly one replica acting, settled")


def peering_status(k8s: Any) -> dict:
    body = k8s.custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", PEERING)
    return body.get("status") or {}


def test_one_replica_acts_the_standby_takes_over_and_a_returning_one_joins(k8s, namespace, replicas):
    # Both are in the peering object the operator created, with their own priorities.
    status = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(peering_status(k8s)), 30,
                      "both replicas in the ClusterKopfPeering")
    assert len({peer["priority"] for peer in status.values()}) == 2, status
    active = one_acting(replicas)
    standby = next(p for p in replicas if p is not active)

    # The standby handles nothing at all (no object of any kind) while the active one serves.
    marks = {id(p): log_size(p) for p in replicas}
    models.create(k8s, namespace, models.model_manifest("ha"))
    models.wait_ready(k8s, namespace, "ha")
    assert changed(active, marks[id(active)]), "the active replica did not handle the model"
    assert handled(standby, marks[id(standby)]) == [], "the standby handled objects too"
    assert not acting(standby)

    # The active one crashes: the standby resumes once its keep-alive expires, and serves edits.
    mark = log_size(standby)
    active.kill()
    wait_for(lambda: acting(standby), 6 * LIFETIME, "the standby took over")
    models.patch_spec(k8s, namespace, "ha", {"replicas": 2})
    models.wait_status(k8s, namespace, "ha", lambda rm: rm["status"].get("observedGeneration") == 2
                       and rm["status"].get("ready") == "2/2" and rm["status"].get("phase") == "Ready",
                       "the edit served by the new active replica")
    assert changed(standby, mark), "the new active replica did not handle the edit"

    # The crashed one comes back: whichever priority it draws, one replica acts, the other nothing.
    active.start()
    wait_for(lambda: len(peering_status(k8s)) == 2, 30, "the returning replica in the peering object")
    now_active = one_acting(replicas)
    other = next(p for p in replicas if p is not now_active)
    marks = {id(p): log_size(p) for p in replicas}
    models.patch_spec(k8s, namespace, "ha", {"replicas": 1})
    models.wait_status(k8s, namespace, "ha", lambda rm: rm["status"].get("observedGeneration") == 3
                       and rm["status"].get("ready") == "1/1", "the second edit served")
    assert changed(now_active, marks[id(now_active)])
    assert handled(other, marks[id(other)]) == [], "the paused replica handled objects"
    assert not acting(other)

    # No duplicates of what the model owns, whichever replica wrote it.
    deployments = k8s.apps.list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deployments] == [names.deployment_name("ha", names.STABLE)]
    assert len(k8s.core.list_namespaced_config_map(namespace, label_selector=f"{names.LABEL_MODEL}=ha").items) == 1
    for peer in replicas:
        assert peer.errors() == [], f"{peer.log_path.name}: {peer.errors()[:5]}"
