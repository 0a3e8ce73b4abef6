"""Two versions of one model on the same GPU (issue 41): does the incoming version fit beside the one
serving, and can one Triton hold both as versions of one model?

What an in-place version switch is decided on. Memory is per GPU: each version runs its own
instances (instance_group count applies on every GPU of the pod), each instance holds its weights,
GPU embeddings and activations at max batch (planner/memory.py), and the runtime reserve (CUDA
context, Triton, allocator caches) is paid once, since both versions live in one tritonserver. A
margin on top covers what the figures do not (fragmentation, a load's transient buffers).

The spec gives one footprint per model (spec.planning.memory), not per version: the caller passes
each version's figure, and says where it came from.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rankops.planner.memory import _n

# Kept free beyond the sum of the figures while two versions share a GPU.
DEFAULT_MARGIN = 0.10


@dataclass(frozen=True)
class VersionOnGpu:
    """One version as Triton would hold it on a GPU (duck-typed from spec.versions[] by the caller)."""
    name: str
    triton_version: int              # its version directory under the model (render.tritonconfig)
    format: str                      # onnx | tensorrt_plan | torchscript
    precision: str = "fp32"
    per_instance_mib: float | None = None   # weights + GPU embeddings + activations at max batch; None: unknown
    instances: int = 1               # instances per GPU
    engine: str | None = None        # tensorrt_plan: what built the engine ("TensorRT 10.0.1.6", "Triton 24.05")


@dataclass(frozen=True)
class SideBySide:
    fits: bool | None                # None: a figure is missing, nothing can be said about memory
    arithmetic: str                  # the sum, for people
    problems: tuple[str, ...] = ()   # why the two cannot be one model's versions, or do not fit

    @property
    def in_place(self) -> bool:
        """Both can be loaded in one Triton, beside each other, within the GPU and the margin."""
        return self.fits is True and not self.problems


def cannot_share(serving: VersionOnGpu, incoming: VersionOnGpu) -> list[str]:
    """Why one Triton model cannot hold both versions, as far as the spec tells.

    Triton's config.pbtxt is per model, not per version: the platform (format) and ONNX Runtime's
    TensorRT accelerator settings (precision) are shared by every version it loads; two versions
    need two version directories; and one Triton image runs one TensorRT, which a plan file must
    have been built with. The GPU a plan was built for is not in the spec: not checked here."""
    pair = f"{serving.name} and {incoming.name}"
    problems = []
    if serving.triton_version == incoming.triton_version:
        problems.append(f"{pair} are both Triton version {serving.triton_version} (a non-numeric version name "
                        "is served as 1): one model directory cannot hold both")
    if serving.format != incoming.format:
        problems.append(f"{serving.name} is {serving.format} and {incoming.name} {incoming.format}: the backend "
                        "is set per model in config.pbtxt, not per version")
    elif serving.format == "onnx" and serving.precision != incoming.precision:
        problems.append(f"{serving.name} is onnx {serving.precision} and {incoming.name} onnx "
                        f"{incoming.precision}: the TensorRT accelerator's precision is set per model in config.pbtxt")
    if (serving.format == incoming.format == "tensorrt_plan" and serving.engine and incoming.engine
            and serving.engine != incoming.engine):
        problems.append(f"{incoming.name}'s engine was built with {incoming.engine} and {serving.name}'s with "
                        f"{serving.engine}: the serving Triton runs one TensorRT, and a plan loads only on the "
                        "one that built it")
    return problems


def side_by_side(serving: VersionOnGpu, incoming: VersionOnGpu, gpu_mib: float | None,
                 runtime_reserve_mib: float = 0.0, margin: float = DEFAULT_MARGIN) -> SideBySide:
    """The memory arithmetic of `incoming` loaded beside `serving` on one GPU, and every reason the
    two cannot share a Triton model (cannot_share)."""
    problems = cannot_share(serving, incoming)
    unknown = [v.name for v in (serving, incoming) if v.per_instance_mib is None]
    if unknown or gpu_mib is None:
        missing = ([f"the GPU memory of {', '.join(unknown)}"] if unknown else []) + \
                  (["the GPU's size"] if gpu_mib is None else [])
        return SideBySide(None, f"not known: {' and '.join(missing)}", tuple(problems))
    fits, arithmetic = on_one_gpu((serving, incoming), gpu_mib, runtime_reserve_mib, margin)
    if not fits:
        problems.append(f"GPU memory: {arithmetic}")
    return SideBySide(fits, arithmetic, tuple(problems))


def on_one_gpu(holders: Sequence[VersionOnGpu], gpu_mib: float, runtime_reserve_mib: float = 0.0,
               margin: float = DEFAULT_MARGIN) -> tuple[bool, str]:
    """(fits, the sum for people) of every holder's instances in one tritonserver on one GPU: the
    runtime reserve once, then the margin on the whole. Two versions of one model (side_by_side), or
    several models sharing a server (planner/pack.py)."""
    terms = [f"{v.instances} x {_n(v.per_instance_mib)} MiB ({_label(v.name)})" for v in holders]
    used = sum(v.instances * v.per_instance_mib for v in holders) + runtime_reserve_mib
    with_margin = used * (1 + margin)
    fits = with_margin <= gpu_mib
    verdict = (f"fits ({_n(gpu_mib - with_margin)} MiB spare)" if fits else
               f"does not fit ({_n(with_margin - gpu_mib)} MiB short)")
    return fits, (f"{' + '.join(terms)} + {_n(runtime_reserve_mib)} MiB runtime reserve = {_n(used)} MiB, "
                  f"+ {margin:.0%} margin = {_n(with_margin)} MiB of {_n(gpu_mib)} MiB per GPU: {verdict}")


def _label(name: str) -> str:
    return f"v{name}" if name.isdigit() else name
