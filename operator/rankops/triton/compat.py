"""Can a node's driver run a Triton image? A pure lookup in triton_releases.json (NVIDIA's release
notes, source named in the file). Only NGC's tritonserver images have a known release; any other
image, or a release not in the table, is `unknown`, never a guess.

Placement and the RankingModel's status use it through triton.image_fit (node affinity on
the validator's integer driver-branch/-minor labels, since Gt/Lt take one integer).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from importlib import resources

NGC_TRITON = re.compile(r"^(?:nvcr\.io/)?nvidia/tritonserver:(\d{2}\.\d{2})(?:[-.].*)?$")


class Verdict(str, Enum):
    COMPATIBLE = "compatible"
    NOT_COMPATIBLE = "not-compatible"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Compatibility:
    verdict: Verdict
    reason: str
    release: str | None = None
    cuda: str | None = None
    tensorrt: str | None = None
    data_center_only: bool = False  # compatible through forward compatibility: data-center GPUs only


@lru_cache(maxsize=1)
def releases() -> dict[str, dict]:
    table = json.loads(resources.files("rankops.triton").joinpath("triton_releases.json").read_text())
    return {entry["release"]: entry for entry in table["releases"]}


def triton_release(image: str) -> str | None:
    """'nvcr.io/nvidia/tritonserver:24.10-py3' -> '24.10'; None for any other image."""
    match = NGC_TRITON.match(image.split("@", 1)[0])
    return match.group(1) if match else None


def _version(text: str) -> tuple[int, ...] | None:
    return tuple(int(p) for p in text.split(".")) if re.fullmatch(r"\d+(\.\d+)*", text or "") else None


def check(image: str, driver_label: str | None) -> Compatibility:
    """Whether a node whose validated driver is `driver_label` (the rankops.io/driver-version
    label, e.g. '535.104.05') can run `image`."""
    release = triton_release(image)
    if release is None:
        return Compatibility(Verdict.UNKNOWN, f"{image!r} is not an NGC tritonserver:<YY.MM> image; its CUDA "
                             "and driver needs are not known to rankops")
    entry = releases().get(release)
    if entry is None:
        return Compatibility(Verdict.UNKNOWN, f"Triton release {release} is not in rankops' table "
                             f"(known: {', '.join(sorted(releases()))})", release)
    facts = dict(release=release, cuda=entry["cuda"], tensorrt=entry["tensorrt"])
    driver = _version(driver_label or "")
    if driver is None:
        return Compatibility(Verdict.UNKNOWN, f"node driver {driver_label!r} is not a validated driver version", **facts)
    needs = f"Triton {release} (CUDA {entry['cuda']}) needs driver R{entry['minDriverBranch']} or later"
    if driver[0] >= entry["minDriverBranch"]:
        return Compatibility(Verdict.COMPATIBLE, f"driver {driver_label} >= R{entry['minDriverBranch']}", **facts)
    for minimum in entry["dataCenterForwardCompatible"]:
        floor = _version(minimum)
        if driver[0] == floor[0] and driver >= floor:
            return Compatibility(Verdict.COMPATIBLE, f"driver {driver_label} is on forward-compatible branch "
                                 f"R{floor[0]} (>= {minimum}): data-center GPUs only", data_center_only=True, **facts)
    branches = ", ".join(f"{m} (R{m.split('.')[0]})" for m in entry["dataCenterForwardCompatible"])
    return Compatibility(Verdict.NOT_COMPATIBLE, f"{needs}, or on data-center GPUs one of {branches}; the node "
                         f"has {driver_label}", **facts)
