"""Latency vs offered load per GPU for the chosen config and its runners-up, with the SLO line; and
a pack of several models (write_pack_plot): memory per card and each model's P99 alone vs shared.
matplotlib is imported only here, and only when a plot is asked for."""
from __future__ import annotations

from pathlib import Path

from rankops.planner.pack import Pack
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


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'rankops[plot]'") from None
    return plt


def write_plot(result: PlanResult, path: str | Path) -> Path:
    plt = _pyplot()
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


def write_pack_plot(pack: Pack, path: str | Path) -> Path:
    """Left: each server's card memory, stacked by model, against the card. Right: each model's
    predicted P99 alone and on the shared card, against its budget."""
    plt = _pyplot()
    fig, (mem, lat) = plt.subplots(1, 2, figsize=(11, 5))
    labels = [f"cards {s.card_numbers.start}-{s.card_numbers.stop - 1}" if s.cards > 1 else f"card {s.first_card}"
              for s in pack.servers]
    bottoms = [pack.runtime_reserve_mib] * len(pack.servers)
    mem.bar(labels, bottoms, color="lightgrey", label="runtime reserve")
    for i, server in enumerate(pack.servers):
        for model in server.models:
            mem.bar(labels[i], model.memory_mib, bottom=bottoms[i])
            mem.text(i, bottoms[i] + model.memory_mib / 2, model.name, ha="center", va="center", fontsize=7)
            bottoms[i] += model.memory_mib
    mem.axhline(pack.card.memory_mib / (1 + pack.card.margin), color="orange", linestyle=":",
                label=f"{pack.card.name} less {pack.card.margin:.0%} margin")
    mem.axhline(pack.card.memory_mib, color="red", linestyle="--", label=f"{pack.card.name} memory")
    mem.set_ylabel("GPU memory per card (MiB)")
    mem.set_title(f"{pack.gpus} cards packed vs {pack.gpus_one_per_card} one model per card")
    mem.legend(fontsize=7)
    models = [m for s in pack.servers for m in s.models]
    xs = range(len(models))
    lat.bar([x - 0.2 for x in xs], [m.p99_alone_ms for m in models], width=0.4, label="P99 alone")
    lat.bar([x + 0.2 for x in xs], [m.p99_shared_ms for m in models], width=0.4, label="P99 shared")
    lat.scatter(list(xs), [m.p99_budget_ms for m in models], marker="_", s=400, color="red", label="budget")
    lat.set_xticks(list(xs), [m.name for m in models], rotation=30, fontsize=8)
    lat.set_ylabel("predicted P99 at target (ms)")
    lat.legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
