"""JSON merge patches that say exactly what changed, so an unchanged reconcile writes nothing."""
from __future__ import annotations

from typing import Any


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 patch turning `old` into `new`: removed keys become null, lists are replaced."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {}
    for key, value in new.items():
        if value is None:
            if old.get(key) is not None:
                patch[key] = None
        elif key not in old or old[key] != value:
            patch[key] = merge_patch(old.get(key), value)
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as the API server applies an RFC 7386 merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out
