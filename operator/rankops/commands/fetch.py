"""`rankops fetch-model`: copy a model artifact into Triton's model repository (init container).

The command line over rankops.fetcher: its flags (each names the RankingModel field that sets it),
one line on stderr for any failure, and the exit codes: 0 fetched, 1 failed, 143 stopped by SIGTERM.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankops.fetcher.fetch import (BYTES_PER_OBJECT, DEADLINE_FIELD, DEFAULT_DEADLINE_S, DEFAULT_FIRST_BYTE_S,
                                   DEFAULT_MAX_OBJECTS, DEFAULT_STALL_S, FIRST_BYTE_FIELD, MIN_LISTING_BYTES,
                                   MIN_PAGES, OBJECTS_PER_PAGE, SHA256_FIELD, SIZE_FIELD, STALL_FIELD,
                                   DeadlineExceeded, FetchError, Interrupted, Limits, Progress, check_dest,
                                   check_expect, deadline_message, fetch, flat, where)


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


def summary(uri: str, dest: Path, progress: Progress) -> str:
    line = f"fetched {uri} -> {dest} ({progress.files} files, {progress.bytes} bytes"
    if progress.verified:
        line += f", {progress.verified} checked against the store's MD5"
    if progress.sha256_checked:
        line += f", {progress.sha256_checked} matched --sha256"
    elif any("no length" in u for u in progress.unverified):
        line += "; the server sent no length or checksum, so a cut connection could not be told apart"
    return line + ")"


def cmd_fetch(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    progress = Progress()
    dest = Path(args.dest)
    try:
        limits = limits_from(args, args.uri)
        dest = check_dest(args.dest, args.uri)
        fetch(args.uri, dest, args.expect, limits, progress, sha256=args.sha256)
    except FetchError as exc:
        print(f"rankops fetch-model: {flat(str(exc))}", file=sys.stderr)
        return 1
    except (Interrupted, KeyboardInterrupt):
        print(f"rankops fetch-model: {args.uri}: interrupted while {progress.activity}; {where(dest, progress)}",
              file=sys.stderr)
        return 143
    except DeadlineExceeded:
        print(f"rankops fetch-model: {deadline_message(args.uri, limits, progress, dest)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the contract is one line, never a traceback
        print(f"rankops fetch-model: {args.uri}: unexpected {type(exc).__name__} while {progress.activity} "
              f"({flat(str(exc))[:300]}); {where(dest, progress)}: please report it", file=sys.stderr)
        return 1
    print(summary(args.uri, dest, progress))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fetch-model", help="copy a model artifact into the model repository (init container)")
    p.add_argument("--uri", required=True,
                   help="where the artifact is: s3://BUCKET/KEY, gs://BUCKET/KEY (the key literally: # and ? "
                        "are key characters), https://.../FILE or file:///PATH")
    p.add_argument("--dest", required=True,
                   help="the directory (or, with a file suffix, the file) to copy it to, e.g. /models/NAME/1")
    p.add_argument("--expect", help="file that must exist inside DEST afterwards, e.g. model.onnx")
    p.add_argument("--sha256", metavar="HEX",
                   help="the SHA-256 the file --expect names (or the artifact's one file) must have; a mismatch "
                        f"fails and leaves DEST as it was (RankingModel: {SHA256_FIELD})")
    add_limit_flags(p)
    p.set_defaults(func=cmd_fetch)
    add_stage_command(sub)


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    """The fetcher's bounds, as fetch-model and stage-versions take them."""
    p.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                   help=f"give up after this many seconds in all (RankingModel: {DEADLINE_FIELD})")
    p.add_argument("--stall-s", type=float, default=DEFAULT_STALL_S,
                   help=f"a read with no byte for this long fails (and is retried) (RankingModel: {STALL_FIELD})")
    p.add_argument("--first-byte-s", type=float, default=None,
                   help=f"a request with no byte of its answer for this long fails (and is retried) (default: "
                        f"{DEFAULT_FIRST_BYTE_S:g}, or --stall-s when lower) (RankingModel: {FIRST_BYTE_FIELD})")
    p.add_argument("--max-objects", type=int, default=DEFAULT_MAX_OBJECTS,
                   help="refuse a prefix listing more objects than this")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="the artifact's bytes in all, at most (the model volume's size, "
                        f"{SIZE_FIELD}): over it the fetch stops before the volume fills")
    p.add_argument("--max-listing-pages", type=int, default=None,
                   help=f"stop a listing after this many pages (default: --max-objects / {OBJECTS_PER_PAGE}, "
                        f"at least {MIN_PAGES})")
    p.add_argument("--max-listing-bytes", type=int, default=None,
                   help=f"stop a listing after the store sent this many bytes of it (default: {BYTES_PER_OBJECT} "
                        f"per --max-objects, at least {MIN_LISTING_BYTES})")


