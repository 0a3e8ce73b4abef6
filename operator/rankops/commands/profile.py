"""`rankops profile --url HOST:PORT --model NAME[:VERSION]`: measure a latency profile on a live
Triton and print it as the ConfigMap planning.latencyProfileConfigMap reads (or the
spec.planning fields), ready to `kubectl apply -f -`.

Exit codes: 0 measured; 1 the server, model or requests failed (the message says the fix);
2 unusable arguments.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from rankops.commands.output import add_output_flag, format_objects, format_report


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile", help="measure compute time per batch size on a live Triton model",
        description="Measure a latency profile (server-side compute ms per batch size, and the slowdown "
                    "when two instances share a device) from Triton's statistics, and print it as the "
                    "ConfigMap spec.planning.latencyProfileConfigMap reads.")
    p.add_argument("--url", required=True, help="Triton's HTTP endpoint HOST:PORT (port 8000)")
    p.add_argument("--model", required=True, metavar="NAME[:VERSION]", help="the Triton model (and version) to profile")
    p.add_argument("--batch-sizes", metavar="B,B,...",
                   help="batch sizes to measure (default: powers of two up to max_batch_size, and it)")
    p.add_argument("--requests", type=int, default=20, help="timed requests per batch size (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed requests per batch size first (default 3)")
    p.add_argument("--samples", metavar="FILE",
                   help="a recorded request (JSON Lines, as the gates read) to send instead of generated inputs")
    p.add_argument("--fill-dim", type=int, default=1, metavar="N",
                   help="size for variable (-1) dims of generated inputs (default 1)")
    p.add_argument("--no-shared", action="store_true",
                   help="skip measuring the slowdown of two instances sharing a device")
    p.add_argument("--no-memory", action="store_true",
                   help="skip reading Triton's nv_gpu_memory_used_bytes (loaded, and after max-batch requests)")
    p.add_argument("--metrics-url", metavar="HOST:PORT", help="Triton's metrics endpoint (default: --url's host, port 8002)")
    p.add_argument("--reload", action="store_true",
                   help="unload and load the model first, to measure its weights (the restricted repository API's "
                        "key from $RANKOPS_TRITON_API_KEY); only on a replica that serves nothing else")
    p.add_argument("--emit", choices=("configmap", "planning"), default="configmap",
                   help="configmap (default): the profile ConfigMap; planning: the spec.planning fields")
    p.add_argument("--name", help="ConfigMap name (default <model>-latency-profile)")
    p.add_argument("--namespace", help="ConfigMap namespace (default: none, kubectl's current)")
    p.add_argument("--key", default="profile.yaml", help="ConfigMap key holding the profile (default profile.yaml)")
    add_output_flag(p, ("yaml", "json"), "yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankops.triton.client import parse_model_ref
    from rankops.triton.samples import SamplesError, parse_batch_sizes
    from rankops.planner.measure import MeasureError, measure

    try:
        model, version = parse_model_ref(args.model)
        sizes = parse_batch_sizes(args.batch_sizes) if args.batch_sizes else None
        if sizes == [0]:
            raise ValueError("--batch-sizes: a profile is per batch size; list sizes >= 1")
        if args.requests < 3 or args.warmup < 0 or args.fill_dim < 1:
            raise ValueError("--requests must be >= 3, --warmup >= 0, --fill-dim >= 1")
    except (ValueError, SamplesError) as exc:
        print(f"rankops profile: {exc}", file=sys.stderr)
        return 2
    say = (lambda line: print(line, file=sys.stderr)) if sys.stderr.isatty() else (lambda _: None)
    try:
        measured = measure(args.url, model, version, batch_sizes=sizes, requests=args.requests,
                           warmup=args.warmup, samples_path=args.samples, fill_dim=args.fill_dim,
                           shared=not args.no_shared, memory=not args.no_memory, metrics_url=args.metrics_url,
                           reload=args.reload, api_headers=_api_headers(), say=say)
    except MeasureError as exc:
        print(f"rankops profile: {exc}", file=sys.stderr)
        return 1
    print(measured.report(), file=sys.stderr)
    if args.emit == "planning":
        sys.stdout.write(format_report({"planning": measured.planning()}, args.output))
    else:
        name = args.name or re.sub(r"[^a-z0-9.-]+", "-", model.lower()).strip("-.") + "-latency-profile"
        cm = measured.config_map(name, args.namespace, args.key)
        sys.stdout.write(format_objects([cm], args.output) if args.output == "yaml"
                         else format_report(cm, args.output))
        print(f"use it: spec.planning.latencyProfileConfigMap: {{name: {cm['metadata']['name']}, key: {args.key}}}"
              + (f"; spec.planning.sharedGpuSlowdown: {measured.slowdown:g}" if measured.slowdown is not None else ""),
              file=sys.stderr)
    return 0


def _api_headers() -> dict[str, str] | None:
    import os

    from rankops.render.serving import API_KEY_ENV, API_KEY_HEADER

    key = os.environ.get(API_KEY_ENV)
    return {API_KEY_HEADER: key} if key else None
