"""`-o/--output` for commands that print an object or a report, kubectl style."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rankops.yamlio import dump, dump_all


def add_output_flag(p: argparse.ArgumentParser, formats: tuple[str, ...], default: str) -> None:
    """argparse refuses any other format, naming the ones there are."""
    p.add_argument("-o", "--output", choices=formats, default=default, metavar="FORMAT",
                   help=f"output format: {' | '.join(formats)} (default {default})")


def as_list(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """Several Kubernetes objects as one JSON document, as `kubectl get -o json` prints them."""
    return {"apiVersion": "v1", "kind": "List", "items": list(objects)}


def format_objects(objects: list[dict[str, Any]], output: str) -> str:
    """Kubernetes objects: a YAML stream, or a JSON List."""
    if output == "json":
        return json.dumps(as_list(objects), indent=2) + "\n"
    return dump_all(objects)


def format_report(report: Any, output: str) -> str:
    """A JSON-shaped report (a dict) as YAML or JSON."""
    if output == "yaml":
        return dump(report)
    return json.dumps(report, indent=2) + "\n"


def print_report(args: Any, result: Any, text: Callable[[], str], write_plot: Callable[[Any, str], Any]) -> bool:
    """Print `result` as -o asks (text: `text()`), and write --plot with `write_plot`; False when the
    plot could not be written (said on stderr)."""
    if args.output != "text":
        sys.stdout.write(format_report(result.to_json(), args.output))
    else:
        print(text())
    if args.plot:
        try:
            print(f"plot: {write_plot(result, args.plot)}", file=sys.stderr)
        except (RuntimeError, OSError) as exc:
            print(f"rankops plan: --plot: {exc}", file=sys.stderr)
            return False
    return True
