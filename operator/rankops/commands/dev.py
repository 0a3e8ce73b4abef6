"""`rankops dev up`: a local Kubernetes with simulated GPU nodes, for trying rankops by hand.

`rankops dev nodes` adds the same simulated GPU nodes to an existing cluster that runs kwok
(the kind workflow uses it).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from rankops.devcluster.binaries import BinariesMissing
from rankops.devcluster.controlplane import ControlPlaneError
from rankops.devcluster.nodes import E2E_NODES, SHAPES, dev_node_set


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser("dev", help="a local Kubernetes with simulated GPU nodes")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="DEV_COMMAND")

    up = dev_sub.add_parser(
        "up", help="start the local control plane and kwok GPU nodes; runs until Ctrl-C",
        description="Builds the control plane once if needed (tens of minutes cold), starts it, "
                    "adds simulated GPU nodes and keeps running until Ctrl-C or SIGTERM.")
    up.add_argument("--nodes", type=int, default=2, metavar="N",
                    help="simulated GPU nodes, alternating T4 and L4 (plus one CPU node); default 2")
    up.add_argument("--keep", action="store_true",
                    help="keep the working directory (data, logs, kubeconfig) after stopping")
    up.set_defaults(func=run_up)

    nodes = dev_sub.add_parser(
        "nodes", help="create simulated GPU nodes in the current KUBECONFIG's cluster (needs kwok "
                      "running there with the rankops stages)")
    nodes.add_argument("--set", choices=["e2e", "dev"], default="e2e",
                       help="e2e: the fixed set the e2e suite expects; dev: like `dev up --nodes`")
    nodes.add_argument("--nodes", type=int, default=2, metavar="N", help="GPU nodes for --set dev")
    nodes.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                       help="default: $KUBECONFIG")
    nodes.set_defaults(func=run_nodes)


def _node_set(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.nodes < 0:
        raise SystemExit(f"rankops dev: --nodes must be 0 or more, got {args.nodes}")
    return dev_node_set(args.nodes)


def run_up(args: argparse.Namespace) -> int:
    """Start, print how to connect, block until Ctrl-C or SIGTERM, stop."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    try:
        with serve_dev_cluster(_node_set(args), keep=args.keep) as plane:
            print(f"kubeconfig: {plane.kubeconfig}")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            print(f"export PATH={plane.bin_dir}:$PATH   # kubectl, helm, kwok of this release")
            print("running; Ctrl-C to stop", flush=True)
            while True:
                time.sleep(1.0)
                plane.check_alive()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0
    except (BinariesMissing, ControlPlaneError, TimeoutError) as exc:
        print(f"rankops dev up: {exc}", file=sys.stderr)
        return 1


def serve_dev_cluster(node_set: list[tuple[str, str]] | None = None, *, keep: bool = False):
    """Context manager for the demo: a started local cluster with `node_set` nodes Ready.

    Yields the LocalControlPlane (`.kubeconfig`, `.server`, `.version()`); stops it on exit.
    """
    from rankops.devcluster.cluster import local_cluster

    return local_cluster(dev_node_set(2) if node_set is None else node_set, keep=keep)


def run_nodes(args: argparse.Namespace) -> int:
    from rankops.devcluster.cluster import add_nodes

    if not args.kubeconfig or not Path(args.kubeconfig).exists():
        print("rankops dev nodes: no kubeconfig: set KUBECONFIG or pass --kubeconfig PATH",
              file=sys.stderr)
        return 2
    node_set = list(E2E_NODES) if args.set == "e2e" else _node_set(args)
    try:
        names = add_nodes(args.kubeconfig, node_set, timeout=120)
    except TimeoutError as exc:
        print(f"rankops dev nodes: {exc}", file=sys.stderr)
        return 1
    shapes = {name: SHAPES[key] for name, key in node_set}
    for name in names:
        shape = shapes[name]
        gpu = f"{shape.gpu_count}x {shape.gpu_product}" if shape.gpu_count else "no GPU"
        print(f"{name}: {shape.instance_type}, {gpu}, Ready")
    return 0
