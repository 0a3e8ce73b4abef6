"""Process-wide operator settings, filled in by `rankops run` before kopf starts."""
from __future__ import annotations

from dataclasses import dataclass

from rankops.controller.kube import Kube


@dataclass
class OperatorContext:
    kube: Kube | None = None
    namespace: str = "rankops-system"               # where validator DaemonSets run
    validator_service_account: str = "rankops-validator"
    validator_image: str | None = None              # overrides the pools' validator image
    interval: float = 10.0                          # seconds between level-based re-checks


OPERATOR = OperatorContext()
