"""Latency profiles: GPU compute time per batch size, given inline or imported from CSV.

Two CSV formats are read by their real column names:

* perf_analyzer `-f FILE` output ("Concurrency,Inferences/Second,Client Send,Network+Server
  Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client
  Recv,p50 latency,...", times in microseconds). It carries no batch-size column (the batch is
  perf_analyzer's `-b`), so the caller names it. The service time of one execution is Server
  Compute Input + Infer + Output at the lowest concurrency (higher concurrency lets the server's
  own dynamic batcher merge requests, which would blur the batch size).
* Model Analyzer's `metrics-model-inference.csv` ("Model,Batch,Concurrency,Model Config Path,
  Instance Group,Max Batch Size,Satisfies Constraints,Throughput (infer/sec),p99 Latency (ms)",
  times in ms). Per batch size it uses the single-instance rows at the lowest concurrency, and
  "Server Compute Input/Infer/Output time (ms)" when those columns were exported; otherwise it
  falls back to batch / throughput, which includes client and network time (pessimistic).
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from rankops.api.planning import MAX_PROFILE_BATCH


class ProfileError(ValueError):
    """A latency profile that cannot be used; the message names the field or column and the fix."""


@dataclass(frozen=True)
class LatencyProfile:
    """Compute ms per batch size, measured at a few sizes; other sizes are interpolated."""

    points: tuple[tuple[int, float], ...]  # sorted by batch size

    @classmethod
    def from_mapping(cls, mapping: dict, source: str = "latencyProfile") -> LatencyProfile:
        points: dict[int, float] = {}
        for key, value in mapping.items():
            try:
                batch = int(str(key).strip())
                ms = float(value)
            except (TypeError, ValueError):
                raise ProfileError(
                    f"{source}: entry {key!r}: {value!r} is not 'batchSize: milliseconds' "
                    "(e.g. {1: 2.0, 8: 3.0})") from None
            if not 1 <= batch <= MAX_PROFILE_BATCH:
                raise ProfileError(f"{source}: batch size {batch} must be 1..{MAX_PROFILE_BATCH}")
            if not ms > 0:
                raise ProfileError(f"{source}: batch {batch} has {ms} ms; compute time must be > 0")
            points[batch] = ms
        if not points:
            raise ProfileError(f"{source} is empty: give compute ms per batch size, e.g. {{1: 2.0, 8: 3.0}}")
        return cls(tuple(sorted(points.items())))

    @property
    def max_batch(self) -> int:
        return self.points[-1][0]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(b for b, _ in self.points)

    def as_dict(self) -> dict[int, float]:
        return dict(self.points)

    def compute_ms(self, batch: int) -> float:
        """Linear interpolation between measured sizes. Below the smallest measured size the
        smallest time is used (a smaller batch is never slower); above the largest, the last
        segment's slope is extended (the search never goes there; explicit configs may)."""
        pts = self.points
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        if len(pts) == 1:
            return pts[0][1] * batch / pts[0][0]  # one point: assume linear through the origin
        (b0, t0), (b1, t1) = pts[-2], pts[-1]
        return t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (batch - b1)

    def table(self, up_to: int) -> list[float]:
        """compute_ms for 0..up_to (index 0 unused), for the simulator's inner loop."""
        return [0.0] + [self.compute_ms(b) for b in range(1, up_to + 1)]


# --- CSV import ---------------------------------------------------------------------------------

_PA_INFER = "Server Compute Infer"
_PA_PARTS = ("Server Compute Input", "Server Compute Infer", "Server Compute Output")
_MA_BATCH = "Batch"
_MA_THROUGHPUT = "Throughput (infer/sec)"
_MA_PARTS = ("Server Compute Input time (ms)", "Server Compute Infer time (ms)",
             "Server Compute Output time (ms)")


