"""kopf's diff base as a digest: an object whose spec is large must still be deletable.

kopf remembers the last handled state ("essence": spec, labels, annotations) to tell changes from
no-ops. Its annotation storage copies the whole essence into one annotation; Kubernetes caps all
annotations of an object at 256 KiB, so a large spec made every kopf patch fail, including the one
that removes its finalizer: the object, and its namespace, could never be deleted.

The handlers here only need to know *whether* the essence changed (they reconcile from the object
as it is), so the annotation holds a SHA-256 of the essence. When it matches, kopf is handed the
current essence (no diff); when it does not, a stand-in that differs from it, so the update
handlers run. An annotation in kopf's own format (the whole essence) is still read, so switching
to this storage neither re-runs creation handlers nor misses a change made in between.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import kopf

DIGEST_PREFIX = "sha256:"


def essence_digest(essence: Any) -> str:
    encoded = json.dumps(essence, separators=(",", ":"), sort_keys=True)
    return DIGEST_PREFIX + hashlib.sha256(encoded.encode()).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """AnnotationsDiffBaseStorage that stores a digest of the essence, not the essence."""

    _extra_fields: list | None = None

    def build(self, *, body: Any, extra_fields: Iterable[Any] | None = None) -> Any:
        # fetch() rebuilds the current essence to compare digests: with the same extra fields.
        self._extra_fields = list(extra_fields) if extra_fields is not None else None
        return super().build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: Any) -> Any:
        for full_key in self.make_keys(self.key, body=body):
            stored = body.metadata.annotations.get(full_key)
            if stored is None:
                continue
            stored = stored.strip()
            if not stored.startswith(DIGEST_PREFIX):
                return json.loads(stored)   # kopf's own format, written before this storage
            current = super().build(body=body, extra_fields=self._extra_fields)
            return current if essence_digest(current) == stored else {"changedFrom": stored}
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        for full_key in self.make_keys(self.key, body=body):
            patch.metadata.annotations[full_key] = essence_digest(essence)
        self._store_marker(prefix=self.prefix, patch=patch, body=body)
