"""GPU memory budget: every instance holds its own weights, GPU embeddings and activations at max
batch; the CUDA context / Triton / allocator reserve is paid once per GPU."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryNeeds:
    weights_mib: float = 0.0
    gpu_embeddings_mib: float = 0.0
    activation_mib_per_item: float = 0.0
    runtime_reserve_mib: float = 0.0

    def per_instance_mib(self, max_batch_size: int) -> float:
        return self.weights_mib + self.gpu_embeddings_mib + self.activation_mib_per_item * max_batch_size

    def per_gpu_mib(self, max_batch_size: int, instances: int) -> float:
        return instances * self.per_instance_mib(max_batch_size) + self.runtime_reserve_mib

    def arithmetic(self, max_batch_size: int, instances: int) -> str:
        per = self.per_instance_mib(max_batch_size)
        return (f"{instances} instance(s) x (weights {_n(self.weights_mib)} + GPU embeddings "
                f"{_n(self.gpu_embeddings_mib)} + activations {_n(self.activation_mib_per_item)} x batch "
                f"{max_batch_size} = {_n(per)} MiB) + runtime reserve {_n(self.runtime_reserve_mib)} = "
                f"{_n(self.per_gpu_mib(max_batch_size, instances))} MiB")


def oom_problem(needs: MemoryNeeds | None, gpu_mib: float | None, max_batch_size: int, instances: int) -> str | None:
    """The refusal message with the arithmetic, or None when it fits (or nothing is known)."""
    if needs is None or gpu_mib is None:
        return None
    total = needs.per_gpu_mib(max_batch_size, instances)
    if total <= gpu_mib:
        return None
    fit = max_instances(needs, gpu_mib, max_batch_size)
    hint = (f"at most {fit} instance(s) fit at this batch size" if fit else
            "not even one instance fits: use a smaller maxBatchSize, a GPU with more memory, or keep "
            "embedding tables off the GPU (CPU memory / feature service)")
    return (f"GPU memory: {needs.arithmetic(max_batch_size, instances)} > {_n(gpu_mib)} MiB on the GPU "
            f"({_n(total - gpu_mib)} MiB short); {hint}")


def max_instances(needs: MemoryNeeds, gpu_mib: float, max_batch_size: int) -> int:
    per = needs.per_instance_mib(max_batch_size)
    room = gpu_mib - needs.runtime_reserve_mib
    if per <= 0:
        return 1_000_000 if room >= 0 else 0
    return max(0, int(room // per))


def _n(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
