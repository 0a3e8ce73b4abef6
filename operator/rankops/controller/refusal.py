"""Child writes the API server refuses: what to say about them and when to try again (pure).

A refusal (422 Invalid, 403 Forbidden, 413 too large, an API the cluster does not serve) does not
go away by retrying every tick; it goes away when the tenant fixes the spec or the cluster admin
installs or grants something. So it is said once in status, naming the API server's reason, the
child field it names and the spec field behind it, and tried again with a growing delay.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

RETRY_FIRST_S = 10.0
RETRY_MAX_S = 300.0

# Child field (by kind) -> the spec field a tenant changes to fix it. First match wins.
_SPEC_FIELDS: list[tuple[str | None, str, str]] = [
    ("Job", r"template\.metadata\.annotations", "spec.rollout.gateJobs.podAnnotations (or the gate's own podAnnotations)"),
    ("Job", r"\.image$", "spec.rollout.gateJobs.image"),
    (None, r"template\.metadata\.annotations", "spec.podAnnotations"),
    (None, r"secretRef", "spec.modelCredentialsSecret"),
    (None, r"nodeSelector|affinity", "spec.nodePool"),
    (None, r"initContainers\[\d+\]\.image", "spec.fetcherImage"),
    (None, r"containers\[\d+\]\.image", "spec.tritonImage"),
    (None, r"resources", "spec.resources"),
    (None, r"volumes|volumeMounts", "spec.versions[].modelUri"),
    ("HTTPRoute", r"", "spec.rollout.canary.traffic / parentRef"),
    ("Route", r"", "spec.rollout.canary.traffic"),
]
_KIND_HINTS = {
    "HTTPRoute": "the cluster must serve gateway.networking.k8s.io and the chart grant it (traffic.gatewayApi=true), "
                 "or set spec.rollout.canary.traffic: replicas",
    "Route": "the cluster must be OpenShift and the chart grant routes (openshift.routes=true), "
             "or set spec.rollout.canary.traffic: replicas",
}


@dataclass(frozen=True)
class Refusal:
    """One child write the API server refused."""
    kind: str
    name: str
    code: int           # HTTP status; 404 for an API the cluster does not serve
    reason: str         # the API server's reason: Invalid, Forbidden, RequestEntityTooLarge, NotFound...
    field: str | None   # the child field it names, when it names one
    detail: str         # its message
    spec_field: str | None

    def message(self, generation: int | None, retry_in_s: float | None) -> str:
        where = f"{self.field}: " if self.field else ""
        text = (f"the API server refused {self.kind} {self.name} ({self.code} {self.reason}): {where}{self.detail}")
        if self.spec_field:
            text += f". Fix {self.spec_field}"
        hint = _KIND_HINTS.get(self.kind)
        if hint and self.code in (403, 404):
            text += f"; {hint}"
        text += (f". Generation {generation} is not applied; what serves is left as it was" if generation
                 else ". Nothing was applied")
        if retry_in_s is not None:
            text += f"; next try in {retry_in_s:.0f} s"
        return text


def is_refusal(status: int) -> bool:
    """Statuses that retrying the same write will not change (409, 429 and 5xx are transient)."""
    return status in (400, 403, 404, 413, 422)


def from_api_error(obj: dict[str, Any], status: int, reason: str | None, body: Any) -> Refusal:
    """The Refusal of writing `obj`, from the API server's Status answer."""
    details: dict[str, Any] = {}
    try:
        details = json.loads(body) if isinstance(body, (str, bytes)) and body else {}
    except ValueError:
        pass
    if not isinstance(details, dict):
        details = {}
    causes = (details.get("details") or {}).get("causes") or []
    cause = next((c for c in causes if c.get("field")), causes[0] if causes else {})
    field = cause.get("field")
    detail = cause.get("message") or details.get("message") or (body.decode() if isinstance(body, bytes) else str(body or ""))
    kind = obj.get("kind", "object")
    return Refusal(kind=kind, name=obj.get("metadata", {}).get("name", ""), code=status,
                   reason=details.get("reason") or reason or "Refused", field=field,
                   detail=" ".join(str(detail).split())[:600], spec_field=spec_field_for(kind, field))


def missing_api(obj: dict[str, Any]) -> Refusal:
    kind = obj.get("kind", "object")
    return Refusal(kind=kind, name=obj.get("metadata", {}).get("name", ""), code=404, reason="NotFound",
                   field=None, detail=f"{obj.get('apiVersion')} {kind} is not served by this cluster",
                   spec_field=spec_field_for(kind, None))


def spec_field_for(kind: str, field: str | None) -> str | None:
    for want_kind, pattern, spec_field in _SPEC_FIELDS:
        if want_kind not in (None, kind):
            continue
        if want_kind is not None and not pattern:
            return spec_field
        if field and pattern and re.search(pattern, field):
            return spec_field
    return None


def digest(objects: list[dict[str, Any]]) -> str:
    """What a set of child objects says, in 16 hex digits: equal sets, equal digests."""
    return hashlib.sha256(json.dumps(objects, sort_keys=True, default=str).encode()).hexdigest()[:16]


def retry_delay(attempts: int) -> float:
    """Seconds before trying a refused write again after `attempts` refusals: 10, 20, 40 ... 300."""
    return min(RETRY_FIRST_S * 2 ** max(attempts - 1, 0), RETRY_MAX_S)


@dataclass(frozen=True)
class Refused:
    """A refused set of writes: for which generation and objects, how often, when to try again."""
    generation: int | None
    digest: str
    refusal: Refusal
    attempts: int
    retry_at: float     # monotonic seconds

    def message(self) -> str:
        return self.refusal.message(self.generation, retry_delay(self.attempts))


def record(previous: Refused | None, generation: int | None, digest_: str, refusal: Refusal,
           now: float) -> Refused:
    """The record after a refusal: attempts count up while generation and objects stay the same."""
    same = previous is not None and previous.generation == generation and previous.digest == digest_
    attempts = previous.attempts + 1 if same else 1
    return Refused(generation, digest_, refusal, attempts, now + retry_delay(attempts))


def backing_off(previous: Refused | None, generation: int | None, digest_: str, now: float) -> bool:
    """True while the same writes, refused before, wait for their next try (a new spec tries at once)."""
    return previous is not None and previous.generation == generation and previous.digest == digest_ \
        and now < previous.retry_at
