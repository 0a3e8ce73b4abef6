"""`rankops route`: the command line of a shared tritonserver's `route` sidecar (triton/route.py)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from rankops.triton.route import DEFAULT_MAX_BODY_BYTES, RouteError, checked_routes, run


def add_commands(subparsers) -> None:
    route = subparsers.add_parser(
        "route", help="one port per model of a shared Triton, each passing only that model's requests",
        description="Listen on one port per model (from --routes-file, read again every --reload-s, and --route) "
                    "and pass to Triton at --upstream only that model's paths and the health checks; "
                    "everything else is answered 404 here.")
    route.add_argument("--upstream", default="127.0.0.1:8000", help="Triton's HTTP address (default 127.0.0.1:8000)")
    route.add_argument("--host", default="0.0.0.0", help="address the ports listen on (default 0.0.0.0)")
    route.add_argument("--routes-file", type=Path, help='JSON {"PORT": "MODEL", ...}, e.g. a mounted ConfigMap key')
    route.add_argument("--route", action="append", default=[], metavar="PORT=MODEL", help="a fixed route (repeatable)")
    route.add_argument("--reload-s", type=float, default=2.0, help="how often the routes file is read (default 2)")
    route.add_argument("--api-key-env", metavar="NAME",
                       help="environment variable holding the key the operator's drain asks carry "
                            "(POST /rankops/drain); without it no drain is taken")
    route.add_argument("--repository", type=Path, metavar="DIR",
                       help="the pod's model repository (read-only): a drain ask's answer lists the model's "
                            "version directories there")
    route.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                       help=f"largest request body passed (default {DEFAULT_MAX_BODY_BYTES})")
    route.set_defaults(func=_route)


def _route(args: argparse.Namespace) -> int:
    host, _, port = args.upstream.rpartition(":")
    try:
        static = checked_routes(dict(r.partition("=")[::2] for r in args.route))
        if not host or not port.isdigit():
            raise RouteError(f"--upstream {args.upstream!r} is not HOST:PORT")
    except RouteError as exc:
        print(f"rankops route: {exc}", file=sys.stderr)
        return 2
    if not static and args.routes_file is None:
        print("rankops route: give --routes-file or --route", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run((host, int(port)), args.routes_file, static, args.host, args.reload_s, stop, args.max_body_bytes,
                  api_key=os.environ.get(args.api_key_env) if args.api_key_env else None, repository=args.repository)

    asyncio.run(main())
    return 0
