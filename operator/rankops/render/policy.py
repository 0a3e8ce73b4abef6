"""What a RankingModel may make the operator render, as the cluster admin allows it (pure).

A RankingModel's author is a tenant, not the cluster admin. Two fields reach past the tenant's
namespace: a `file://` modelUri becomes a hostPath mount of the node's files, and the images a
spec names run with the model's GPUs. The admin lists the host directories `file://` may point
into (`rankops run --allow-file-uri-dir DIR`, none by default: `file://` is refused) and,
optionally, the image prefixes specs may use (`--allow-image-prefix`, none: any image).
Every other volume rankops renders is an emptyDir, a ConfigMap or a PersistentVolumeClaim of the
model's own namespace; `pod_volume_problems` checks rendered objects against that.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import urlparse

# Host trees no tenant may mount, nor any directory above them (`/var` holds `/var/run`).
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run",
               "/sbin", "/sys", "/usr", "/var/run", "/var/lib/kubelet", "/var/lib/containers",
               "/var/lib/containerd", "/var/lib/docker", "/var/lib/etcd", "/var/log")
FLAG_FILE_DIR = "--allow-file-uri-dir"
FLAG_IMAGE_PREFIX = "--allow-image-prefix"
FLAG_PLATFORM_UIDS = "--platform-assigns-uids"
FLAG_FETCHER_IMAGE = "--fetcher-image"
FLAG_GATES_IMAGE = "--gates-image"
CHART_FILE_DIRS = "tenantPolicy.allowFileUriDirs"
CHART_IMAGE_PREFIXES = "tenantPolicy.allowImagePrefixes"
VOLUME_SOURCES = ("emptyDir", "configMap", "persistentVolumeClaim")   # hostPath only as allowed


class PolicyError(ValueError):
    """An admin setting or a spec field the policy refuses; the message names it and the fix."""


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def allowed_dir(text: str) -> str:
    """An admin's `--allow-file-uri-dir`, normalised; `/`, system trees and their parents are refused."""
    if not text.startswith("/"):
        raise PolicyError(f"{FLAG_FILE_DIR} {text!r}: give an absolute host directory, e.g. /srv/models")
    path = posixpath.normpath(text)
    path = "/" + path.lstrip("/")   # normpath keeps a leading "//"
    clash = next((s for s in SYSTEM_DIRS if _inside(path, s) or _inside(s, path)), None)
    if clash:
        raise PolicyError(f"{FLAG_FILE_DIR} {text!r}: {path} "
                          f"{'is in' if _inside(path, clash) else 'holds'} the system tree {clash}; "
                          "list a directory that holds only model artifacts, e.g. /srv/models")
    return path


@dataclass(frozen=True)
class TenantPolicy:
    file_uri_dirs: tuple[str, ...] = ()      # normalised by allowed_dir; empty: no file:// at all
    image_prefixes: tuple[str, ...] = ()     # empty: any image
    # The platform gives each pod its UID and fsGroup (OpenShift's restricted-v2 SCC: from the
    # namespace's range, refusing any other): Triton pods then name none of their own.
    platform_assigns_uids: bool = False
    # The cluster's own fetcher and gates images (`rankops run --fetcher-image/--gates-image`, chart
    # values with digests): when set, every model runs these instead of its spec's.
    fetcher_image: str | None = None
    gates_image: str | None = None
    # Where the operator runs: its pods read Triton's metrics port through a model's NetworkPolicy.
    operator_namespace: str = "rankops-system"

    @classmethod
    def from_settings(cls, file_uri_dirs: Iterable[str] = (), image_prefixes: Iterable[str] = (),
                      platform_assigns_uids: bool = False, fetcher_image: str | None = None,
                      gates_image: str | None = None, operator_namespace: str = "rankops-system") -> TenantPolicy:
        """From the admin's flags; PolicyError names a bad one."""
        import re

        from rankops.api import bounds

        prefixes = tuple(p.strip() for p in image_prefixes)
        empty = [p for p in prefixes if not p]
        if empty:
            raise PolicyError(f"{FLAG_IMAGE_PREFIX}: an empty prefix would allow every image; leave the flag out")
        for flag, image in ((FLAG_FETCHER_IMAGE, fetcher_image), (FLAG_GATES_IMAGE, gates_image)):
            if image and (len(image) > bounds.IMAGE_REFERENCE_MAX or not re.match(bounds.IMAGE_REFERENCE, image)):
                raise PolicyError(f"{flag} {image!r} is not an image reference (registry/repository[:tag][@sha256:...])")
        return cls(tuple(dict.fromkeys(allowed_dir(d) for d in file_uri_dirs)), prefixes, platform_assigns_uids,
                   fetcher_image or None, gates_image or None, operator_namespace)

    def fetcher(self, spec: Any) -> str:
        """The image of the fetch-model and warm containers: the cluster's, else the spec's."""
        return self.fetcher_image or spec.fetcher_image

    def gates(self, spec: Any) -> str:
        """The image of the gate Jobs: the cluster's, else the spec's."""
        return self.gates_image or spec.rollout.gate_jobs.image

    def host_path(self, uri: str) -> str:
        """The host directory a `file://` URI may mount, normalised; PolicyError when refused."""
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            raise PolicyError(f"{uri!r} is not a file:// URI")
        if parsed.netloc or parsed.params or parsed.query or parsed.fragment:
            raise PolicyError(f"{uri} names a host, parameters, a query or a fragment: write file:///DIR")
        path = "/" + posixpath.normpath(parsed.path).lstrip("/")
        allowed = next((d for d in self.file_uri_dirs if _inside(path, d)), None)
        if allowed is None:
            where = (f"under {', '.join(self.file_uri_dirs)}" if self.file_uri_dirs
                     else "nowhere: file:// is off on this cluster")
            raise PolicyError(
                f"{uri} would mount the node's {path}; file:// may point {where}. Use pvc://, s3://, gs:// "
                f"or https://, or ask the cluster admin to allow a model directory ({FLAG_FILE_DIR}, "
                f"chart value {CHART_FILE_DIRS})")
        return path

    def image_allowed(self, image: str) -> bool:
        if not self.image_prefixes:
            return True
        full = normalise_image(image)
        return any(_prefix_matches(full, p) or _prefix_matches(image, p) for p in self.image_prefixes)


