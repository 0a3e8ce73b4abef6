"""Whether a child as observed already says what rankops would apply (pure): then it is not written.

Each applied child carries `rankops.io/applied` in its annotations, a digest of the object as
rendered. A child is left alone when that digest is the one of the object rendered now AND every
field rankops sets still has its value (a hand edit, `kubectl scale`, is drift and is repaired).
Fields the API server adds (defaults, status, clusterIP) are not compared. A field the server
writes back in another spelling only costs one no-op apply per reconcile, never a loop: a no-op
apply changes nothing, so it wakes nothing.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

APPLIED_ANNOTATION = "rankops.io/applied"


def applied_digest(obj: dict[str, Any]) -> str:
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def with_digest(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with its digest annotation (the digest of `obj` without it)."""
    meta = dict(obj["metadata"])
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != APPLIED_ANNOTATION}
    bare = {**obj, "metadata": {**meta, "annotations": annotations} if annotations else
            {k: v for k, v in meta.items() if k != "annotations"}}
    meta["annotations"] = {**annotations, APPLIED_ANNOTATION: applied_digest(bare)}
    return {**obj, "metadata": meta}


def unchanged(desired: dict[str, Any], observed: dict[str, Any] | None) -> bool:
    """`desired` (with its digest, from with_digest) needs no write over `observed`."""
    if observed is None or observed["metadata"].get("deletionTimestamp"):
        return False
    want = (desired["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION)
    if want is None or (observed["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION) != want:
        return False
    mine = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    meta = {k: desired["metadata"].get(k) for k in ("labels", "annotations", "ownerReferences")}
    return _covers(mine, observed) and _covers(meta, observed["metadata"])


def _covers(want: Any, have: Any) -> bool:
    """Every value in `want` is in `have` (dicts by key, lists item by item, scalars equal)."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return not want and have is None
        return all(_covers(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        if have is None:
            return not want
        return isinstance(have, list) and len(want) == len(have) and all(map(_covers, want, have))
    if want is None or (have is None and want in ("", False, 0)):
        return True   # unset, or the zero value the server leaves out
    return want == have or (not isinstance(want, bool) and str(want) == str(have))
