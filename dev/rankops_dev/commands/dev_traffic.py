"""`rankops dev traffic`: ranking requests through a model's serving pods on the local cluster,
bounded, so a demo rollout's canary has traffic to be judged on (rankops_dev/traffic.py)."""
from __future__ import annotations

import argparse
import os
import sys

import yaml

from rankops_dev.traffic import MAX_RATE, MAX_SECONDS


def add_commands(dev_sub: argparse._SubParsersAction) -> None:
    p = dev_sub.add_parser(
        "traffic", help="send ranking requests to a model's serving pods on the local cluster (bounded)",
        description="Requests made from the RankingModel's tensors, round robin over the Ready pods behind its "
                    "serving Service (stable and canary), paced at --rate for --seconds, sent from inside the local "
                    "cluster's network namespace --netns (rankops dev demo --keep prints it), or without it from "
                    "this machine (a cluster whose pod ranges it routes, as e2e/kind/setup.sh makes). Prints what "
                    "each pod answered every 10 s.")
    p.add_argument("-f", "--filename", required=True, help="the RankingModel manifest (name, namespace, inputs)")
    p.add_argument("--rate", type=float, default=20.0, help=f"requests per second (default 20, at most {MAX_RATE:g})")
    p.add_argument("--seconds", type=float, default=900.0,
                   help=f"how long to send (default 900, at most {MAX_SECONDS:g})")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    p.add_argument("--netns", metavar="NAME",
                   help="the local cluster's network namespace (its pod network is reachable only there)")
    p.set_defaults(func=run_traffic)


def run_traffic(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.config.config_exception import ConfigException

    from rankops.commands.infer import request_shape
    from rankops.triton.samples import SamplesError, generate_samples, parse_input_spec
    from rankops_dev.cluster import api_client
    from rankops_dev.traffic import Traffic, serving_addresses

    try:
        doc = yaml.safe_load(open(args.filename))
        meta = doc.get("metadata") or {}
        model, namespace = meta["name"], meta.get("namespace", "default")
        inputs, batch = request_shape(doc, None, None)
        samples = generate_samples(parse_input_spec(inputs), 64, [batch], seed=0)
        if not args.kubeconfig:
            raise ValueError("no kubeconfig: set KUBECONFIG (rankops dev demo --keep prints it) or --kubeconfig")
        core = client.CoreV1Api(api_client(args.kubeconfig))
        traffic = Traffic(lambda: serving_addresses(core, namespace, model), model,
                          lambda rng: samples[int(rng.integers(len(samples)))],
                          rate=args.rate, max_seconds=args.seconds, netns=args.netns)
    except (OSError, ValueError, KeyError, SamplesError, ConfigException) as exc:
        print(f"rankops dev traffic: {exc}", file=sys.stderr)
        return 2
    traffic.start()
    print(f"sending {args.rate:g} requests/s to {namespace}/{model} for {args.seconds:g} s; Ctrl-C to stop", flush=True)
    try:
        while traffic.is_alive():
            traffic.join(10)
            pods = ", ".join(f"{ip} {n}" for ip, n in sorted(traffic.by_pod().items())) or "no Ready pod yet"
            print(f"{traffic.sent} sent, {traffic.failed} failed; answered by pod: {pods}", flush=True)
    except KeyboardInterrupt:
        traffic.stop.set()
        traffic.join(10)
    if traffic.failures:
        print(f"last failure: {traffic.failures[-1][0]}: {traffic.failures[-1][2]}", flush=True)
    return 0 if traffic.sent and not traffic.failed else 1
