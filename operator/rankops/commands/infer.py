"""`rankops infer`: send one ranking request to a served model and print its scores.

The request is made from the RankingModel's own tensors (`-f rankingmodel.yaml`, or the inputs as
JSON): one user's candidates, random features, the candidate count as the batch when candidates
are the batch dimension. What comes back is the model's real answer: the candidates ranked by
score. The quickest check that a model serves, from anywhere its Service name resolves.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

DEFAULT_CANDIDATES = 10


def request_shape(doc: dict[str, Any] | None, inputs_json: str | None, candidates: int | None) -> tuple[list, int]:
    """(the inputs spec, the batch size of the request) from a RankingModel manifest or --inputs-spec."""
    if doc is not None:
        spec = doc.get("spec") or {}
        inputs = spec.get("inputs") or []
        layout = spec.get("candidates") or {}
        if layout.get("layout", "batch") != "batch":
            return inputs, 1  # one user per request, the candidates inside the tensors (maxDims)
        return inputs, int(candidates or layout.get("minPerRequest") or DEFAULT_CANDIDATES)
    return json.loads(inputs_json or "[]"), int(candidates or DEFAULT_CANDIDATES)


def ranked(scores: Any, top: int) -> list[tuple[int, float]]:
    """(candidate index, score), best first."""
    import numpy as np

    values = np.asarray(scores, dtype=float)
    if values.ndim >= 2 and values.shape[0] == 1 and values.shape[1] > 1:
        values = values[0]  # one request carrying the candidates: rank within it
    flat = values.reshape(len(values), -1)[:, 0]
    order = np.argsort(-flat, kind="stable")[:top]
    return [(int(i), float(flat[i])) for i in order]


def cmd_infer(args: argparse.Namespace) -> int:
    from rankops.triton.client import Endpoint, GateClientError
    from rankops.triton.samples import SamplesError, generate_samples, parse_input_spec

    try:
        doc = yaml.safe_load(open(args.filename)) if args.filename else None
        model = args.model or ((doc or {}).get("metadata") or {}).get("name")
        if not model:
            raise SamplesError("--model is required (or -f with a RankingModel manifest)")
        inputs, batch = request_shape(doc, args.inputs_spec, args.candidates)
        sample = generate_samples(parse_input_spec(inputs), 1, [batch], seed=args.seed)[0]
        connection = Endpoint(args.url, model).connect()
        try:
            outputs = connection.infer(connection.build_request(sample, connection.model_info()))
        finally:
            connection.close()
    except (OSError, ValueError, GateClientError) as exc:
        print(f"rankops infer: {exc}", file=sys.stderr)
        return 1
    name = args.output_name or next(iter(outputs))
    if name not in outputs:
        print(f"rankops infer: the model has no output {name!r} (it answered {', '.join(outputs)})", file=sys.stderr)
        return 1
    best = ranked(outputs[name], args.top)
    if args.output == "json":
        print(json.dumps({"model": model, "url": args.url, "candidates": batch, "output": name,
                          "top": [{"candidate": i, "score": s} for i, s in best]}))
        return 0
    print(f"{model} at {args.url}: {batch} candidates scored ({name}); top {len(best)}:")
    for rank, (index, score) in enumerate(best, 1):
        print(f"  {rank:2d}. candidate {index:4d}  score {score:.6f}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("infer", help="send one ranking request to a served model and print the scores")
    p.add_argument("--url", required=True, help="HOST:PORT of Triton's HTTP endpoint, e.g. ctr-ranker.reco.svc:8000")
    p.add_argument("-f", "--filename", help="the RankingModel manifest: the model name and its inputs")
    p.add_argument("--model", help="the model name (default: the manifest's metadata.name)")
    p.add_argument("--inputs-spec", help="the inputs as JSON, as in spec.inputs (without -f)")
    p.add_argument("--candidates", type=int, help="candidates in the request (default: candidates.minPerRequest, or 10)")
    p.add_argument("--output-name", help="the output to rank by (default: the first the model returns)")
    p.add_argument("--top", type=int, default=5, help="how many of the best candidates to print (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random features (default 0)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=cmd_infer)
