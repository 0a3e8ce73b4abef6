"""`python -m rankops_dev ARGS` is `rankops dev ARGS` for a source tree on PYTHONPATH, where no
installed entry point lets `rankops` find the dev commands."""
from __future__ import annotations

import argparse
import sys

from rankops_dev.commands.dev import add_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rankops")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["dev", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
