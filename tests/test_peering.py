"""The standby replica's pure parts: which kopf peering objects `rankops run --peering` needs
(the e2e test, e2e/test_standby.py, runs two replicas for real)."""
from __future__ import annotations

from rankops.cli import build_parser
from rankops.controller import peering


def test_cluster_wide_needs_one_cluster_peering_and_namespaced_one_per_namespace():
    assert peering.peering_objects("rankops-operator", []) == [
        (None, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "rankops-operator"}})]
    objs = peering.peering_objects("p", ["reco", "ads"])
    assert [(ns, o["kind"], o["metadata"]) for ns, o in objs] == [
        ("reco", "KopfPeering", {"name": "p", "namespace": "reco"}),
        ("ads", "KopfPeering", {"name": "p", "namespace": "ads"})]


def test_replicas_draw_distinct_positive_priorities():
    drawn = {peering.random_priority() for _ in range(200)}
    assert len(drawn) == 200 and all(1 <= p <= peering.MAX_PRIORITY for p in drawn)


def test_run_flags_default_to_standalone():
    args = build_parser().parse_args(["run"])
    assert args.peering is None and args.priority is None and args.peering_lifetime == 30
    args = build_parser().parse_args(["run", "--peering", "x", "--priority", "0", "--peering-lifetime", "10"])
    assert (args.peering, args.priority, args.peering_lifetime) == ("x", 0, 10)
