"""What one container of a pod sees and runs on a process node (test harness, pure).

The pod runner (`pod_runner.py`) plays the kubelet for nodes whose pods really run, as local
processes under bubblewrap, with no container engine. This module decides, from the pod as the
API server holds it, everything that does not need a side effect: which local program stands for
the image, the container's environment and command line after `$(VAR)` expansion, the bind mounts
of its volumes, the bwrap command line that builds its private mount namespace, the /etc/hosts
that makes Service names resolve to Ready pod addresses, and the status the kubelet would report.

Each pod gets its own loopback address (127.x.y.z) as pod IP, and the host's network otherwise:
whatever a pod serves is reachable only on loopback, the workplace's rule for test traffic.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Host directories a container never sees as they are: fresh ones are made for it.
PRIVATE_ROOTS = {"/proc": "--proc", "/dev": "--dev", "/tmp": "--tmpfs", "/run": "--tmpfs", "/sys": None}
TERMINATION_MESSAGE_LIMIT = 4096  # bytes, as the kubelet keeps
FALLBACK_LOG_LINES = 80


class SandboxError(ValueError):
    """A pod that cannot run here; the message is what the pod's status says (reason: message)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# --- Images: which local program stands for an image -----------------------------------------------

@dataclass(frozen=True)
class LocalProgram:
    """A container's image as this machine runs it: `kind` names the stand-in."""

    kind: str                       # "triton" or "rankops"
    argv: tuple[str, ...]           # executable (a host path) and arguments, expanded
    env: Mapping[str, str] = field(default_factory=dict)


def image_repository(image: str) -> str:
    """'nvcr.io/nvidia/tritonserver:24.08-py3' -> 'nvcr.io/nvidia/tritonserver' (tag/digest dropped)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


def image_kind(image: str) -> str | None:
    """'triton' for any tritonserver image, 'rankops' for the rankops image; None for the rest."""
    last = image_repository(image).rsplit("/", 1)[-1]
    if last == "tritonserver":
        return "triton"
    if last == "rankops" or last.startswith("rankops-"):
        return "rankops"
    return None


# --- Environment ---------------------------------------------------------------------------------

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, unknown ones kept, $$ is a $."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _VAR.sub(replace, value)


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str, node_name: str) -> str:
    """A downward-API fieldRef of the pod."""
    meta = pod.get("metadata", {})
    simple = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": node_name,
              "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", "default"),
              "status.podIP": pod_ip, "status.hostIP": pod_ip}
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise SandboxError("CreateContainerConfigError", f"fieldRef {path!r} is not supported by the pod runner")


def container_env(container: Mapping[str, Any], pod: Mapping[str, Any], base: Mapping[str, str],
                  config_maps: Mapping[str, Mapping[str, str]], secrets: Mapping[str, Mapping[str, str]],
                  pod_ip: str, node_name: str) -> dict[str, str]:
    """`base` (the image's and the pod's defaults), then envFrom, then env, in the kubelet's order.

    `config_maps` / `secrets`: name -> data (decoded). A missing required source is a
    CreateContainerConfigError, as on a real node.
    """
    env = dict(base)
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef") or source.get("configMapRef")
        store, kind = (secrets, "secret") if "secretRef" in source else (config_maps, "configmap")
        data = store.get(ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise SandboxError("CreateContainerConfigError", f'{kind} "{ref["name"]}" not found')
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        if "valueFrom" not in item:
            env[item["name"]] = expand(item.get("value", ""), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, node_name)
            continue
        ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
        if ref is None:
            raise SandboxError("CreateContainerConfigError",
                               f"env {item['name']}: only value, fieldRef, secretKeyRef and configMapKeyRef are supported")
        store, kind = (secrets, "secret") if "secretKeyRef" in source else (config_maps, "configmap")
        data = store.get(ref["name"])
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                continue
            missing = f'{kind} "{ref["name"]}" not found' if data is None else \
                f"couldn't find key {ref['key']} in {kind} {ref['name']}"
            raise SandboxError("CreateContainerConfigError", missing)
        env[item["name"]] = data[ref["key"]]
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with $(VAR) expanded (the image's entrypoint when no command is given)."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command:
        kind = image_kind(container.get("image", ""))
        command = {"triton": ["tritonserver"], "rankops": ["rankops"]}.get(kind or "", [])
    return [expand(part, env) for part in command + args]


# --- Mounts --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BindMount:
    source: Path     # on the host: a directory or a file under the pod's directory, or a hostPath
    target: str      # the container's path
    read_only: bool = False


def volume_mounts(container: Mapping[str, Any], volume_dirs: Mapping[str, Path]) -> list[BindMount]:
    """The container's volumeMounts as bind mounts of the prepared volume directories,
    parents before children (a subPath file inside an emptyDir mount comes after it)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source = volume_dirs.get(mount["name"])
        if source is None:
            raise SandboxError("CreateContainerConfigError", f"volumeMount {mount['name']!r} names no volume of the pod")
        if mount.get("subPath"):
            sub = Path(mount["subPath"])
            if sub.is_absolute() or ".." in sub.parts:
                raise SandboxError("CreateContainerConfigError", f"subPath {mount['subPath']!r} must be relative, no '..'")
            source = source / sub
        mounts.append(BindMount(source, mount["mountPath"], bool(mount.get("readOnly"))))
    return sorted(mounts, key=lambda m: len(Path(m.target).parts))


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def host_target(target: str, host_root: Path = Path("/")) -> str:
    """A container path with the host's symlinks in its existing prefix resolved (/var/run/x ->
    /run/x), so mount points are made where the sandbox will really look for them."""
    parts = Path(target).parts[1:]
    resolved = Path("/")
    for index, part in enumerate(parts):
        candidate = resolved / part
        on_host = host_root / candidate.relative_to("/")
        if on_host.is_symlink():
            link = os.readlink(on_host)
            resolved = Path(os.path.normpath(candidate.parent / link)) if not link.startswith("/") else Path(link)
            continue
        if not on_host.exists():
            return str(resolved.joinpath(*parts[index:]))
        resolved = candidate
    return str(resolved)


