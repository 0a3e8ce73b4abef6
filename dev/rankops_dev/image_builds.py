"""The rankops images built on this machine with no registry: buildah over a Debian base.

Dev harness, not part of the operator (`rankops dev images`). No container registry is
reachable here, so the base is made from Debian's archive: debootstrap bookworm (minbase, Python
3.11), shaped like the UBI 8 python-311 image that images/Dockerfile assumes (a virtualenv at
/opt/app-root on PATH owned by the numeric user 1001, group 0, which is the image's user), and
imported into buildah's store. Every target of images/Dockerfile is built on it, plus the Triton
test image (images/Dockerfile.triton-test: the nvidia-pytriton wheel's tritonserver and the CPU
stand-ins of the real-Triton fixture).

Tags are content hashes of each build's inputs (the Dockerfile, the files it copies, the base
image's id and the build arguments), so an image whose tag exists is not built again. The pure
parts (hashes, build arguments, command lines) are functions the tests call without buildah.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import triton

# Debian packages this needs on the build machine: command -> package.
TOOLS = {"buildah": "buildah", "debootstrap": "debootstrap"}

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What the Dockerfile's stages run: python3 (3.11 on bookworm, like UBI's python-311), venv for
# the /opt/app-root virtualenv and its pip, and CA certificates for pip's downloads from PyPI.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
APP_ROOT = "/opt/app-root"
APP_UID = 1001
BASE_ENV = {
    "APP_ROOT": APP_ROOT,
    "HOME": f"{APP_ROOT}/src",
    "PATH": f"{APP_ROOT}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
}
# Run as root inside the imported root filesystem: what UBI's python-311 image provides and the
# Dockerfile relies on (pip and the console scripts in a virtualenv on PATH, writable by 1001).
BASE_SETUP = f"""set -eu
useradd --uid {APP_UID} --gid 0 --home-dir {APP_ROOT}/src --no-create-home --shell /usr/sbin/nologin default
python3 -m venv {APP_ROOT}
mkdir -p {APP_ROOT}/src
chown -R {APP_UID}:0 {APP_ROOT}
chmod -R g=u {APP_ROOT}
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/*.log
"""

REPOSITORY_PREFIX = "localhost/rankops-"
RANKOPS_TARGETS = ("operator", "validator", "gates")
TRITON_TARGET = "triton-test"
DOCKERFILE = "images/Dockerfile"
TRITON_DOCKERFILE = "images/Dockerfile.triton-test"
# What the Triton test image copies: the CPU stand-in backend and the KIND_GPU shim.
TRITON_CONTEXT = ("triton_standin.py", "triton_cpu_shim.py")
# chroot: the builds' RUN steps need no runtime (runc here lacks CAP_SYS_RESOURCE, see
# scripts/real-node-spike.sh), and they share the host's network for PyPI and Debian's archive.
ISOLATION = "chroot"
# download.pytorch.org is not reachable here and PyPI's torch pulls the CUDA wheels (~2.5 GB):
# the dev gates image leaves the TorchScript reference out.
DEV_BUILD_ARGS = {"gates": {"WITH_TORCH": "false"}}


class ImageBuildError(RuntimeError):
    """A tool is missing or a build step failed; the message says which and why."""


# --- Pure parts ---------------------------------------------------------------------------

def missing_tools(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    return [tool for tool in TOOLS if which(tool) is None]


def missing_tools_message(missing: Sequence[str]) -> str:
    packages = " ".join(TOOLS[tool] for tool in missing)
    return (f"{', '.join(missing)} not found: install with `apt-get install -y {packages}` "
            "(Debian/Ubuntu; as root)")


def digest(inputs: Iterable[tuple[str, bytes]]) -> str:
    """12 hex digits of SHA-256 over (name, content) pairs, order-independent by name."""
    h = hashlib.sha256()
    for name, content in sorted(inputs):
        h.update(f"{name}\0{len(content)}\0".encode())
        h.update(content)
    return h.hexdigest()[:12]


def base_inputs() -> list[tuple[str, bytes]]:
    return [("suite", SUITE.encode()), ("mirror", MIRROR.encode()),
            ("packages", " ".join(BASE_PACKAGES).encode()), ("setup", BASE_SETUP.encode()),
            ("env", repr(sorted(BASE_ENV.items())).encode()), ("uid", str(APP_UID).encode())]


def base_tag() -> str:
    return f"{REPOSITORY_PREFIX}base:{SUITE}-{digest(base_inputs())}"


def build_args(target: str, base_image: str) -> dict[str, str]:
    """The build arguments of `target` on `base_image` in the dev build."""
    from rankops.images import VERSION

    if target == TRITON_TARGET:
        return {"BASE_IMAGE": base_image, "PYTRITON_VERSION": triton.PYTRITON_VERSION,
                "STUB_REQUIREMENTS": " ".join(triton.STUB_REQUIREMENTS)}
    if target not in RANKOPS_TARGETS:
        raise ValueError(f"no image target {target!r}")
    return {"BASE_IMAGE": base_image, "VERSION": VERSION, **DEV_BUILD_ARGS.get(target, {})}


def _excluded(relative: Path) -> bool:
    # .dockerignore's exclusions under operator/: bytecode (the harness is not under operator/).
    return "__pycache__" in relative.parts or relative.suffix == ".pyc"


def context_files(root: Path, target: str) -> list[str]:
    """Relative paths of the files `target`'s build reads from the repository: what its
    Dockerfile copies (through .dockerignore) and the Dockerfile itself."""
    if target == TRITON_TARGET:
        return [TRITON_DOCKERFILE, *(f"dev/rankops_dev/{name}" for name in TRITON_CONTEXT)]
    fixed = [DOCKERFILE, ".dockerignore", "pyproject.toml", "README.md", "LICENSE", "images/requirements.lock"]
    sources = sorted(p.relative_to(root).as_posix() for p in (root / "operator").rglob("*")
                     if p.is_file() and not _excluded(p.relative_to(root)))
    return fixed + sources


def content_tag(root: Path, target: str, base_id: str, args: dict[str, str], mounts: Sequence[str] = ()) -> str:
    """localhost/rankops-<target>:<hash of the files, the base image's id, the arguments and the
    build-time mounts>."""
    inputs = [(f"file:{name}", (root / name).read_bytes()) for name in context_files(root, target)]
    inputs += [("base-id", base_id.encode()), ("target", target.encode()), ("mounts", " ".join(mounts).encode())]
    inputs += [(f"arg:{k}", v.encode()) for k, v in args.items()]
    return f"{REPOSITORY_PREFIX}{target}:{digest(inputs)}"


def debootstrap_command(rootfs: Path, debs: Path) -> list[str]:
    return ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR]


def base_config_command(container: str) -> list[str]:
    env = [f"--env={k}={v}" for k, v in BASE_ENV.items()]
    return ["buildah", "config", *env, f"--workingdir={APP_ROOT}/src", f"--user={APP_UID}",
            "--cmd=/bin/bash", f"--label=org.opencontainers.image.description=Debian {SUITE} minbase "
            "with Python 3.11 in /opt/app-root, shaped like UBI 8 python-311 (rankops dev images)", container]


# The build machine's CA bundle (e.g. an egress proxy's CA), laid read-only over the base's own
# bundle and over pip's vendored one for the RUN steps that download from PyPI: the builds trust
# what this machine trusts, and the images keep Debian's bundle. Mounted over files the base
# has, so no mount point is left in a layer (a missing target, e.g. /etc/pip.conf, would be).
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PIP_CA_BUNDLE = f"{APP_ROOT}/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem"


def host_trust_mounts(exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    if not exists(HOST_CA_BUNDLE):
        return []
    return [f"--volume={HOST_CA_BUNDLE}:{target}:ro" for target in (HOST_CA_BUNDLE, PIP_CA_BUNDLE)]


def build_command(dockerfile: str, target: str, tag: str, args: dict[str, str], context: str,
                  mounts: Sequence[str] = ()) -> list[str]:
    return ["buildah", "bud", f"--isolation={ISOLATION}", "--layers", "--force-rm", *mounts, "-f", dockerfile,
            "--target", target, *(f"--build-arg={k}={v}" for k, v in args.items()), "-t", tag, context]


def export_command(tag: str, directory: Path) -> list[str]:
    """An OCI archive per image, for `ctr -n k8s.io images import` on a node."""
    name = tag.split("/")[-1].split(":")[0]
    return ["buildah", "push", "-q", tag, f"oci-archive:{directory / name}.tar:{tag}"]


# --- Running buildah ----------------------------------------------------------------------

def _nice(command: Sequence[str]) -> list[str]:
    # Builds share the machine's cores with latency measurements: lowest CPU and I/O priority.
    return ["nice", "-n", "19", "ionice", "-c3", *command]


def run(command: Sequence[str], what: str, *, log: Path | None = None) -> str:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"$ {' '.join(command)}\n".encode())
            out.flush()
            done = subprocess.run(_nice(command), stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise ImageBuildError(f"{what} failed (exit {done.returncode}; log {log}):\n{tail}")
        return ""
    done = subprocess.run(_nice(command), capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageBuildError(f"{what} failed (exit {done.returncode}): {(done.stderr or '').strip()[-1500:]}")
    return (done.stdout or "").strip()


def image_id(tag: str) -> str | None:
    done = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", tag],
                          capture_output=True, text=True)
    if done.returncode != 0:  # no such image
        return None
    return done.stdout.strip() or None


def image_size(tag: str) -> str:
    """The image's size as buildah reports it (its layers uncompressed, e.g. "199 MB")."""
    return run(["buildah", "images", "--format", "{{.Size}}", tag], f"buildah images {tag}").splitlines()[0]


def cache_dir() -> Path:
    base = Path(os.environ.get("RANKOPS_CACHE") or Path.home() / ".cache" / "rankops")
    return base / "images"


@dataclass
class Built:
    target: str
    tag: str
    seconds: float
    cached: bool
    size: str = ""


def make_base(say: Callable[[str], None]) -> Built:
    """The Debian base in buildah's store, made once per content of base_inputs()."""
    tag = base_tag()
    start = time.monotonic()
    if image_id(tag):
        return Built("base", tag, time.monotonic() - start, True, image_size(tag))
    work = cache_dir() / "base"
    rootfs, log = work / "rootfs", work / "build.log"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    (work / "debs").mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    say(f"base: debootstrap {SUITE} (minbase + {', '.join(BASE_PACKAGES)}) into {rootfs}")
    run(debootstrap_command(rootfs, work / "debs"), "debootstrap", log=log)
    container = run(["buildah", "from", "scratch"], "buildah from scratch")
    try:
        mount = run(["buildah", "mount", container], "buildah mount")
        # tar, not `buildah copy`: it keeps owners, modes and links; the runtime provides /dev,
        # /proc and /sys, so debootstrap's device nodes stay out.
        pack = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./dev/*",
                                 "--exclude=./proc/*", "--exclude=./sys/*", "-cf", "-", "."], stdout=subprocess.PIPE)
        unpack = subprocess.run(["tar", "-C", mount, "--numeric-owner", "-xpf", "-"], stdin=pack.stdout)
        pack.stdout.close()
        if pack.wait() != 0 or unpack.returncode != 0:
            raise ImageBuildError(f"copying {rootfs} into the image failed")
        run(["buildah", "umount", container], "buildah umount")
        say("base: /opt/app-root virtualenv and user 1001, as in UBI 8 python-311")
        run(["buildah", "run", f"--isolation={ISOLATION}", "--user=0:0", container, "--", "/bin/sh", "-c",
             BASE_SETUP], "base setup", log=log)
        run(base_config_command(container), "buildah config")
        run(["buildah", "commit", "-q", "--rm", container, tag], "buildah commit")
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True)
        raise
    shutil.rmtree(rootfs)
    return Built("base", tag, time.monotonic() - start, False, image_size(tag))


def _triton_context() -> Path:
    """A build context for the Triton test image: the stand-in (kept out of the rankops
    images' context by .dockerignore) and nothing else."""
    context = cache_dir() / "triton-context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    for name in TRITON_CONTEXT:
        shutil.copy2(Path(__file__).with_name(name), context / name)
    return context


def build_target(root: Path, target: str, base: str, say: Callable[[str], None]) -> Built:
    base_id = image_id(base)
    if not base_id:
        raise ImageBuildError(f"base image {base} is not in buildah's store")
    args, mounts = build_args(target, base), host_trust_mounts()
    tag = content_tag(root, target, base_id, args, mounts)
    start = time.monotonic()
    if image_id(tag):
        return Built(target, tag, time.monotonic() - start, True, image_size(tag))
    say(f"{target}: building {tag}")
    if target == TRITON_TARGET:
        command = build_command(str(root / TRITON_DOCKERFILE), target, tag, args, str(_triton_context()), mounts)
    else:
        command = build_command(str(root / DOCKERFILE), target, tag, args, str(root), mounts)
    run(command, f"building {target}", log=cache_dir() / "logs" / f"{target}.log")
    return Built(target, tag, time.monotonic() - start, False, image_size(tag))


def build_all(root: Path, targets: Sequence[str], say: Callable[[str], None]) -> list[Built]:
    missing = missing_tools()
    if missing:
        raise ImageBuildError(missing_tools_message(missing))
    if os.geteuid() != 0:
        raise ImageBuildError("run as root: debootstrap makes device nodes and owners, buildah's store is root's")
    base = make_base(say)
    return [base, *(build_target(root, t, base.tag, say) for t in targets)]


def export(built: Sequence[Built], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for image in built:
        path = directory / f"{image.tag.split('/')[-1].split(':')[0]}.tar"
        path.unlink(missing_ok=True)
        run(export_command(image.tag, directory), f"exporting {image.tag}")
        paths.append(path)
    return paths


def table(built: Sequence[Built]) -> str:
    rows = [("image", "size", "build", "")]
    for b in built:
        rows.append((b.tag, b.size, f"{b.seconds:.1f} s", "cached" if b.cached else "built"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
