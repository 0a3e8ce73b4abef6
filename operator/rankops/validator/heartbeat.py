"""The validator's liveness: its loop touches a file after each round; the probe checks its age.

`python3 -m rankops.validator.heartbeat FILE --max-age S` exits 0 when FILE was touched within S
seconds, 1 otherwise (missing included). It imports only the standard library, so the probe costs
one small interpreter start.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def touch(path: str) -> None:
    """Mark a round done; never raises (a full /tmp must not stop the validator's work)."""
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        os.utime(path, None)
    except OSError:
        pass


def age(path: str, now: float | None = None) -> float | None:
    """Seconds since `path` was touched; None when it is missing."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    return (time.time() if now is None else now) - mtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rankops.validator.heartbeat", description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--max-age", type=float, required=True, metavar="S")
    args = parser.parse_args(argv)
    seconds = age(args.file)
    if seconds is None:
        print(f"{args.file}: missing: the validator has not started its loop", file=sys.stderr)
        return 1
    if seconds > args.max_age:
        print(f"{args.file}: last round {seconds:.0f}s ago, more than {args.max_age:.0f}s: the validator is stuck",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
