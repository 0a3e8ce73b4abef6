"""What a model's Triton image needs of the nodes it lands on, and of its TensorRT engines.

Pure; the facts are triton_compat's (NVIDIA's table, triton_releases.json). Three uses:
- `driver_affinity`: node affinity alternatives that keep pods on nodes whose validated driver
  runs the image (labels rankops.io/driver-branch and -minor, written by the validator);
- `pool_driver_problem`: the Degraded condition when no ready node of the pool can run it;
- `engine_mismatches`: tensorrt_plan versions built for another TensorRT than the image's.
An image whose release is not in the table adds no constraint, and says so (`unknown_note`).
"""
from __future__ import annotations

from typing import Any

from rankops.api.phases import DegradedReason
from rankops.triton import compat as triton_compat
from rankops.nodelabels import LABEL_DRIVER, LABEL_DRIVER_BRANCH, LABEL_DRIVER_MINOR
from rankops.triton.compat import Verdict

MAX_NAMED = 10  # nodes named in a message


def _entry(image: str) -> dict | None:
    release = triton_compat.triton_release(image)
    return triton_compat.releases().get(release) if release else None


def driver_affinity(image: str) -> list[list[dict[str, Any]]] | None:
    """The ways a node's driver can run `image`, each a list of matchExpressions (ANDed; the
    alternatives are ORed as nodeSelectorTerms): branch >= the full-feature branch, or one of the
    forward-compatible branches at or above its minimum. None when the image's needs are unknown."""
    entry = _entry(image)
    if entry is None:
        return None
    floor = entry["minDriverBranch"]
    ways = [[{"key": LABEL_DRIVER_BRANCH, "operator": "Gt", "values": [str(floor - 1)]}]]
    for minimum in entry["dataCenterForwardCompatible"]:
        branch, minor = (int(part) for part in minimum.split("."))
        if branch < floor:   # a branch at or past the floor is already admitted whole
            ways.append([{"key": LABEL_DRIVER_BRANCH, "operator": "In", "values": [str(branch)]},
                         {"key": LABEL_DRIVER_MINOR, "operator": "Gt", "values": [str(minor - 1)]}])
    return ways


def unknown_note(image: str) -> str | None:
    """Why placement does not check drivers for `image`, when it does not."""
    if _entry(image) is not None:
        return None
    return (triton_compat.check(image, None).reason +
            "; pods are not kept off nodes whose driver is too old for it")


def newest_release(drivers: list[str]) -> str | None:
    """The newest Triton release in rankops' table that every one of `drivers` runs."""
    if not drivers:
        return None
    for release in sorted(triton_compat.releases(), reverse=True):
        image = f"nvcr.io/nvidia/tritonserver:{release}-py3"
        if all(triton_compat.check(image, d).verdict is Verdict.COMPATIBLE for d in drivers):
            return release
    return None


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def pool_driver_problem(image: str, pool: str, ready_nodes: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when none of the pool's ready nodes can run `image` (its pods would stay
    Pending); None when one can, when there is no ready node (another condition says so), or when
    the image's needs are unknown."""
    entry = _entry(image)
    if entry is None or not ready_nodes:
        return None
    refused = []
    for node in sorted(ready_nodes, key=lambda n: (n.get("metadata") or {}).get("name", "")):
        labels, name = _labels(node), (node.get("metadata") or {}).get("name", "?")
        driver = labels.get(LABEL_DRIVER)
        verdict = triton_compat.check(image, driver)
        if verdict.verdict is Verdict.COMPATIBLE and LABEL_DRIVER_BRANCH in labels:
            return None
        if verdict.verdict is Verdict.COMPATIBLE:
            refused.append(f"{name} ({driver}, but no {LABEL_DRIVER_BRANCH} label: its validator predates "
                           "it; upgrade the operator's validator image)")
        else:
            refused.append(f"{name} has {driver or 'no validated driver'}")
    release, floor = entry["release"], entry["minDriverBranch"]
    forward = ", ".join(f"{m} (or later R{m.split('.')[0]})" for m in entry["dataCenterForwardCompatible"])
    drivers = [d for d in (_labels(n).get(LABEL_DRIVER) for n in ready_nodes) if d]
    runnable = sorted({r for d in drivers if (r := newest_release([d]))}, reverse=True)
    older = (f"the newest these drivers run is nvcr.io/nvidia/tritonserver:{runnable[0]}-py3" if runnable
             else "no release in rankops' table runs on these drivers")
    more = len(refused) - MAX_NAMED
    named = "; ".join(refused[:MAX_NAMED]) + (f"; and {more} more" if more > 0 else "")
    message = (f"spec.tritonImage {image} (Triton {release}, CUDA {entry['cuda']}) needs NVIDIA driver "
               f"R{floor} or later" + (f", or on data-center GPUs {forward}" if forward else "") +
               f"; no ready node of GpuNodePool {pool} has one: {named}. Its pods stay Pending. Fix: pick an "
               f"older Triton image in spec.tritonImage ({older}), or upgrade the nodes' driver to R{floor} or "
               f"later (RHEL 8: dnf -y module switch-to nvidia-driver:{floor}-dkms --allowerasing, then reboot)")
    return DegradedReason.DRIVER_TOO_OLD, message


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def engine_mismatches(spec: Any) -> tuple[list[str], list[str]]:
    """(mismatches, notes) for the spec's tensorrt_plan versions: a mismatch when the version
    declares the TensorRT (tensorrtVersion) or Triton release (builtWithTriton) that built its
    engine and the image's differs; a note when it cannot be told (undeclared, or the image's
    TensorRT unknown to rankops)."""
    image = spec.triton_image
    release = triton_compat.triton_release(image)
    entry = triton_compat.releases().get(release) if release else None
    image_trt = (entry or {}).get("tensorrt")
    mismatches, notes = [], []
    for i, version in enumerate(spec.versions):
        if version.format.value != "tensorrt_plan":
            continue
        where = f"spec.versions[{i}] ({version.name})"
        fix = (f"rebuild the engine with trtexec inside {image}, or serve the ONNX model (format: onnx) "
               "and let Triton build the engine on the node")
        built_trt, built_release = version.tensorrt_version, version.built_with_triton
        if built_release and release and built_release == release:
            continue
        if built_release and not built_trt:
            built_trt = (triton_compat.releases().get(built_release) or {}).get("tensorrt")
            if built_trt is None and release:
                notes.append(f"{where}: built with Triton {built_release}, served by {release}; rankops does not "
                             "know both releases' TensorRT, so it cannot tell whether the engine loads")
                continue
        if not built_trt:
            if not built_release:
                notes.append(f"{where}: a tensorrt_plan engine loads only on the TensorRT that built it; declare "
                             "tensorrtVersion (or builtWithTriton) so rankops can check it against the image")
            continue
        if image_trt is None:
            notes.append(f"{where}: built with TensorRT {built_trt}; the TensorRT of {image} is not known to "
                         "rankops, so the engine is not checked")
            continue
        common = min(len(_version(built_trt)), len(_version(image_trt)))
        if _version(built_trt)[:common] != _version(image_trt)[:common]:
            built = f"TensorRT {built_trt}" + (f" (Triton {built_release})" if built_release else "")
            mismatches.append(f"{where} is a TensorRT engine built with {built}, but spec.tritonImage {image} "
                              f"runs TensorRT {image_trt}: Triton would refuse to load it. Fix: {fix}, or set "
                              f"spec.tritonImage to the Triton release that built it")
    return mismatches, notes