def _prefix_matches(image: str, prefix: str) -> bool:
    # "nvcr.io/nvidia" allows "nvcr.io/nvidia/tritonserver:24.05-py3", not "nvcr.io/nvidia-evil/x".
    if prefix[-1] in "/:@":
        return image.startswith(prefix)
    return image == prefix or (image.startswith(prefix) and image[len(prefix)] in "/:@")


def normalise_image(image: str) -> str:
    """The image reference with its registry spelled out, as the container runtime reads it
    ("tritonserver:24" is docker.io/library/tritonserver:24)."""
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if sep else f"docker.io/library/{image}"


def spec_problems(spec: Any, policy: TenantPolicy) -> list[str]:
    """Each field of a RankingModelSpec the policy refuses, as "field: why and the fix"."""
    problems = []
    for i, version in enumerate(spec.versions):
        if version.model_uri.startswith("file:"):
            try:
                policy.host_path(version.model_uri)
            except PolicyError as exc:
                problems.append(f"spec.versions[{i}].modelUri: {exc}")
    reference = getattr(spec.rollout.equivalence.reference, "torchscript_uri", None)
    if reference and reference.startswith("file:"):
        try:
            policy.host_path(reference)
        except PolicyError as exc:
            problems.append(f"spec.rollout.equivalence.reference.torchscriptUri: {exc}")
    # An image the cluster sets for every model (fetcher, gates) is the admin's: the spec's is unused.
    return problems + image_problems((("spec.tritonImage", spec.triton_image),
                                      ("spec.fetcherImage", None if policy.fetcher_image else spec.fetcher_image),
                                      ("spec.rollout.gateJobs.image",
                                       None if policy.gates_image else spec.rollout.gate_jobs.image)), policy)


def server_problems(spec: Any, policy: TenantPolicy) -> list[str]:
    """Each field of a SharedServerSpec the policy refuses (its pods' images), as "field: why and the fix"."""
    return image_problems((("spec.tritonImage", spec.triton_image),
                           ("spec.fetcherImage", None if policy.fetcher_image else spec.fetcher_image)), policy)


def image_problems(images: Iterable[tuple[str, str | None]], policy: TenantPolicy) -> list[str]:
    """(field, image) pairs whose image is not from a registry the cluster allows (None: not used)."""
    return [f"{field}: {image} is not from a registry this cluster allows ({', '.join(policy.image_prefixes)}); use "
            f"a mirrored image under one of them (the cluster admin sets {FLAG_IMAGE_PREFIX}, chart value "
            f"{CHART_IMAGE_PREFIXES})" for field, image in images if image is not None and not policy.image_allowed(image)]


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return [spec]
    template = (spec.get("template") or {}).get("spec")
    return [template] if template else []


def pod_volume_problems(objects: Iterable[dict[str, Any]], policy: TenantPolicy) -> list[str]:
    """Volumes of rendered objects outside what rankops renders for a tenant: emptyDir, ConfigMap,
    PersistentVolumeClaim, and hostPath only inside an allowed directory. A backstop: rendering
    already refuses file:// outside them; this fails closed if any path ever renders more."""
    problems = []
    for obj in objects:
        for pod in _pod_specs(obj):
            for volume in pod.get("volumes") or []:
                sources = [k for k in volume if k != "name"]
                host = (volume.get("hostPath") or {}).get("path")
                ok = sources and all(k in VOLUME_SOURCES for k in sources) or (
                    sources == ["hostPath"] and host and any(
                        _inside("/" + posixpath.normpath(host).lstrip("/"), d) for d in policy.file_uri_dirs))
                if not ok:
                    problems.append(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: volume "
                                    f"{volume.get('name')} ({', '.join(sources) or 'no source'}) is not one "
                                    "rankops may give a tenant's pods")
    return problems
