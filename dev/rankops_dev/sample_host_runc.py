"""runc for a real node whose validator pods must check a sample RHEL 8 host, not this machine.

A real node's validator container mounts the host's paths (/etc, /proc, /sys, /usr, ...) at /host
(validator/daemonset.py HOST_MOUNTS) and judges what it reads there. On this Debian dev machine
that judgement is "not RHEL 8, no driver": right, but the demo needs a node that passes. The
kubelet, containerd and runc need the real /etc, /proc and /sys themselves, so the sample tree
cannot be put in their way; instead containerd's runc is this wrapper, which rewrites the OCI
bundle of a container being created: a bind mount of host path P at /host/P gets its source
from the sample tree (SAMPLE/P) instead. Nothing else changes: the validator image, its user, its
read-only mounts, the admission policy and the node patch are real; only the host it looks at is
the sample. Every other runc call, and every other container, goes to runc untouched.

Standard library only, run by path (containerd's shim runs it with its own environment):

    python3 sample_host_runc.py REAL_RUNC SAMPLE_ROOT [runc arguments...]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

VALIDATOR_HOST_ROOT = "/host"  # validator/daemonset.py HOST_ROOT (this file imports nothing of rankops)


def bundle_of(args: list[str]) -> Path | None:
    """The bundle directory of a `runc create` / `runc run` (None for every other command):
    `--bundle DIR`, `-b DIR`, `--bundle=DIR`, or the working directory."""
    if not {"create", "run"} & set(args):
        return None
    for index, arg in enumerate(args):
        if arg in ("--bundle", "-b") and index + 1 < len(args):
            return Path(args[index + 1])
        if arg.startswith("--bundle="):
            return Path(arg.split("=", 1)[1])
    return Path.cwd()


def host_mount_source(mount: dict[str, Any]) -> str | None:
    """The host path P of a bind mount of P at /host/P (the validator's view of its host), else None."""
    destination, source = mount.get("destination", ""), mount.get("source", "")
    is_bind = mount.get("type") == "bind" or "bind" in mount.get("options", []) or "rbind" in mount.get("options", [])
    if not is_bind or not destination.startswith(VALIDATOR_HOST_ROOT + "/"):
        return None
    path = destination[len(VALIDATOR_HOST_ROOT):]
    return path if os.path.normpath(source) == os.path.normpath(path) else None


def redirect_host_mounts(config: dict[str, Any], sample_root: Path) -> list[str]:
    """Point every /host/P bind mount of the OCI `config` at SAMPLE_ROOT/P; returns the paths
    redirected. A path the sample lacks becomes an empty one of the real source's kind, which the
    checks read as the kubelet's DirectoryOrCreate / FileOrCreate leave it: absent."""
    redirected = []
    for mount in config.get("mounts", []):
        path = host_mount_source(mount)
        if path is None:
            continue
        target = sample_root / path.lstrip("/")
        if not target.exists():
            if Path(path).is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
        mount["source"] = str(target)
        redirected.append(path)
    return redirected


def main(argv: list[str]) -> None:
    real_runc, sample_root, args = argv[1], Path(argv[2]), argv[3:]
    bundle = bundle_of(args)
    if bundle is not None and (bundle / "config.json").is_file():
        config_path = bundle / "config.json"
        config = json.loads(config_path.read_text())
        if redirect_host_mounts(config, sample_root):
            config_path.write_text(json.dumps(config))
    os.execv(real_runc, [real_runc, *args])


if __name__ == "__main__":
    main(sys.argv)
