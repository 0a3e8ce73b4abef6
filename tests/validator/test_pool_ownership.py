"""Pools that would fight: a node without GPUs is no pool's (never validated into one, never
tainted), and a node two pools select is marked by the oldest only; both pools say so."""
from __future__ import annotations

import json

from rankops.api.gpunodepool import GpuNodePool
from rankops.controller.patching import apply_merge_patch
from rankops_dev import sample_hosts as trees
from rankops.validator.node import (ANNOTATION_REPORT, LABEL_POOL, LABEL_READY, NOT_OWNED, TAINT_KEY,
                                    release_patch, run_on_node)
from rankops.validator.ownership import claim, has_gpus, selecting_pools
from rankops.pool_status import aggregate_pool_status, node_claims, pool_conditions

OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def node(name, labels=None, gpus=1, taints=(), marks=None):
    return {"metadata": {"name": name, "resourceVersion": "9", "labels": {**(labels or {}), **(marks or {})},
                         "annotations": {ANNOTATION_REPORT: "{}"} if marks else {}},
            "spec": {"taints": list(taints)},
            "status": {"capacity": {"cpu": "4", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}}}


def pool(name, selector, created, **meta):
    return {"metadata": {"name": name, "creationTimestamp": created, **meta}, "spec": {"nodeSelector": selector}}


EVERYTHING = {"kubernetes.io/os": "linux"}
LINUX = {"kubernetes.io/os": "linux"}
OLD = pool("all-nodes", EVERYTHING, "2026-01-01T00:00:00Z")
NEW = pool("t4", {"gpu": "t4"}, "2026-02-01T00:00:00Z")


def test_gpu_capacity_decides_what_a_gpu_node_is():
    assert has_gpus(node("g")) and not has_gpus(node("c", gpus=0))
    assert not has_gpus({"metadata": {"name": "bare"}})
    assert not has_gpus({"status": {"capacity": {"nvidia.com/gpu": "garbage"}}})


def test_the_oldest_live_pool_owns_a_shared_node_and_a_cpu_node_is_nobodys():
    gpu = node("g", {**LINUX, "gpu": "t4"})
    assert selecting_pools(gpu, [NEW, OLD]) == ["all-nodes", "t4"]
    assert claim(gpu, "all-nodes", [NEW, OLD]).owned
    lost = claim(gpu, "t4", [NEW, OLD])
    assert (lost.owned, lost.owner, lost.shared_with) == (False, "all-nodes", ("all-nodes",))
    # Same creation second: the name decides, the same way for every reader.
    twin = pool("a-twin", EVERYTHING, "2026-01-01T00:00:00Z")
    assert selecting_pools(gpu, [OLD, twin]) == selecting_pools(gpu, [twin, OLD]) == ["a-twin", "all-nodes"]
    # The older pool being deleted owns nothing: the next takes over.
    going = pool("all-nodes", EVERYTHING, "2026-01-01T00:00:00Z", deletionTimestamp="2026-03-01T00:00:00Z")
    assert claim(gpu, "t4", [NEW, going]).owned
    assert not claim(gpu, "all-nodes", [NEW, going]).owned
    cpu = claim(node("cp", LINUX, gpus=0), "all-nodes", [OLD])
    assert not cpu.owned and cpu.no_gpus and "nvidia.com/gpu" in cpu.reason


def test_a_validator_unmarks_only_what_its_own_pool_left():
    mine = node("c", LINUX, gpus=0, taints=[CP_TAINT, OURS], marks={LABEL_POOL: "all-nodes", LABEL_READY: "false"})
    patched = apply_merge_patch(mine, release_patch(mine, "all-nodes"))
    assert patched["spec"]["taints"] == [CP_TAINT] and LABEL_POOL not in patched["metadata"]["labels"]
    theirs = node("g", LINUX, taints=[OURS], marks={LABEL_POOL: "all-nodes", LABEL_READY: "false"})
    assert release_patch(theirs, "t4") == {}, "the owner's labels and taint stay"
    assert release_patch(node("g", LINUX), "t4") == {}, "nothing to remove"


class Api:
    """read_node/patch_node of a CoreV1Api over one node, applying merge patches."""

    def __init__(self, obj):
        self.node, self.patches = obj, []

    def read_node(self, name, **_):
        return self.node

    def patch_node(self, name, body, **_):
        self.patches.append(body)
        self.node = apply_merge_patch(self.node, body)


def _run(api, pool_name, build_host, pools, scenario="nouveau-loaded"):
    return run_on_node(api.node["metadata"]["name"], str(build_host(scenario)), pool_name, 300, once=True,
                       requirements=GpuNodePool.model_validate(
                           {"spec": {"nodeSelector": {"x": "y"}, "requirements": trees.T4_REQUIREMENTS}}).spec.requirements,
                       taint_failing=True, use_nvml=False, api=api, pools=lambda: pools)


