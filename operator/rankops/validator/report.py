"""A node's validation report: every check's verdict, the facts worth labelling, and the readiness.

`ready` holds when every required check passed (warn counts as a pass with a caveat); a required
check that failed or is unknown makes the node not ready, so missing facts fail safe.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rankops.api.gpunodepool import NodeRequirements
from rankops.validator import checks as c
from rankops.validator.result import CheckResult, Status
from rankops.validator.gpu import GpuFacts
from rankops.validator.host import HostView, Read

REPORT_VERSION = 1


def requirements_digest(requirements: NodeRequirements) -> str:
    """A short fingerprint of the requirements, so a report made against older ones is recognised."""
    canonical = json.dumps(requirements.to_wire(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Report:
    checks: tuple[CheckResult, ...]
    requirements_digest: str
    generated_at: str
    node: str | None = None
    pool: str | None = None
    os: str | None = None                 # "rhel-8.9"
    driver_version: str | None = None     # the loaded kernel module's
    cuda_version: str | None = None       # the newest CUDA the driver supports
    gpu_source: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def ready(self) -> bool:
        return not self.blocking

    @property
    def blocking(self) -> list[CheckResult]:
        return [check for check in self.checks if check.blocks_readiness]

    def check(self, check_id: str) -> CheckResult:
        return next(check for check in self.checks if check.id == check_id)

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """The report as JSON data; `compact` (for the node annotation) keeps only what explains a
        verdict: passing checks lose their expectation and remedy."""
        checks = []
        for check in self.checks:
            data = check.to_dict()
            if compact and check.status == Status.PASS:
                data = {k: data[k] for k in ("id", "status", "observed", "required")}
            checks.append(data)
        data = {
            "version": REPORT_VERSION, "ready": self.ready, "node": self.node, "pool": self.pool,
            "generatedAt": self.generated_at, "requirementsDigest": self.requirements_digest,
            "os": self.os, "driverVersion": self.driver_version, "cudaVersion": self.cuda_version,
            "gpuSource": self.gpu_source, "blocking": [check.id for check in self.blocking],
            "checks": checks,
        }
        if self.notes and not compact:
            data["notes"] = list(self.notes)
        return {k: v for k, v in data.items() if v is not None}

    def to_json(self, compact: bool = False) -> str:
        if compact:
            return json.dumps(self.to_dict(compact=True), separators=(",", ":"), sort_keys=False)
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Report":
        return cls(
            checks=tuple(CheckResult.from_dict(check) for check in data.get("checks", [])),
            requirements_digest=str(data.get("requirementsDigest", "")),
            generated_at=str(data.get("generatedAt", "")),
            node=data.get("node"), pool=data.get("pool"), os=data.get("os"),
            driver_version=data.get("driverVersion"), cuda_version=data.get("cudaVersion"),
            gpu_source=data.get("gpuSource"), notes=tuple(data.get("notes", ())),
        )


def _label_facts(host: HostView, gpu: Read[GpuFacts]) -> tuple[str | None, str | None, str | None]:
    os_facts = c.os_facts(host)
    os_name = f"{os_facts.value[0]}-{os_facts.value[1]}" if os_facts.ok else None
    kernel = c.kernel_module_version(host)
    driver = kernel.value if kernel.ok else (gpu.value.driver_version if gpu.ok else None)
    cuda = c.driver_cuda(host, gpu)  # the same cross-checked value the cuda check judges
    return os_name, driver, cuda.value[0] if cuda.ok else None


def validate_host(host: HostView, requirements: NodeRequirements, gpu: Read[GpuFacts], *,
                  node: str | None = None, pool: str | None = None, now: datetime | None = None) -> Report:
    os_name, driver, cuda = _label_facts(host, gpu)
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return Report(
        checks=tuple(c.run_checks(host, requirements, gpu)),
        requirements_digest=requirements_digest(requirements),
        generated_at=moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        node=node, pool=pool, os=os_name, driver_version=driver, cuda_version=cuda,
        gpu_source=gpu.value.source if gpu.ok else None,
        notes=(gpu.value.notes if gpu.ok else (gpu.reason,)),
    )


_MARK = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.WARN: "WARN", Status.UNKNOWN: "????"}


def render_text(report: Report) -> str:
    """The report for a person at a terminal: one line per check, remedies under what needs one."""
    width = max(len(check.id) for check in report.checks)
    title = f"node {report.node}" if report.node else "this host"
    lines = [f"rankops node validation of {title}"
             + (f" for pool {report.pool}" if report.pool else "")
             + f": {'READY' if report.ready else 'NOT READY'}"]
    for check in report.checks:
        flag = "" if check.required else "  (advisory)"
        lines.append(f"  {_MARK[check.status]}  {check.id:<{width}}  {check.observed}{flag}")
        if check.status in (Status.FAIL, Status.WARN) or check.blocks_readiness:
            lines.append(f"        {'':<{width}}  expected: {check.expected}")
            if check.remedy:
                lines.append(f"        {'':<{width}}  fix: {check.remedy}")
    if report.blocking:
        lines.append(f"blocking: {', '.join(check.id for check in report.blocking)}")
    return "\n".join(lines)
