"""GPUs for N typical ranking models packed on shared cards vs one model per card (issue 42).

    .venv/bin/python benchmarks/pack_bench.py [--n 3 5 10]

Stand-ins for a ranking stage (the second seed, §1.1 and §2.1): a coarse ranker (cheap, many
candidates), a fine ranker (the seeds' FP16 model: 2 ms alone, batch 8 in 3 ms; 1 GB weights, 2 GB
GPU embeddings, ~500 MB activations at batch 32) and a multi-objective re-ranker (1.5 GB model, 4 GB
activations at batch 32). Each is small at its QPS (a fraction of a card) and set to one instance
per card (spec.instancesPerGpu: 1, what a user sets at low QPS). Model i repeats the three kinds with
25% more QPS every round. Cards: T4 16 GB, A10 24 GB, A100 40 GB; runtime reserve 1 GiB per card,
10% margin. "today" is each model's own plan (headroom 0.5, failureTolerance 1: a spare card per
model); the goal is <= 40% of it for 3+ small models.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from rankops.planner import LatencyProfile, MemoryNeeds, PlanInputs  # noqa: E402
from rankops.planner.pack import Card, ModelToPack, PackError, pack  # noqa: E402

GOAL = 0.40
KINDS = {  # profile (compute ms per batch), P99 budget ms, target QPS, memory per instance
    "coarse": (LatencyProfile.from_mapping({1: 0.8, 8: 1.0, 32: 1.6, 64: 2.6}), 15.0, 400.0,
               MemoryNeeds(weights_mib=300, activation_mib_per_item=2, runtime_reserve_mib=1024)),
    "fine": (LatencyProfile.from_mapping({1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}), 10.0, 250.0,
             MemoryNeeds(weights_mib=1024, gpu_embeddings_mib=2048, activation_mib_per_item=16,
                         runtime_reserve_mib=1024)),
    "rerank": (LatencyProfile.from_mapping({1: 3.0, 4: 3.6, 8: 4.8, 16: 7.5}), 20.0, 120.0,
               MemoryNeeds(weights_mib=1536, activation_mib_per_item=128, runtime_reserve_mib=1024)),
}
CARDS = {"T4 16 GB": 15360, "A10 24 GB": 23028, "A100 40 GB": 40960}


def models(n: int) -> list[ModelToPack]:
    out = []
    for i in range(n):
        kind = list(KINDS)[i % 3]
        profile, p99, qps, memory = KINDS[kind]
        out.append(ModelToPack(f"{kind}-{i + 1}", PlanInputs(
            profile=profile, p99_budget_ms=p99, target_qps=qps * (1 + 0.25 * (i // 3)), memory=memory,
            instances_per_gpu=1)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[3, 5, 10])
    args = parser.parse_args()
    print(f"{'card':<11} {'N':>3} {'packed':>6} {'today':>6} {'ratio':>6}  goal <= {GOAL:.0%}  "
          f"{'servers (cards: models)':<40} worst P99 shared/budget  time")
    for card_name, mib in CARDS.items():
        for n in args.n:
            start = time.perf_counter()
            try:
                result = pack(models(n), Card(mib, name=card_name.split()[0]))
            except PackError as exc:
                print(f"{card_name:<11} {n:>3} refused: {exc}")
                continue
            ratio = result.gpus / result.gpus_one_per_card
            layout = "; ".join(f"{s.cards}: {'+'.join(m.name for m in s.models)}" for s in result.servers)
            worst = max(m.p99_shared_ms / m.p99_budget_ms for s in result.servers for m in s.models)
            print(f"{card_name:<11} {n:>3} {result.gpus:>6} {result.gpus_one_per_card:>6} {ratio:>6.0%}  "
                  f"{'met' if ratio <= GOAL else 'NOT met':<14} {layout:<40} {worst:.0%}  "
                  f"{time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
