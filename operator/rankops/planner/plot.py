"""Latency vs offered load per GPU for the chosen config and its runners-up, with the SLO line.
matplotlib is imported only here, and only when a plot is asked for."""
from __future__ import annotations

from pathlib import Path

from rankops.planner.result import PlanResult
from rankops.planner.search import SEARCH_REQUESTS
from rankops.planner.simulator import BatcherConfig, saturation_qps, simulate

POINTS = 16


def curve(result: PlanResult, config: BatcherConfig) -> list[tuple[float, float, float]]:
    """(per-GPU req/s, P50 ms, P99 ms) from light load to saturation."""
    inputs = result.inputs
    top = saturation_qps(inputs.profile, config, inputs.shared_gpu_slowdown)
    out = []
    for i in range(1, POINTS + 1):
        rate = top * i / POINTS * 0.98
        sim = simulate(inputs.profile, config, rate_qps=rate, requests=SEARCH_REQUESTS, seed=inputs.seed,
                       slowdown=inputs.shared_gpu_slowdown, overhead_ms=inputs.overhead_ms)
        out.append((rate, sim.p50_ms, sim.p99_ms))
    return out


def write_plot(result: PlanResult, path: str | Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'rankops[plot]'") from None
    budget = result.inputs.p99_budget_ms
    configs = [(result.config, "chosen")] + [(c, "runner-up") for c in result.runners_up]
    fig, ax = plt.subplots(figsize=(8, 5))
    for config, role in configs:
        points = curve(result, config)
        xs = [p[0] for p in points]
        line, = ax.plot(xs, [p[2] for p in points], marker="o", markersize=3,
                        linewidth=2.2 if role == "chosen" else 1.2,
                        label=f"P99 {config.describe()} ({role})")
        ax.plot(xs, [p[1] for p in points], linestyle=":", color=line.get_color(), linewidth=1)
    if budget is not None:
        ax.axhline(budget, color="red", linestyle="--", label=f"SLO P99 {budget:g} ms")
        ax.set_ylim(0, budget * 3)
    if result.inputs.target_qps is not None and result.gpus:
        ax.axvline(result.inputs.target_qps / result.gpus, color="grey", linestyle="-.",
                   label=f"target load per GPU ({result.gpus} GPUs)")
    if result.qps_per_gpu:
        ax.axvline(result.qps_per_gpu, color="green", linestyle=":", label="sustainable within SLO")
    ax.set_xlabel("offered load per GPU (req/s)")
    ax.set_ylabel("latency (ms); solid P99, dotted P50")
    ax.set_title("Simulated Triton dynamic batcher: latency vs load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
