"""Rollout gates: the programs a gate Job runs (warmup, output equivalence) and their verdicts.

The operator needs only `parse_verdict` and `Verdict` to read a finished Job's termination
message; the gates themselves run in the Job's pod (`rankops gate ...`).
"""
from rankops.gates.verdict import Verdict, parse_verdict

__all__ = ["Verdict", "parse_verdict"]
