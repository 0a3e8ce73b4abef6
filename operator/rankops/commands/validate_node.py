"""`rankops validate-node`: check a RHEL 8 GPU host and, in the DaemonSet, label its node.

Exit status: 0 ready, 1 not ready (a required check failed or is unknown), 2 bad input or the
node could not be patched, 3 with --patch-node: the pool does not own the node (it has no
nvidia.com/gpu capacity, or an older pool selects it), so it was left unmarked.
"""
from __future__ import annotations

import json
import logging
import os
import sys

import yaml
from pydantic import ValidationError

from rankops.api.gpunodepool import GpuNodePool, NodeRequirements
from rankops.commands.output import add_output_flag, format_report
from rankops.validator import gpu as gpu_facts
from rankops.validator.host import HostView
from rankops.validator.node import run_on_node
from rankops.validator.report import Report, render_text, validate_host


class InputError(Exception):
    """A bad argument or input file; the message names it and the fix."""


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate-node", help="check a RHEL 8 GPU host (driver, nouveau, Secure Boot, SELinux, toolkit, ...)",
        description=__doc__.splitlines()[0])
    parser.add_argument("--host-root", default="/", metavar="DIR",
                        help="the host's / as seen from here (the DaemonSet mounts it at /host; default /)")
    add_output_flag(parser, ("text", "json", "yaml"), "text")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--pool", metavar="FILE", help="a GpuNodePool manifest (YAML) whose requirements apply")
    source.add_argument("--requirements", metavar="JSON",
                        help="the requirements as JSON (spec.requirements of a GpuNodePool)")
    parser.add_argument("--pool-name", metavar="NAME", help="pool name for the report and the node label")
    parser.add_argument("--nvidia-smi-xml", metavar="FILE", help="output of `nvidia-smi -q -x` for GPU facts")
    parser.add_argument("--no-nvml", action="store_true", help="do not ask NVML for GPU facts")
    parser.add_argument("--node", metavar="NAME", help="the Kubernetes node this host is (for --patch-node)")
    parser.add_argument("--patch-node", action="store_true",
                        help="write labels, the report annotation and (if asked) the taint onto --node")
    parser.add_argument("--taint-failing-nodes", action="store_true",
                        help="with --patch-node: taint the node rankops.io/gpu-unvalidated:NoSchedule while it fails")
    parser.add_argument("--interval", type=int, default=300, metavar="S",
                        help="with --patch-node: seconds between checks (default 300)")
    parser.add_argument("--once", action="store_true", help="with --patch-node: check and patch once, then exit")
    parser.add_argument("--heartbeat", metavar="FILE",
                        help="with --patch-node: touch FILE after each round (the DaemonSet's liveness probe "
                             "checks its age with python3 -m rankops.validator.heartbeat)")
    parser.set_defaults(func=validate_node)


def _requirements(args) -> tuple[NodeRequirements, str | None, bool]:
    """(requirements, pool name, taint failing nodes) from --pool, --requirements, or defaults."""
    if args.pool:
        try:
            with open(args.pool, encoding="utf-8") as handle:
                manifest = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise InputError(f"--pool {args.pool}: cannot read it as YAML ({exc})") from None
        try:
            pool = GpuNodePool.model_validate(manifest)
        except ValidationError as exc:
            raise InputError(f"--pool {args.pool}: not a valid GpuNodePool:\n{_errors(exc)}") from None
        return pool.spec.requirements, args.pool_name or pool.name or None, pool.spec.taint_failing_nodes
    if args.requirements:
        try:
            data = json.loads(args.requirements)
        except ValueError as exc:
            raise InputError(f"--requirements is not JSON ({exc}); pass spec.requirements as one JSON object") from None
        try:
            return NodeRequirements.model_validate(data), args.pool_name, False
        except ValidationError as exc:
            raise InputError(f"--requirements: not valid GpuNodePool requirements:\n{_errors(exc)}") from None
    return NodeRequirements(), args.pool_name, False


def _errors(exc: ValidationError) -> str:
    return "\n".join(f"  {'.'.join(str(p) for p in error['loc']) or '(top)'}: {error['msg']}"
                     for error in exc.errors())


def _print(report: Report, output: str) -> None:
    try:
        text = render_text(report) if output == "text" else format_report(report.to_dict(), output).rstrip("\n")
        print(text, flush=True)
    except BrokenPipeError:  # `| head` closed the pipe: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def validate_node(args) -> int:
    try:
        requirements, pool_name, pool_taints = _requirements(args)
        if not os.path.isdir(args.host_root):
            raise InputError(f"--host-root {args.host_root}: not a directory")
        if args.nvidia_smi_xml and not os.path.isfile(args.nvidia_smi_xml):
            raise InputError(f"--nvidia-smi-xml {args.nvidia_smi_xml}: no such file "
                             "(write it with: nvidia-smi -q -x > FILE)")
        if args.patch_node and not args.node:
            raise InputError("--patch-node needs --node NAME (in the DaemonSet: --node $(NODE_NAME))")
        if args.interval < 30:
            raise InputError(f"--interval {args.interval}: use at least 30 seconds")
    except InputError as exc:
        print(f"rankops validate-node: {exc}", file=sys.stderr)
        return 2
    if args.patch_node:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        return run_on_node(args.node, args.host_root, pool_name or "", args.interval, args.once,
                           requirements=requirements, taint_failing=args.taint_failing_nodes or pool_taints,
                           nvidia_smi_xml=args.nvidia_smi_xml, use_nvml=not args.no_nvml,
                           on_report=lambda report: _print(report, args.output),
                           heartbeat_file=args.heartbeat)
    host = HostView(args.host_root)
    facts = gpu_facts.gather(host, args.nvidia_smi_xml, use_nvml=not args.no_nvml)
    report = validate_host(host, requirements, facts, node=args.node, pool=pool_name)
    _print(report, args.output)
    return 0 if report.ready else 1