def _rows(text: str, source: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text.strip()))
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    rows = [{k: (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    rows = [r for r in rows if any(r.values())]
    if not rows:
        raise ProfileError(f"{source}: no data rows under the header")
    return header, rows


def _number(row: dict[str, str], column: str, source: str, line: int) -> float:
    try:
        return float(row[column])
    except (KeyError, ValueError):
        raise ProfileError(f"{source}: row {line}: column {column!r} is {row.get(column)!r}, not a number") from None


def _instances(group: str) -> int | None:
    """Model Analyzer writes the instance group as '1/GPU', '1:GPU' or 'GPU:1' by version."""
    match = re.search(r"(\d+)\s*[/:]\s*GPU|GPU\s*:\s*(\d+)", group or "")
    return int(match.group(1) or match.group(2)) if match else None


def parse_perf_analyzer_csv(text: str, batch_size: int, source: str = "perf_analyzer CSV") -> dict[int, float]:
    """One `perf_analyzer -b B -f FILE` result -> {B: compute ms}."""
    header, rows = _rows(text, source)
    if _PA_INFER not in header:
        raise ProfileError(
            f"{source}: no {_PA_INFER!r} column (found {', '.join(header)}); run perf_analyzer "
            "against Triton so server-side stats are included")
    load_col = "Concurrency" if "Concurrency" in header else "Request Rate" if "Request Rate" in header else None
    ranked = sorted(enumerate(rows, start=2),
                    key=lambda r: _number(r[1], load_col, source, r[0]) if load_col else 0)
    line, row = ranked[0]
    us = sum(_number(row, col, source, line) for col in _PA_PARTS if col in header)
    if us <= 0:
        raise ProfileError(f"{source}: row {line}: server compute time is {us} us; expected > 0")
    return {batch_size: us / 1000.0}


def parse_model_analyzer_csv(text: str, source: str = "Model Analyzer CSV") -> dict[int, float]:
    """metrics-model-inference.csv -> {batch: compute ms}."""
    header, rows = _rows(text, source)
    missing = [c for c in (_MA_BATCH, "Concurrency") if c not in header]
    if missing:
        raise ProfileError(f"{source}: missing column(s) {missing} (found {', '.join(header)})")
    has_parts = _MA_PARTS[1] in header
    if not has_parts and _MA_THROUGHPUT not in header:
        raise ProfileError(
            f"{source}: needs {_MA_PARTS[1]!r} (add perf_server_compute_infer to "
            f"inference_output_fields) or {_MA_THROUGHPUT!r}")
    numbered = list(enumerate(rows, start=2))
    if "Instance Group" in header:
        counts = {line: _instances(r["Instance Group"]) for line, r in numbered}
        fewest = min((c for c in counts.values() if c is not None), default=None)
        if fewest is not None:  # contention between instances would inflate the times
            numbered = [(line, r) for line, r in numbered if counts[line] in (None, fewest)]
    best: dict[int, tuple[float, float]] = {}  # batch -> (concurrency, ms)
    for line, row in numbered:
        batch = int(_number(row, _MA_BATCH, source, line))
        concurrency = _number(row, "Concurrency", source, line)
        if has_parts:
            ms = sum(_number(row, col, source, line) for col in _MA_PARTS if col in header)
        else:
            throughput = _number(row, _MA_THROUGHPUT, source, line)
            if throughput <= 0:
                raise ProfileError(f"{source}: row {line}: {_MA_THROUGHPUT} is {throughput}")
            ms = 1000.0 * batch * concurrency / throughput  # Little's law: time per request
        if batch not in best or (concurrency, ms) < best[batch]:
            best[batch] = (concurrency, ms)
    return {b: ms for b, (_, ms) in sorted(best.items())}


def _looks_like_csv(text: str) -> bool:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return "," in first and ("Inferences/Second" in first or _MA_BATCH in first.split(",")[:3])


def parse_profile_text(text: str, source: str = "profile", batch_size: int | None = None) -> LatencyProfile:
    """A profile as stored in a file or ConfigMap key: YAML/JSON {batch: ms} or one of the CSVs."""
    if not text.strip():
        raise ProfileError(f"{source} is empty")
    if _looks_like_csv(text):
        first = text.strip().splitlines()[0]
        if "Inferences/Second" in first:
            if batch_size is None:
                raise ProfileError(
                    f"{source} is perf_analyzer output, which has no batch-size column: name the "
                    "batch perf_analyzer ran with (-b), e.g. --profile perf_b8.csv:8")
            return LatencyProfile.from_mapping(parse_perf_analyzer_csv(text, batch_size, source), source)
        return LatencyProfile.from_mapping(parse_model_analyzer_csv(text, source), source)
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: neither a {{batchSize: ms}} map nor a known CSV ({exc})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a map {{batchSize: ms}}, got {type(data).__name__}")
    if data.get("kind") == "ConfigMap":   # what `rankops profile` prints: the profile is its one key
        keys = sorted((data.get("data") or {}).items())
        if len(keys) != 1:
            raise ProfileError(f"{source}: a ConfigMap with {len(keys)} data keys; give one holding the profile "
                               "(as `rankops profile` prints it)")
        key, value = keys[0]
        return parse_profile_text(str(value), f"{source} key {key}", batch_size)
    return LatencyProfile.from_mapping(data, source)


def load_profiles(specs: list[str]) -> LatencyProfile:
    """CLI `--profile FILE[:BATCH]` values, merged (several perf_analyzer runs, one per -b)."""
    merged: dict[int, float] = {}
    for spec in specs:
        path, batch = spec, None
        head, sep, tail = spec.rpartition(":")
        if sep and tail.isdigit() and head:
            path, batch = head, int(tail)
        file = Path(path)
        if not file.is_file():
            raise ProfileError(f"--profile {spec}: no such file {path}")
        profile = parse_profile_text(file.read_text(encoding="utf-8"), source=path, batch_size=batch)
        merged.update(profile.as_dict())
    return LatencyProfile.from_mapping(merged, "--profile")

