"""Render Triton's config.pbtxt for one version of a RankingModel (pure)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import jinja2

from rankops.api.rankingmodel import Batching, ModelFormat, ModelVersion, Precision, RankingModelSpec

if TYPE_CHECKING:   # the planner pulls in numpy; rendering needs only the policy's fields
    from rankops.planner.overload import QueuePolicy

PLATFORMS = {
    ModelFormat.onnx: "onnxruntime_onnx",
    ModelFormat.tensorrt_plan: "tensorrt_plan",
    ModelFormat.torchscript: "pytorch_libtorch",
}
# File Triton loads from the version directory, by format (Triton's default_model_filename).
MODEL_FILENAMES = {
    ModelFormat.onnx: "model.onnx",
    ModelFormat.tensorrt_plan: "model.plan",
    ModelFormat.torchscript: "model.pt",
}
TRT_ENGINE_CACHE = "/tmp/trt-engine-cache"
# Triton's request priorities (1 is the highest): live traffic gets the default, PRIORITY_LIVE; the
# gates, the warm container and any replay send PRIORITY_BACKGROUND, which is never shed and is
# served only when no live request waits.
PRIORITY_LIVE = 1
PRIORITY_BACKGROUND = 2


@dataclass(frozen=True)
class ServingShape:
    """The batching and instance settings a version is served with (explicit or planned)."""
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_microseconds: int
    instances_per_gpu: int
    queue_policy: QueuePolicy | None = None   # dynamic_batching.default_queue_policy (slo.overload)

    @classmethod
    def explicit(cls, batching: Batching, instances_per_gpu: int,
                 queue_policy: QueuePolicy | None = None) -> "ServingShape":
        return cls(batching.max_batch_size, tuple(batching.preferred_batch_sizes),
                   batching.max_queue_delay_microseconds, instances_per_gpu, queue_policy)


def triton_version(version_name: str) -> int:
    """Triton needs a numeric version directory; numeric names keep theirs, others serve as 1."""
    return int(version_name) if version_name.isdigit() and int(version_name) > 0 else 1


def tensorrt_parameters(version: ModelVersion) -> dict[str, str]:
    """ONNX Runtime's TensorRT accelerator settings; empty when the version runs plain ONNX Runtime."""
    if version.format is not ModelFormat.onnx or version.precision is Precision.fp32:
        return {}
    return {
        "precision_mode": version.precision.value.upper(),
        "max_workspace_size_bytes": str(1 << 30),
        # Engines are built at load; caching them keeps restarts of the same pod from rebuilding.
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": TRT_ENGINE_CACHE,
    }


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("rankops.render", "templates"),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )
    return env.get_template("config.pbtxt.j2")


def _tensor_view(tensor) -> dict:
    return {"name": tensor.name, "data_type": tensor.data_type.value, "dims": tensor.dims,
            "warmup_dims": tensor.warmup_dims()}


def render_config_pbtxt(name: str, namespace: str, spec: RankingModelSpec, version: ModelVersion,
                        shape: ServingShape) -> str:
    """The config that serves `version`: its version_policy loads exactly that version."""
    return _render(name, namespace, spec, version, shape, pin_version=True)


def version_free_config(name: str, namespace: str, spec: RankingModelSpec, version: ModelVersion,
                        shape: ServingShape) -> str:
    """render_config_pbtxt less the lines naming the version (the header's, version_policy): the
    same text for every version of `version`'s format and precision. A track that switches
    versions in place rolls its pods on this text's hash: a batching change restarts them, a
    version switch does not."""
    return _render(name, namespace, spec, version, shape, pin_version=False)


def _render(name: str, namespace: str, spec: RankingModelSpec, version: ModelVersion, shape: ServingShape,
            pin_version: bool) -> str:
    warm_sizes = sorted({b for b in spec.model_warmup.batch_sizes if b <= shape.max_batch_size})
    return _template().render(
        name=name, namespace=namespace, version=version.name if pin_version else None,
        platform=PLATFORMS[version.format],
        triton_version=triton_version(version.name) if pin_version else None,
        max_batch_size=shape.max_batch_size,
        inputs=[_tensor_view(t) for t in spec.inputs],
        outputs=[_tensor_view(t) for t in spec.outputs],
        instances_per_gpu=shape.instances_per_gpu,
        # Always a batcher, maxBatchSize 1 too (batches of one, sent at once: no delay can fill them):
        # the priority levels that keep gates and warm-up behind live traffic, and a queue policy,
        # live only in dynamic_batching; without it a gate's replay takes the instance in proportion
        # to its requests in flight (measured: live P99 345 ms and more, against 34-39 ms with levels).
        dynamic_batching=True,
        preferred_batch_sizes=list(shape.preferred_batch_sizes),
        max_queue_delay_microseconds=shape.max_queue_delay_microseconds if shape.max_batch_size > 1 else 0,
        priority_live=PRIORITY_LIVE, priority_background=PRIORITY_BACKGROUND,
        queue_policy=shape.queue_policy,
        tensorrt=tensorrt_parameters(version),
        warmups=[{"batch_size": b} for b in warm_sizes],
        response_cache=spec.response_cache,
    )