def test_a_pool_selecting_every_node_leaves_cpu_and_control_plane_nodes_unmarked(build_host):
    control_plane = Api(node("cp-1", LINUX, gpus=0, taints=[CP_TAINT]))
    # before: labelled into the pool, reported failing (no driver) and tainted rankops.io/gpu-unvalidated
    assert _run(control_plane, "all-nodes", build_host, [OLD]) == NOT_OWNED
    assert control_plane.patches == [] and control_plane.node["spec"]["taints"] == [CP_TAINT]
    gpu = Api(node("g-1", LINUX))
    assert _run(gpu, "all-nodes", build_host, [OLD]) == 1
    assert (OURS in gpu.node["spec"]["taints"]) and gpu.node["metadata"]["labels"][LABEL_POOL] == "all-nodes"


def test_two_pools_over_one_node_do_not_relabel_it_in_turn(build_host):
    shared = Api(node("g-1", {**LINUX, "gpu": "t4"}))
    assert _run(shared, "all-nodes", build_host, [OLD, NEW]) == 1
    marks = lambda: (shared.node["metadata"]["labels"], shared.node["spec"]["taints"])  # noqa: E731
    owned = json.dumps(marks())
    # before: the newer pool's validator relabelled it (rankops.io/pool=t4, ready) and the older one back, in turn
    for _ in range(2):
        patches = len(shared.patches)
        assert _run(shared, "t4", build_host, [OLD, NEW], scenario="healthy-rhel89") == NOT_OWNED
        assert len(shared.patches) == patches, "the newer pool's validator writes nothing"
        assert _run(shared, "all-nodes", build_host, [OLD, NEW]) == 1
        assert json.dumps(marks()) == owned


def _gnp(name, selector, created):
    return GpuNodePool.model_validate({"metadata": {"name": name, "creationTimestamp": created, "generation": 1},
                                       "spec": {"nodeSelector": selector, "requirements": trees.T4_REQUIREMENTS}})


def test_pool_status_counts_owned_nodes_and_names_the_excluded_ones():
    nodes = [node("cp-1", LINUX, gpus=0), node("cpu-1", LINUX, gpus=0), node("g-1", {**LINUX, "gpu": "t4"}),
             node("g-2", {**LINUX, "gpu": "t4"}), node("g-3", LINUX)]
    old, new = _gnp("all-nodes", EVERYTHING, "2026-01-01T00:00:00Z"), _gnp("t4", {"gpu": "t4"}, "2026-02-01T00:00:00Z")
    pools = [OLD, NEW]

    claims = node_claims(old, nodes, pools)
    summary = aggregate_pool_status(old, nodes, claims)
    assert (summary["nodes"], summary["excluded"], summary["pending"]) == (3, 2, 3)
    conds = {c.type: c.to_wire() for c in pool_conditions(summary, [], 1, "2026-03-01T00:00:00Z", claims)}
    assert (conds["NodesWithoutGpus"]["status"], conds["NodesWithoutGpus"]["reason"]) == ("True", "NoGpuCapacity")
    assert conds["NodesWithoutGpus"]["message"].startswith("cp-1, cpu-1: no nvidia.com/gpu capacity")
    assert (conds["Overlapping"]["status"], conds["Overlapping"]["reason"]) == ("True", "SharesNodesWithNewerPool")
    assert "GpuNodePool t4 (newer) also selects g-1, g-2: this pool validates them" in conds["Overlapping"]["message"]

    t4_nodes = nodes[2:4]
    claims = node_claims(new, t4_nodes, pools)
    summary = aggregate_pool_status(new, t4_nodes, claims)
    assert (summary["nodes"], summary["excluded"]) == (0, 2)
    conds = {c.type: c.to_wire() for c in pool_conditions(summary, [], 1, "2026-03-01T00:00:00Z", claims)}
    assert (conds["Overlapping"]["status"], conds["Overlapping"]["reason"]) == ("True", "SharesNodesWithOlderPool")
    assert "GpuNodePool all-nodes (older) also selects g-1, g-2 and validates them" in conds["Overlapping"]["message"]
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "NoNodesOwned")
    assert conds["NodesWithoutGpus"]["status"] == "False"

    alone = node_claims(new, t4_nodes, [NEW])
    conds = {c.type: c.to_wire() for c in pool_conditions(aggregate_pool_status(new, t4_nodes, alone), [], 1, "now", alone)}
    assert (conds["Overlapping"]["status"], conds["Overlapping"]["reason"]) == ("False", "NoOverlap")
