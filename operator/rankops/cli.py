"""The `rankops` command line: one entry point, one sub-command per job.

Each feature module registers its own sub-commands through `add_commands(subparsers)`,
so this file only wires them together. Other distributions add commands through the
`rankops.commands` entry-point group (rankops-dev: `rankops dev`); the product imports none of them.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

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
    "rankops.commands.route",       # route (a shared Triton's per-model ports)
    "rankops.commands.validate_node",  # validate-node
    "rankops.commands.docs",        # docs reference
]


# Entry points (name -> "module:add_commands") other distributions register commands under.
PLUGIN_GROUP = "rankops.commands"
# What `rankops dev` says where rankops-dev is not installed (the images, a plain `pip install rankops`).
DEV_MISSING = ("rankops dev: the dev harness (local cluster, demo, images, Triton fixture) is the rankops-dev "
               "distribution, not part of rankops: from a source checkout, `pip install -e ./dev`")


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
        importlib.import_module(name).add_commands(sub)
    plugins = plugin_commands()
    for add_commands in plugins.values():
        add_commands(sub)
    if "dev" not in plugins:
        # Any arguments (--help too): main() hands them to _dev_missing, which only says what to install.
        sub.add_parser("dev", help="the dev harness: needs rankops-dev installed", add_help=False) \
            .set_defaults(func=_dev_missing)
    return parser


def plugin_commands() -> dict[str, Callable[[argparse._SubParsersAction], None]]:
    """The installed distributions' `add_commands` functions, by command name (each name once, should
    a distribution be found twice on the path)."""
    from importlib.metadata import entry_points

    found = {}
    for point in entry_points(group=PLUGIN_GROUP):
        found.setdefault(point.name, point)
    return {name: found[name].load() for name in sorted(found)}


def _dev_missing(args: argparse.Namespace) -> int:
    print(DEV_MISSING, file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.func is not _dev_missing:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