def limits_from(args: argparse.Namespace, what: str) -> Limits:
    """The fetcher's Limits from add_limit_flags' flags; a FetchError names the flag that is out of range."""
    if (args.deadline_s <= 0 or args.stall_s <= 0 or (args.first_byte_s is not None and args.first_byte_s <= 0)
            or args.max_objects < 1
            or min(args.max_listing_pages or 1, args.max_listing_bytes or 1, args.max_bytes or 1) < 1):
        raise FetchError(f"{what}: --deadline-s, --stall-s and --first-byte-s must be above 0, --max-objects, "
                         "--max-listing-pages, --max-listing-bytes and --max-bytes at least 1")
    return Limits(deadline_s=args.deadline_s, stall_s=args.stall_s, first_byte_s=args.first_byte_s,
                  max_objects=args.max_objects, max_pages=args.max_listing_pages,
                  max_listing_bytes=args.max_listing_bytes, max_bytes=args.max_bytes)


def cmd_stage(args: argparse.Namespace) -> int:
    """Keep --model-dir holding the versions --versions-file lists (fetcher/stager.py), a round
    every --interval seconds (or one with --once); SIGTERM ends it between rounds, or a fetch
    where it is, with 143."""
    from rankops.fetcher.stager import fetched_with, remove_version_dir, stage_round

    def setup() -> Callable[[], Any]:
        check_expect(args.expect, str(args.versions_file))   # said once at start, not as every round's failure
        fetch = fetched_with(limits_from(args, str(args.versions_file)), args.expect)
        return lambda: stage_round(args.model, Path(args.model_dir), Path(args.versions_file), fetch,
                                   remove_version_dir)
    return _stage_rounds("stage-versions", args, setup)


def cmd_stage_members(args: argparse.Namespace) -> int:
    """Keep --repository holding the members, and their versions, --members-file lists
    (fetcher/members.py): a shared Triton server's stager."""
    from rankops.fetcher.members import members_round, remove_model_dir
    from rankops.fetcher.stager import fetched_with, remove_version_dir

    def setup() -> Callable[[], Any]:
        limits = limits_from(args, str(args.members_file))
        return lambda: members_round(args.server, Path(args.repository), Path(args.members_file),
                                     lambda expect: fetched_with(limits, expect), remove_version_dir,
                                     remove_model_dir)
    return _stage_rounds("stage-members", args, setup)


def _stage_rounds(command: str, args: argparse.Namespace, setup: Callable[[], Callable[[], Any]]) -> int:
    """A stager's loop: a round every --interval seconds (one with --once, exit 0 when nothing
    failed), each new set of lines said once; 2 on bad flags, 143 on SIGTERM."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if args.interval <= 0:
            raise FetchError(f"--interval must be above 0, got {args.interval}")
        one_round = setup()
    except FetchError as exc:
        print(f"rankops {command}: {flat(str(exc))}", file=sys.stderr)
        return 2
    said: tuple[str, ...] = ()
    try:
        while True:
            done = one_round()
            if done.lines != said:   # a line repeated every round would bury the log
                for line in done.lines:
                    print(f"rankops {command}: {flat(line)}", flush=True)
                said = done.lines
            if args.once:
                return 0 if done.ok else 1
            time.sleep(args.interval)
    except (Interrupted, KeyboardInterrupt):
        return 143


def _add_round_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=5.0, help="seconds between rounds (default 5)")
    p.add_argument("--once", action="store_true", help="one round, then exit (0: nothing failed)")


def add_stage_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stage-versions",
                       help="keep a model directory holding the versions a file lists (in-place switch, beside Triton)")
    p.add_argument("--model", required=True, help="the model's name; the file must name it")
    p.add_argument("--model-dir", required=True, help="the model's directory in the repository, e.g. /models/NAME")
    p.add_argument("--versions-file", required=True,
                   help="the JSON list of versions the directory must hold (mounted from the model's ConfigMap)")
    _add_round_flags(p)
    p.add_argument("--expect", help="file every version must hold once fetched, e.g. model.onnx (its sha256 "
                                    "covers that file)")
    add_limit_flags(p)
    p.set_defaults(func=cmd_stage)
    p = sub.add_parser("stage-members",
                       help="keep a shared Triton's model repository holding the members a file lists (beside Triton)")
    p.add_argument("--server", required=True, help="the shared server's name; the file must name it")
    p.add_argument("--repository", required=True, help="the model repository, e.g. /models")
    p.add_argument("--members-file", required=True,
                   help="the JSON list of members and their versions (mounted from the server's ConfigMap)")
    _add_round_flags(p)
    add_limit_flags(p)
    p.set_defaults(func=cmd_stage_members)
