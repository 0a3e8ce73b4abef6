"""`rankops dev images`: build the rankops images and the Triton test image here, with no registry.

Builds on a Debian base made with debootstrap (UBI 8 stays the default of images/Dockerfile for
users); tags are content hashes, so a second run builds nothing that has not changed. `--export`
writes an OCI archive per image for `ctr -n k8s.io images import`; `--check` runs the images.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_commands(dev_sub: argparse._SubParsersAction) -> None:
    from rankops_dev.image_builds import RANKOPS_TARGETS, TRITON_TARGET

    targets = [*RANKOPS_TARGETS, TRITON_TARGET]
    images = dev_sub.add_parser(
        "images", help="build the rankops images and the Triton test image with buildah (no registry)",
        description="Makes a Debian bookworm base with debootstrap, imports it into buildah's store, and "
                    "builds images/Dockerfile's targets and images/Dockerfile.triton-test on it, tagged "
                    "localhost/rankops-<target>:<content hash>. Needs root, buildah and debootstrap.")
    images.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"what to build (default all: {', '.join(targets)})")
    images.add_argument("--export", metavar="DIR", type=Path,
                        help="write DIR/rankops-<target>.tar (OCI archive) per image, for ctr images import")
    images.add_argument("--check", action="store_true",
                        help="then run them: the operator image's `rankops --help` and user, and one "
                             "inference request to the Triton test image's tritonserver")
    images.set_defaults(func=run_images, all_targets=targets)


def run_images(args: argparse.Namespace) -> int:
    from rankops_dev import image_builds, image_check

    root = Path(__file__).resolve().parents[3]
    if not (root / image_builds.DOCKERFILE).exists():
        print(f"rankops dev images: needs a source checkout ({root / image_builds.DOCKERFILE} not found)",
              file=sys.stderr)
        return 2
    unknown = sorted(set(args.targets) - set(args.all_targets))
    if unknown:
        print(f"rankops dev images: no target {', '.join(unknown)} (choose from {', '.join(args.all_targets)})",
              file=sys.stderr)
        return 2
    targets = args.targets or args.all_targets
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        built = image_builds.build_all(root, targets, say)
        print(image_builds.table(built), flush=True)
        if args.export:
            for path in image_builds.export(built[1:], args.export):
                print(f"exported {path}")
        if args.check:
            by_target = {b.target: b.tag for b in built}
            ok = True
            for line, passed in image_check.check(by_target, say):
                print(f"{'ok  ' if passed else 'FAIL'} {line}", flush=True)
                ok &= passed
            return 0 if ok else 1
    except image_builds.ImageBuildError as exc:
        print(f"rankops dev images: {exc}", file=sys.stderr)
        return 1
    return 0
