"""The names a node validator writes on its node and the operator reads: labels, the report
annotation, the taint. One module, so the validator, the renderer (node affinity), the pool
status and the disruption rules agree on them without importing each other."""
from __future__ import annotations

import re

LABEL_READY = "rankops.io/gpu-ready"
LABEL_POOL = "rankops.io/pool"
LABEL_DRIVER = "rankops.io/driver-version"
LABEL_CUDA = "rankops.io/cuda-version"
LABEL_OS = "rankops.io/os"
# The driver version as two integers: node affinity compares only integers (Gt/Lt), and placement
# needs "branch >= 560" or "branch 535 and minor >= 86" (triton.image_fit).
LABEL_DRIVER_BRANCH = "rankops.io/driver-branch"
LABEL_DRIVER_MINOR = "rankops.io/driver-minor"
# true / false / unknown from the latency checks (validator.latency); absent with latencyTuning: off.
LABEL_LATENCY_TUNED = "rankops.io/latency-tuned"
LABEL_TOPOLOGY_ALIGNED = "rankops.io/topology-aligned"
ANNOTATION_REPORT = "rankops.io/validation-report"
TAINT_KEY = "rankops.io/gpu-unvalidated"
TAINT_EFFECT = "NoSchedule"
VALIDATOR_APP = "rankops-validator"   # app.kubernetes.io/name of the validator DaemonSet's pods
VALIDATION_LABELS = (LABEL_READY, LABEL_POOL, LABEL_DRIVER, LABEL_CUDA, LABEL_OS, LABEL_DRIVER_BRANCH,
                     LABEL_DRIVER_MINOR, LABEL_LATENCY_TUNED, LABEL_TOPOLOGY_ALIGNED)


def label_value(text: str | None) -> str | None:
    """`text` as a valid label value (<= 63 chars of [A-Za-z0-9-_.], alphanumeric at both ends),
    or None when nothing valid is left (the label is then removed)."""
    if not text:
        return None
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    return value or None
