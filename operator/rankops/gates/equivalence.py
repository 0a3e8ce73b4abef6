"""The output-equivalence gate: the same requests through the reference and the candidate.

Scores are compared element-wise: a score is within tolerance when
`|candidate - reference| <= absTolerance + relTolerance * |reference|` (numpy.isclose's rule),
and max abs / rel errors are reported per output. Ranking agreement is judged on the ranked
output (`--output`, default the candidate's first): each request's scores are one ranked list
per batch row (trailing size-1 dims ignored; a 1-D output is one list), and per list the gate
computes the top-K overlap and a rank correlation (Kendall tau-b or Spearman), averaged over
lists. It passes when every score is within tolerance and both averages reach their minimums.

The reference is another server's model (the stable version) or the original TorchScript file,
run here on the CPU with torch (imported only then).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from rankops.triton.client import (BINARY_HINT, Endpoint, InferenceFailed, InputsMismatch, ModelNotReady,
                                  ServerUnreachable, rejects_binary_data)
from rankops.triton.samples import Sample, SamplesError
from rankops.gates.verdict import Verdict, error_verdict
from rankops.progress import Progress

GATE = "equivalence"
WORST_KEPT = 3
METHODS = ("kendall", "spearman")
_REL_FLOOR = 1e-12   # keeps relative error finite where the reference score is 0


@dataclass(frozen=True)
class Criteria:
    abs_tolerance: float
    rel_tolerance: float
    top_k: int
    min_topk_overlap: float
    min_rank_correlation: float
    method: str = "kendall"

    def problem(self) -> str | None:
        if self.abs_tolerance < 0 or self.rel_tolerance < 0:
            return "--abs-tolerance and --rel-tolerance must be 0 or more"
        if self.top_k < 1:
            return f"--top-k must be at least 1, got {self.top_k}"
        if not 0 <= self.min_topk_overlap <= 1:
            return f"--min-topk-overlap must be within [0, 1], got {self.min_topk_overlap}"
        if not -1 <= self.min_rank_correlation <= 1:
            return f"--min-rank-correlation must be within [-1, 1], got {self.min_rank_correlation}"
        if self.method not in METHODS:
            return f"--rank-correlation-method must be one of {', '.join(METHODS)}, got {self.method!r}"
        return None


Outputs = dict[str, np.ndarray]


# --- Running the two sides ----------------------------------------------------------------

class SideFailed(Exception):
    """One side could not produce outputs; `reason` is the verdict reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def server_outputs(endpoint: Endpoint, samples: Sequence[Sample], role: str) -> tuple[list[Outputs], list[str]]:
    """Outputs of every sample from a v2 server, and the model's declared output order."""
    try:
        connection = endpoint.connect()
        try:
            info = connection.model_info()
            requests = [connection.build_request(s, info) for s in samples]
            results = []
            for request in requests:
                try:
                    results.append(connection.infer(request))
                except InferenceFailed as exc:
                    if not results and rejects_binary_data(endpoint, request.sample, info):
                        raise SideFailed("BinaryDataUnsupported", f"{role} {endpoint.describe()}: {BINARY_HINT}") from None
                    raise SideFailed(f"{role.capitalize()}RequestFailed",
                                     f"the {role} {endpoint.describe()} failed sample "
                                     f"{request.sample.line}: {exc}") from None
        finally:
            connection.close()
    except ServerUnreachable as exc:
        raise SideFailed("ServerUnreachable", f"{role}: {exc}") from None
    except ModelNotReady as exc:
        raise SideFailed("ModelNotReady", f"{role}: {exc}") from None
    except InputsMismatch as exc:
        raise SideFailed(f"{role.capitalize()}InputsMismatch", str(exc)) from None
    order = info.outputs or (list(results[0]) if results else [])
    return results, order


def torchscript_outputs(path: str, samples: Sequence[Sample], ranked: str,
                        output_names: Sequence[str]) -> list[Outputs]:
    """Run the original TorchScript model on the CPU; outputs named after the candidate's.

    A single tensor is the `ranked` output; a tuple maps to `output_names` (the candidate's
    declared outputs) in order; a dict keeps its keys. Inputs are passed by the names of the module's forward() arguments.
    """
    try:
        import torch
    except ImportError:
        raise SideFailed("TorchUnavailable", "--reference-torchscript needs torch; install rankops[torch] "
                         "or use the gate image that ships it") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # torch deprecates TorchScript; still what users ship
            module = torch.jit.load(path, map_location="cpu").eval()
    except Exception as exc:  # torch raises RuntimeError/ValueError/OSError variously
        raise SideFailed("ReferenceUnloadable", f"cannot load TorchScript {path}: {_short(exc)}") from None
    arg_names = [a.name for a in module.forward.schema.arguments][1:]  # drop self
    results = []
    for sample in samples:
        missing = [n for n in arg_names if n not in sample.inputs]
        if missing or len(arg_names) != len(sample.inputs):
            raise SideFailed("ReferenceInputsMismatch",
                             f"TorchScript forward({', '.join(arg_names)}) does not match sample "
                             f"{sample.line}'s inputs {sorted(sample.inputs)}")
        try:
            with torch.no_grad():
                out = module(*[torch.from_numpy(np.ascontiguousarray(sample.inputs[n])) for n in arg_names])
        except Exception as exc:
            raise SideFailed("ReferenceRequestFailed",
                             f"TorchScript reference failed sample {sample.line}: {_short(exc)}") from None
        results.append(_name_torch_outputs(out, ranked, output_names))
    return results


