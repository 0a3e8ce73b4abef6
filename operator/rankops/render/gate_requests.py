"""The requests the gates and the warm container send: recorded ones from a ConfigMap, or generated
from the input spec in the shapes production sends (one place, so both warm what is judged)."""
from __future__ import annotations

import json

from rankops.api.rankingmodel import CandidateLayout, RankingModelSpec, SamplesSource

SAMPLES_DIR = "/samples"
# With candidates as the batch dimension, generated requests spread their candidate counts over
# this many evenly spaced values of candidates.minPerRequest..maxPerRequest.
CANDIDATE_COUNTS = 8
# Warmup replays generated requests round-robin and its latency depends on the batch shape, not
# the values: two per batch size suffice.
WARMUP_SAMPLES_PER_BATCH_SIZE = 2


def batch_sizes(spec: RankingModelSpec) -> list[int]:
    """Batch sizes of the generated requests: the shapes production sends.

    Candidates as the batch dimension: one request per user, its batch the candidate count, so
    counts spread over minPerRequest..maxPerRequest. Otherwise a batch is of requests: 1, the
    warmup sizes and the preferred ones.
    """
    if spec.candidates is not None and spec.candidates.layout is CandidateLayout.batch:
        low, high = spec.candidates.min_per_request, spec.candidates.max_per_request
        return sorted({round(low + (high - low) * i / (CANDIDATE_COUNTS - 1)) for i in range(CANDIDATE_COUNTS)})
    return sorted({1, *spec.model_warmup.batch_sizes,
                   *(spec.batching.preferred_batch_sizes if not isinstance(spec.batching, str) else [])})


def warmup_sample_count(spec: RankingModelSpec, requests: int) -> int:
    return min(requests, WARMUP_SAMPLES_PER_BATCH_SIZE * len(batch_sizes(spec)))


def generate_args(spec: RankingModelSpec, count: int) -> list[str]:
    inputs = [t.to_wire() for t in spec.inputs]
    return ["--generate-samples", str(count), "--inputs-spec", json.dumps(inputs, separators=(",", ":")),
            "--batch-sizes", ",".join(map(str, batch_sizes(spec)))]


def samples_args(spec: RankingModelSpec, source: SamplesSource, count: int,
                 optional: bool = False) -> tuple[list[str], list, list]:
    """Arguments, volumes and mounts for recorded samples, or for `count` requests generated from the inputs.
    `optional`: the ConfigMap may be missing (the pod still starts; the command falls back to generation)."""
    if source.config_map:
        volume = {"name": "samples", "configMap": {"name": source.config_map, **({"optional": True} if optional else {})}}
        mount = {"name": "samples", "mountPath": SAMPLES_DIR, "readOnly": True}
        fallback = generate_args(spec, count) if optional else []
        return ["--samples", f"{SAMPLES_DIR}/{source.key}", *fallback], [volume], [mount]
    return generate_args(spec, count), [], []
