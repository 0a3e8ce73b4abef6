"""The `rankops` command line: one entry point, one sub-command per job.

Each feature module registers its own sub-commands through `add_commands(subparsers)`,
so this file only wires them together.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute sub-commands, in help order. Each exposes add_commands(subparsers);
# the parser for a command carries `func(args) -> int` as its default.
COMMAND_MODULES = [
    "rankops.commands.render",      # render, crds
    "rankops.commands.run",         # run (the operator)
    "rankops.commands.fetch",       # fetch-model (init containers)
    "rankops.commands.plan",        # plan
    "rankops.commands.profile",     # profile (measures a live Triton)
    "rankops.commands.gate",        # gate warmup | equivalence
    "rankops.commands.warm",        # warm (the container beside Triton)
    "rankops.commands.infer",       # infer (one request, the scores)
    "rankops.commands.validate_node",  # validate-node
    "rankops.commands.dev",         # dev up
    "rankops.commands.docs",        # docs reference
]


def version() -> str:
    """The installed package's version (pyproject.toml's), as the images and the chart's appVersion carry it."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("rankops")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rankops", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"rankops {version()}",
                        help="print the rankops version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A part of rankops this build leaves out (the images carry no dev cluster): no such command.
            if exc.name and (name.startswith(exc.name) or exc.name.startswith("rankops.")):
                continue
            raise
        module.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