def root_binds(targets: Iterable[str], host_root: Path = Path("/")) -> list[str]:
    """bwrap arguments that show the host's root read-only, leaving room for `targets`.

    bwrap starts from an empty root: a host directory with no mount under it is bound whole; one
    with a mount under it is made as a directory and its entries bound one by one (a read-only
    bind could not take the new mount point); symlinks stay symlinks. /proc, /dev, /tmp and /run
    are the container's own.
    """
    targets = sorted(set(targets))
    args: list[str] = []

    def walk(directory: Path) -> None:
        for entry in sorted(os.listdir(host_root / directory.relative_to("/"))):
            path = directory / entry
            text = str(path)
            on_host = host_root / path.relative_to("/")
            if directory == Path("/") and text in PRIVATE_ROOTS:
                if PRIVATE_ROOTS[text]:
                    args.extend([PRIVATE_ROOTS[text], text])
                continue
            if on_host.is_symlink():
                args.extend(["--symlink", os.readlink(on_host), text])
            elif any(t != text and _under(t, text) for t in targets) and on_host.is_dir():
                args.extend(["--dir", text])
                walk(path)
            elif any(t == text for t in targets):
                continue  # the mount takes this place
            elif on_host.is_dir() or on_host.is_file():
                args.extend(["--ro-bind", str(on_host), text])
    walk(Path("/"))
    return args


def program_mounts(paths: Iterable[Path]) -> list[BindMount]:
    """Read-only binds of the host directories a stand-in program lives in (a virtualenv, the
    Triton fixture) where the container's own /tmp or /run would hide them (a clone in /tmp)."""
    found = []
    for path in sorted({Path(os.path.realpath(p)) for p in paths}):
        if any(_under(str(path), private) for private in PRIVATE_ROOTS) and \
                not any(_under(str(path), str(m.target)) for m in found):
            found.append(BindMount(path, str(path), True))
    return found