def _name_torch_outputs(out, ranked: str, output_names: Sequence[str]) -> Outputs:
    if isinstance(out, dict):
        return {str(k): v.detach().numpy() for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        if len(out) > len(output_names):
            raise SideFailed("ReferenceOutputsMismatch",
                             f"TorchScript returned {len(out)} tensors; the candidate declares "
                             f"outputs {list(output_names)}")
        return {name: t.detach().numpy() for name, t in zip(output_names, out)}
    return {ranked: out.detach().numpy()}


# --- Comparing (pure) ---------------------------------------------------------------------

def ranked_lists(scores: np.ndarray) -> np.ndarray:
    """Scores as rows of one ranked list each: [B, N] -> B lists; [N] or [N, 1] -> one list."""
    array = np.asarray(scores, dtype=np.float64)
    while array.ndim > 1 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim == 0:
        return array.reshape(1, 1)
    if array.ndim == 1:
        return array.reshape(1, -1)
    return array.reshape(-1, array.shape[-1])


def topk_overlap(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    k = min(k, len(reference))
    top_ref = np.argsort(-reference, kind="stable")[:k]
    top_cand = np.argsort(-candidate, kind="stable")[:k]
    return len(np.intersect1d(top_ref, top_cand)) / k


def kendall_tau_b(x: np.ndarray, y: np.ndarray, block: int = 256) -> float | None:
    """Kendall's tau-b (tie-corrected), O(n^2) in blocks of rows to bound memory."""
    n = len(x)
    if n < 2:
        return None
    concordance = pairs_x = pairs_y = 0.0
    for start in range(0, n, block):
        stop = min(start + block, n)
        dx = np.sign(x[start:stop, None] - x[None, :])
        dy = np.sign(y[start:stop, None] - y[None, :])
        upper = np.arange(start, stop)[:, None] < np.arange(n)[None, :]   # each pair once
        concordance += float((dx * dy)[upper].sum())
        pairs_x += float(np.count_nonzero(dx[upper]))
        pairs_y += float(np.count_nonzero(dy[upper]))
    if pairs_x == 0 or pairs_y == 0:
        return _constant_case(pairs_x, pairs_y)
    return concordance / math.sqrt(pairs_x * pairs_y)


def spearman_rho(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 2:
        return None
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    sx, sy = float(np.sqrt((rx * rx).sum())), float(np.sqrt((ry * ry).sum()))
    if sx == 0 or sy == 0:
        return _constant_case(sx, sy)
    return float((rx * ry).sum() / (sx * sy))


def _constant_case(spread_x: float, spread_y: float) -> float:
    # All scores tied on one side: the orderings agree only if the other side is tied too.
    return 1.0 if spread_x == spread_y == 0 else 0.0


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


CORRELATIONS: dict[str, Callable[[np.ndarray, np.ndarray], float | None]] = {
    "kendall": kendall_tau_b, "spearman": spearman_rho}


@dataclass
class _ErrorStats:
    max_abs: float = 0.0
    max_rel: float = 0.0
    allowance_used: float = 0.0   # max |c - r| / (abs + rel*|r|): within tolerance while <= 1
    out_of_tolerance: int = 0
    elements: int = 0

    def add(self, reference: np.ndarray, candidate: np.ndarray, criteria: Criteria) -> float:
        ref = np.asarray(reference, dtype=np.float64)
        diff = np.abs(np.asarray(candidate, dtype=np.float64) - ref)
        bound = criteria.abs_tolerance + criteria.rel_tolerance * np.abs(ref)
        worst = float(diff.max()) if diff.size else 0.0
        self.max_abs = max(self.max_abs, worst)
        if diff.size:
            self.max_rel = max(self.max_rel, float((diff / np.maximum(np.abs(ref), _REL_FLOOR)).max()))
            with np.errstate(divide="ignore", invalid="ignore"):
                used = np.where(diff == 0, 0.0, diff / np.maximum(bound, _REL_FLOOR))
            self.allowance_used = max(self.allowance_used, float(np.nanmax(used)) if np.isfinite(used).any() else
                                      float("inf"))
        self.out_of_tolerance += int(np.count_nonzero(~(diff <= bound)))  # NaN counts as out
        self.elements += int(diff.size)
        return worst

    def to_metrics(self) -> dict:
        return {"maxAbsError": self.max_abs, "maxRelError": self.max_rel, "allowanceUsed": self.allowance_used,
                "outOfTolerance": self.out_of_tolerance, "elements": self.elements}


def compare(samples: Sequence[Sample], reference: Sequence[Outputs], candidate: Sequence[Outputs],
            output: str, criteria: Criteria, reference_label: str = "") -> Verdict:
    """The verdict for outputs already collected from both sides (one dict per sample)."""
    for side, results in (("reference", reference), ("candidate", candidate)):
        if results and output not in results[0]:
            outcome = "fail" if side == "candidate" else "error"
            return Verdict(GATE, outcome, "OutputMissing",
                           f"the {side} returned no output {output!r} (it returned {sorted(results[0])}); "
                           "pass --output with the score output's name", {"output": output})
    common = [name for name in candidate[0] if name in reference[0]] if candidate else []
    unusable = _non_finite(samples, reference, candidate, common)
    if unusable:
        return unusable
    errors = {name: _ErrorStats() for name in common}
    correlate = CORRELATIONS[criteria.method]
    overlaps: list[float] = []
    correlations: list[float] = []
    per_list: list[dict] = []
    for sample, ref_out, cand_out in zip(samples, reference, candidate):
        for name in common:
            if np.shape(ref_out[name]) != np.shape(cand_out[name]):
                return Verdict(GATE, "fail", "OutputShapeMismatch",
                               f"output {name!r} of sample {sample.line} has shape {list(np.shape(cand_out[name]))} "
                               f"from the candidate but {list(np.shape(ref_out[name]))} from the reference",
                               {"output": name, "sample": sample.line})
        for name in common:
            if name != output:
                errors[name].add(ref_out[name], cand_out[name], criteria)
        ref_lists, cand_lists = ranked_lists(ref_out[output]), ranked_lists(cand_out[output])
        for row, (ref_row, cand_row) in enumerate(zip(ref_lists, cand_lists)):
            worst = errors[output].add(ref_row, cand_row, criteria)
            overlap = topk_overlap(ref_row, cand_row, criteria.top_k)
            correlation = correlate(ref_row, cand_row)
            overlaps.append(overlap)
            if correlation is not None:
                correlations.append(correlation)
            per_list.append({"sample": sample.line, "row": row, "items": len(ref_row), "maxAbsError": worst,
                             "topKOverlap": overlap, "rankCorrelation": correlation})
    return _verdict(samples, output, criteria, errors, overlaps, correlations, per_list, reference_label)


def _non_finite(samples, reference, candidate, common) -> Verdict | None:
    """NaN or infinite scores cannot be ranked or compared: say so before measuring."""
    for side, results in (("reference", reference), ("candidate", candidate)):
        count, first = 0, None
        for sample, outputs in zip(samples, results):
            for name in common:
                bad = int(np.size(outputs[name]) - np.count_nonzero(np.isfinite(outputs[name])))
                if bad and first is None:
                    first = (sample.line, name)
                count += bad
        if count:
            outcome, reason = ("fail", "NonFiniteOutputs") if side == "candidate" else ("error", "ReferenceNonFinite")
            return Verdict(GATE, outcome, reason,
                           f"the {side} returned {count} NaN or infinite values (first in output {first[1]!r} "
                           f"of sample {first[0]})", {"nonFinite": count, "sample": first[0], "output": first[1]})
    return None


def _verdict(samples, output, criteria: Criteria, errors: dict[str, _ErrorStats], overlaps, correlations,
             per_list, reference_label) -> Verdict:
    ranked = errors[output]
    overlap = float(np.mean(overlaps)) if overlaps else 1.0
    correlation = float(np.mean(correlations)) if correlations else 1.0
    worst = sorted(per_list, key=lambda r: (r["rankCorrelation"] if r["rankCorrelation"] is not None else 1.0,
                                            r["topKOverlap"], -r["maxAbsError"]))[:WORST_KEPT]
    out_of_tolerance = sum(e.out_of_tolerance for e in errors.values())
    failed = []
    if overlap < criteria.min_topk_overlap:
        failed.append("topKOverlap")
    if correlation < criteria.min_rank_correlation:
        failed.append("rankCorrelation")
    if out_of_tolerance:
        failed.append("tolerance")
    metrics = {
        "requests": len(samples),
        "rankedLists": len(per_list),
        "output": output,
        "maxAbsError": ranked.max_abs,
        "maxRelError": ranked.max_rel,
        "allowanceUsed": ranked.allowance_used,
        "outOfTolerance": out_of_tolerance,
        "topK": criteria.top_k,
        "topKOverlap": overlap,
        "topKOverlapMin": min(overlaps) if overlaps else 1.0,
        "rankCorrelation": correlation,
        "rankCorrelationMin": min(correlations) if correlations else 1.0,
        "rankCorrelationMethod": criteria.method,
        "thresholds": {"absTolerance": criteria.abs_tolerance, "relTolerance": criteria.rel_tolerance,
                       "minTopKOverlap": criteria.min_topk_overlap,
                       "minRankCorrelation": criteria.min_rank_correlation},
        "failedChecks": failed,
        "outputs": {name: e.to_metrics() for name, e in errors.items()},
        "worstRequests": worst,
    }
    if reference_label:
        metrics["reference"] = reference_label[:200]
    over = f"over {len(samples)} requests ({len(per_list)} ranked lists)"
    ranking = (f"top-{criteria.top_k} overlap {overlap:.3f} (min {criteria.min_topk_overlap:g}), "
               f"{criteria.method} {correlation:.3f} (min {criteria.min_rank_correlation:g})")
    # One rule per score, |c - r| <= abs + rel*|r|: say how much of that allowance the worst score
    # used, not the relative error alone (huge where a reference score is near 0, yet within the rule).
    rule = f"|c-r| <= {criteria.abs_tolerance:g} + {criteria.rel_tolerance:g}*|r|"
    elements = sum(e.elements for e in errors.values())
    used = max(e.allowance_used for e in errors.values())
    largest = max(e.max_abs for e in errors.values())
    if out_of_tolerance:
        scores = (f"{out_of_tolerance} of {elements} scores outside {rule} (worst "
                  f"{used:.3g}x its allowance, max abs error {largest:.3g})")
    else:
        scores = (f"all {elements} scores within {rule} (worst used {used:.0%} of its "
                  f"allowance, max abs error {largest:.3g})")
    if "topKOverlap" in failed or "rankCorrelation" in failed:
        return Verdict(GATE, "fail", "RankingDisagrees", f"ranking disagrees {over}: {ranking}; {scores}", metrics)
    if failed:
        return Verdict(GATE, "fail", "ScoresOutOfTolerance", f"{scores} {over}; ranking agrees: {ranking}", metrics)
    return Verdict(GATE, "pass", "OutputsEquivalent", f"equivalent {over}: {scores}; {ranking}", metrics)


# --- The gate -------------------------------------------------------------------------------

def run_equivalence(samples: Sequence[Sample], candidate: Endpoint, criteria: Criteria, *,
                    reference: Endpoint | None = None, reference_torchscript: str | None = None,
                    output: str | None = None, progress: Progress | None = None) -> Verdict:
    progress = progress or Progress("equivalence")
    problem = criteria.problem()
    if problem:
        return error_verdict(GATE, "BadArguments", problem)
    if not samples:
        return error_verdict(GATE, "BadSamples", "no samples to compare; record golden requests or use --generate-samples")
    if (reference is None) == (reference_torchscript is None):
        return error_verdict(GATE, "BadArguments",
                             "give exactly one reference: --reference-url with --reference-model, "
                             "or --reference-torchscript")
    try:
        progress.step(f"sending {len(samples)} samples to the candidate {candidate.describe()}")
        cand_results, cand_order = server_outputs(candidate, samples, "candidate")
    except SideFailed as exc:
        # The candidate's own faults fail the gate; an unreachable server means we could not judge.
        outcome = "error" if exc.reason in ("ServerUnreachable", "BinaryDataUnsupported") else "fail"
        return Verdict(GATE, outcome, exc.reason, str(exc), {"requests": len(samples)})
    except SamplesError as exc:
        return error_verdict(GATE, "BadSamples", str(exc))
    output = output or (cand_order[0] if cand_order else "")
    progress.step(f"running the same samples on the reference "
                  f"{reference.describe() if reference is not None else reference_torchscript}")
    try:
        if reference is not None:
            ref_results, _ = server_outputs(reference, samples, "reference")
            label = f"model {reference.describe()}"
        else:
            ref_results = torchscript_outputs(reference_torchscript, samples, output, cand_order or [output])
            label = f"torchscript {reference_torchscript}"
    except SideFailed as exc:
        return error_verdict(GATE, exc.reason, f"could not run the reference: {exc}")
    except SamplesError as exc:
        return error_verdict(GATE, "BadSamples", str(exc))
    progress.step("comparing scores and rankings")
    return compare(samples, ref_results, cand_results, output, criteria, reference_label=label)


def _short(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
