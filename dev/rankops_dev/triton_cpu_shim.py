#!/usr/bin/env python3
"""`tritonserver` in the Triton test image: the real server, on a CPU, with the config as rendered.

A CPU-only Triton refuses `instance_group { kind: KIND_GPU }` ("no GPUs are available"), and the
rendered pod mounts each model's config.pbtxt read-only from its ConfigMap. So this shim, first on
PATH, builds a shadow repository in /tmp (the pod's writable emptyDir): per model, a copy of its
config with KIND_GPU -> KIND_CPU (the one edit the real-Triton fixture makes too, said on
stderr) and a symlink for every other entry (the version directories fetch-model wrote); then it
execs the real server with `--model-repository` pointed there and every other argument as given.
A child it forks first keeps the shadow in step with the real directories (a version a stager
adds or removes later, rollout.strategy inPlace), every MIRROR_S.
Test image only: the product images run NVIDIA's tritonserver unchanged.
"""
import os
import sys
from pathlib import Path

REAL = "/opt/tritonserver/libexec/tritonserver"
SHADOW = Path(os.environ.get("RANKOPS_CPU_REPOSITORY", "/tmp/cpu-model-repository"))
MIRROR_S = 0.5


def cpu_config(text: str) -> tuple[str, int]:
    """The config with every KIND_GPU instance group made KIND_CPU, and how many were."""
    return text.replace("KIND_GPU", "KIND_CPU"), text.count("KIND_GPU")


def shadow(repository: Path, into: Path, quiet: bool = False) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for model in sorted(p for p in repository.iterdir() if p.is_dir()):
        target = into / model.name
        target.mkdir(exist_ok=True)
        for entry in model.iterdir():
            link = target / entry.name
            if entry.name == "config.pbtxt":
                if quiet and link.exists():
                    continue   # written at start (a running server's config is what it loaded with)
                text, edits = cpu_config(entry.read_text())
                link.unlink(missing_ok=True)
                link.write_text(text)
                if edits:
                    print(f"--- CPU stand-in: {model.name}/config.pbtxt: instance_group KIND_GPU -> KIND_CPU "
                          f"({edits})", file=sys.stderr, flush=True)
            elif not link.is_symlink():
                link.symlink_to(entry)
        for link in target.iterdir():   # gone from the real directory (a version removed): gone here
            if link.is_symlink() and not (model / link.name).exists() and not (model / link.name).is_symlink():
                link.unlink()


def mirror(repository: Path, into: Path) -> None:
    """Keep `into` in step with `repository`, forever (the forked child's loop)."""
    import time

    while True:
        time.sleep(MIRROR_S)
        try:
            shadow(repository, into, quiet=True)
        except OSError:
            pass   # an entry removed while listed: the next round sees the directory as it is


def main(argv: list[str]) -> None:
    args = []
    for arg in argv:
        if arg.startswith("--model-repository="):
            repository = Path(arg.split("=", 1)[1])
            shadow(repository, SHADOW)
            if os.fork() == 0:
                mirror(repository, SHADOW)
            arg = f"--model-repository={SHADOW}"
        args.append(arg)
    os.execv(REAL, [REAL, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
