"""The verdict a gate Job reports: its JSON shape, how it is written, and how the operator reads it.

A gate prints the verdict, writes it to the termination-message file (Kubernetes caps that at
4096 bytes, so the JSON is kept under VERDICT_MAX_BYTES by trimming lists first), and exits
0 pass / 1 fail / 2 could-not-judge. The operator reads the termination message back with
`parse_verdict`, which never raises: garbage becomes an 'error' verdict saying what was wrong.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["pass", "fail", "error"]
GATES = ("warmup", "equivalence")
OUTCOMES = ("pass", "fail", "error")
EXIT_CODES = {"pass": 0, "fail": 1, "error": 2}

TERMINATION_LOG = "/dev/termination-log"
# Kubernetes keeps at most 4096 bytes of a termination message; leave room for the kubelet's
# own framing and for a multi-byte character or two.
VERDICT_MAX_BYTES = 3500
LIST_KEEP = 3        # entries kept of any list in metrics when the verdict is too large
SUMMARY_MAX_CHARS = 300


@dataclass(frozen=True)
class Verdict:
    gate: str
    outcome: Outcome
    reason: str                     # CamelCase, e.g. "P99AboveBound"
    summary: str                    # one line with the key numbers
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.outcome, 2)

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "outcome": self.outcome, "reason": self.reason,
                "summary": self.summary, "metrics": _json_safe(self.metrics)}

    def to_json(self, max_bytes: int = VERDICT_MAX_BYTES) -> str:
        """Compact JSON, trimmed to fit `max_bytes` (lists shortened, then details dropped)."""
        data = self.to_dict()
        data["summary"] = _one_line(data["summary"])[:SUMMARY_MAX_CHARS]
        text = _dumps(data)
        if len(text.encode()) <= max_bytes:
            return text
        data["metrics"] = _trim_lists(data["metrics"], LIST_KEEP)
        data["metrics"]["truncated"] = True
        text = _dumps(data)
        if len(text.encode()) <= max_bytes:
            return text
        # Still too large: keep only the top-level numbers and strings.
        data["metrics"] = {k: v for k, v in data["metrics"].items()
                           if isinstance(v, (int, float, str, bool)) and len(str(v)) < 200}
        text = _dumps(data)
        while len(text.encode()) > max_bytes and data["metrics"]:
            data["metrics"].popitem()
            text = _dumps(data)
        return text


def error_verdict(gate: str, reason: str, message: str, **metrics: Any) -> Verdict:
    """A could-not-judge verdict: the gate did not get as far as measuring the model."""
    return Verdict(gate=gate, outcome="error", reason=reason, summary=message, metrics=dict(metrics))


def default_verdict_file() -> str | None:
    """The termination-message path when running in a pod, otherwise nowhere."""
    return TERMINATION_LOG if os.path.exists(TERMINATION_LOG) else None


def write_verdict(verdict: Verdict, verdict_file: str | None) -> int:
    """Print the verdict, write it to `verdict_file` when given, and return the exit code."""
    text = verdict.to_json()
    print(text, flush=True)
    if verdict_file:
        try:
            with open(verdict_file, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            print(f"rankops gate: cannot write the verdict to {verdict_file}: {exc.strerror}; "
                  "pass --verdict-file with a writable path", file=sys.stderr)
    if verdict.outcome != "pass":
        print(f"rankops gate {verdict.gate}: {verdict.outcome.upper()} {verdict.reason}: "
              f"{verdict.summary}", file=sys.stderr)
    return verdict.exit_code


def parse_verdict(text: str | bytes | None, gate: str = "unknown") -> Verdict:
    """Read a verdict from a termination message; never raises.

    Accepts the JSON alone, or log text whose last JSON-object line is the verdict (what the
    kubelet leaves with FallbackToLogsOnError). Anything else becomes an 'error' verdict whose
    reason says what was wrong, so a rollout can report it instead of crashing.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not text or not text.strip():
        return error_verdict(gate, "NoVerdict", "the gate Job left no termination message")
    data = _load_object(text.strip())
    if data is None:
        return error_verdict(gate, "UnparsableVerdict",
                             f"the termination message is not a JSON verdict: {_one_line(text)[:200]!r}")
    gate_name = data.get("gate")
    gate_name = gate_name if isinstance(gate_name, str) and gate_name else gate
    outcome = data.get("outcome")
    if outcome not in OUTCOMES:
        return error_verdict(gate_name, "UnparsableVerdict",
                             f"the verdict's outcome is {outcome!r}, expected one of {', '.join(OUTCOMES)}")
    reason = data.get("reason")
    summary = data.get("summary")
    metrics = data.get("metrics")
    return Verdict(
        gate=gate_name,
        outcome=outcome,
        reason=reason if isinstance(reason, str) and reason else "Unspecified",
        summary=_one_line(str(summary)) if summary is not None else "",
        metrics=metrics if isinstance(metrics, dict) else {},
    )


def _load_object(text: str) -> dict | None:
    candidates = [text] + [line.strip() for line in reversed(text.splitlines()) if line.strip().startswith("{")]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _dumps(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _json_safe(value: Any) -> Any:
    """Plain JSON types only; non-finite floats become None (Kubernetes rejects NaN/Infinity)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)       # numpy integers too
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(number):
        return None
    return float(f"{number:.6g}")   # six significant digits are plenty for a verdict


def _trim_lists(value: Any, keep: int) -> Any:
    if isinstance(value, dict):
        return {k: _trim_lists(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        return [_trim_lists(v, keep) for v in value[:keep]]
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "..."
    return value
