"""`rankops docs reference`: the CRD field reference (docs/reference.md) from the API models."""
from __future__ import annotations

import argparse
import pathlib
import sys


def cmd_reference(args: argparse.Namespace) -> int:
    from rankops.api.reference import reference_markdown

    text = reference_markdown()
    if args.check:
        path = pathlib.Path(args.check)
        if not path.exists() or path.read_text() != text:
            print(f"rankops docs reference: {path} is out of date: run "
                  f"`rankops docs reference --write {path}`", file=sys.stderr)
            return 1
        return 0
    if args.write:
        path = pathlib.Path(args.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
        return 0
    sys.stdout.write(text)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    docs = sub.add_parser("docs", help="generate documentation from the code")
    docs_sub = docs.add_subparsers(dest="docs_command", required=True, metavar="DOCS_COMMAND")
    p = docs_sub.add_parser(
        "reference", help="the RankingModel / GpuNodePool field reference, as Markdown",
        description="Print the CRD field reference (one table per object: field path, type, default, "
                    "constraints, description) generated from the API models.")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--write", metavar="FILE", help="write it to FILE (docs/reference.md) instead of stdout")
    out.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from what would be generated")
    p.set_defaults(func=cmd_reference)
