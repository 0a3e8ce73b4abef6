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
