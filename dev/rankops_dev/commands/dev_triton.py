"""`rankops dev triton install|serve`: the real-Triton fixture by hand.

`install` unpacks tritonserver and the CPU stand-ins once per machine (what `.ci/run` does);
`serve` renders a RankingModel as the operator would, exports a small model of its shapes and
serves it with the rendered Deployment's own arguments until Ctrl-C: a quick way to see whether
Triton accepts the config (and what the CPU stand-ins had to change).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path


def add_commands(dev_sub: argparse._SubParsersAction) -> None:
    triton = dev_sub.add_parser("triton", help="a real tritonserver on this machine (CPU stand-ins for GPU backends)")
    sub = triton.add_subparsers(dest="triton_command", required=True, metavar="TRITON_COMMAND")
    install = sub.add_parser("install", help="unpack tritonserver 2.51 and the CPU stand-ins (once per machine)",
                             description="Downloads nvidia-pytriton from PyPI, unpacks its tritonserver, and "
                                         "builds the stand-ins' virtualenv under ~/.cache/rankops/triton.")
    install.set_defaults(func=run_install)
    serve = sub.add_parser("serve", help="render a RankingModel and serve it on a local tritonserver",
                           description="Renders the model's stable Deployment and config.pbtxt, exports a small "
                                       "model with the spec's tensors in the version's format, and runs the "
                                       "Deployment's tritonserver command line locally until Ctrl-C.")
    serve.add_argument("-f", "--filename", required=True, help="a RankingModel manifest")
    serve.add_argument("--model-version", help="the version to serve (default spec.version)")
    serve.add_argument("--workdir", help="where the model repository and the log go (default a temp dir)")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    serve.set_defaults(func=run_serve)


def run_install(args: argparse.Namespace) -> int:
    from rankops_dev import triton

    try:
        found = triton.ensure_installed()
    except triton.TritonError as exc:
        print(f"rankops dev triton install: {exc}", file=sys.stderr)
        return 1
    print(f"tritonserver {triton.TRITON_VERSION} ready at {found.server_bin}")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    import yaml

    from rankops.render.desired import resolve_shape
    from rankops_dev import triton

    workdir = Path(args.workdir) if args.workdir else triton.scratch_dir()
    try:
        docs = [d for d in yaml.safe_load_all(Path(args.filename).read_text()) if d and d.get("kind") == "RankingModel"]
        if not docs:
            raise ValueError(f"{args.filename} holds no RankingModel")
        rm, server = triton.server_for_model(docs[0], workdir, args.model_version, host=args.host)
    except (OSError, ValueError, triton.TritonError) as exc:
        print(f"rankops dev triton serve: {exc}", file=sys.stderr)
        return 2
    resolved = resolve_shape(rm.spec)
    for problem in resolved.unbatched + resolved.problems:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"CPU edits: {', '.join(server.cpu_edits) or 'none'}", file=sys.stderr)

    def stop_now(*_: object) -> None:
        raise KeyboardInterrupt

    # The server runs in its own session: whatever ends this command must stop it too.
    signal.signal(signal.SIGTERM, stop_now)
    try:
        server.start()
    except triton.TritonError as exc:
        print(f"rankops dev triton serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        server.stop()
        return 130
    print(f"serving {rm.metadata['name']} version {args.model_version or rm.spec.version}: "
          f"http://{server.http_url} grpc {server.grpc_url} metrics http://{server.metrics_url}/metrics "
          f"(log {server.log_path}); Ctrl-C stops it")
    for finding in server.findings():
        print(f"triton: {finding}", file=sys.stderr)
    try:
        while server.process.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
