"""One check's verdict, shared by both check registries (checks.py: the host and its GPU;
latency.py: CPU and GPU latency tuning), so that neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    observed: str
    expected: str
    remedy: str
    required: bool

    @property
    def blocks_readiness(self) -> bool:
        """A required check that did not pass (warn is a pass with a caveat; unknown fails safe)."""
        return self.required and self.status in (Status.FAIL, Status.UNKNOWN)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status.value, "observed": self.observed,
                "expected": self.expected, "remedy": self.remedy, "required": self.required}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CheckResult":
        return cls(id=str(data["id"]), status=Status(data["status"]), observed=str(data.get("observed", "")),
                   expected=str(data.get("expected", "")), remedy=str(data.get("remedy", "")),
                   required=bool(data.get("required", True)))


def unknown_result(check_id: str, reason: str, expected: str, required: bool, remedy: str = "") -> CheckResult:
    if not remedy:
        remedy = ("Fix the checks this one builds on first (a missing /proc/driver/nvidia means the nvidia module "
                  "is not loaded), and make sure the host's / is mounted at the validator's host root."
                  if reason.endswith("not found") else
                  "Check that file on the host: the validator could not read or understand it.")
    return CheckResult(check_id, Status.UNKNOWN, reason, expected, remedy, required)