def bwrap_argv(program: Sequence[str], mounts: Sequence[BindMount], hosts_file: Path, termination_log: Path,
               termination_path: str, hostname: str, working_dir: str | None = None,
               bwrap: str = "bwrap") -> list[str]:
    """The bwrap command line that runs `program` in the container's mount namespace."""
    resolved = [BindMount(m.source, host_target(m.target), m.read_only) for m in mounts]
    extra = [BindMount(hosts_file, "/etc/hosts"), BindMount(termination_log, host_target(termination_path))]
    args = [bwrap, "--die-with-parent", "--unshare-uts", "--unshare-ipc", "--hostname", hostname[:63],
            *root_binds([m.target for m in resolved] + [m.target for m in extra if m.target != "/etc/hosts"])]
    for mount in resolved + extra:
        args.extend(["--ro-bind" if mount.read_only else "--bind", str(mount.source), mount.target])
    args.extend(["--chdir", working_dir or "/", "--", *program])
    return args


# --- Names ---------------------------------------------------------------------------------------

def hosts_file(pod_name: str, pod_ip: str, namespace: str, services: Mapping[tuple[str, str], Sequence[str]]) -> str:
    """/etc/hosts for a pod: itself, then every Service with Ready loopback endpoints under the
    names cluster DNS would answer (short names only within the pod's namespace)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{pod_ip}\t{pod_name}"]
    for (ns, name), addresses in sorted(services.items()):
        names = [f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}"]
        if ns == namespace:
            names.append(name)
        lines.extend(f"{address}\t{' '.join(names)}" for address in addresses)
    return "\n".join(lines) + "\n"


def is_loopback(address: str) -> bool:
    return address.startswith("127.")


def service_addresses(services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
                      ) -> dict[tuple[str, str], list[str]]:
    """(namespace, service) -> the loopback addresses of its Ready pods: the endpoints
    controller's rule, done here because EndpointSlices refuse loopback addresses (and kwok's
    10.x pod IPs are left out: nothing answers there)."""
    ready = []
    for pod in pods:
        status = pod.get("status") or {}
        address = status.get("podIP") or ""
        if is_loopback(address) and not (pod.get("metadata") or {}).get("deletionTimestamp") and any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            ready.append(pod)
    found: dict[tuple[str, str], list[str]] = {}
    for service in services:
        meta, selector = service.get("metadata") or {}, (service.get("spec") or {}).get("selector")
        if not selector:
            continue
        addresses = sorted({p["status"]["podIP"] for p in ready
                            if p["metadata"].get("namespace") == meta.get("namespace")
                            and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())})
        if addresses:
            found[(meta["namespace"], meta["name"])] = addresses
    return found


# --- Status --------------------------------------------------------------------------------------

def termination_message(written: str, log_tail: str, exit_code: int, policy: str | None) -> str:
    """What lands in state.terminated.message: the file, or the log's end on error when asked."""
    message = written[:TERMINATION_MESSAGE_LIMIT]
    if not message.strip() and exit_code != 0 and policy == "FallbackToLogsOnError":
        message = "\n".join(log_tail.splitlines()[-FALLBACK_LOG_LINES:])[-TERMINATION_MESSAGE_LIMIT:]
    return message


def pod_phase(restart_policy: str, init_failed: bool, exits: Sequence[int | None]) -> str:
    """Pending until the containers run; Succeeded/Failed once none will run again."""
    if init_failed and restart_policy == "Never":
        return "Failed"
    if not exits or any(code is None for code in exits):
        return "Running" if exits and not init_failed else "Pending"
    if restart_policy == "Always":
        return "Running"
    if all(code == 0 for code in exits):
        return "Succeeded"
    return "Failed" if restart_policy == "Never" else "Running"


def condition(kind: str, status: bool, now: str, reason: str | None = None,
              previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A pod condition; its lastTransitionTime moves only when its status flips from `previous`."""
    value = "True" if status else "False"
    since = previous["lastTransitionTime"] if previous and previous.get("status") == value else now
    found = {"type": kind, "status": value, "lastTransitionTime": since, "lastProbeTime": None}
    if reason and not status:
        found["reason"] = reason
    return found


def describe(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
