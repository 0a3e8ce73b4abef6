"""The operator's children as its watches show them, so a reconcile reads them without a request.

kopf's event handlers (controller/handlers.py) feed every Deployment, Service, ConfigMap, Job and
PodDisruptionBudget that carries the rankops.io/model label; `CachedKube` answers the reconcilers'
reads of those kinds from here and passes everything else to the API. A (kind, namespace) is listed once, the
first time it is read (at start-up the watch may not have delivered it yet), and again after
`relist_s`: a deletion a broken watch missed is corrected then, not kept.

Objects are compared by resourceVersion, so a listing older than a watch event (or than this
process's own write) never brings back what was deleted or overwrites what is newer.

Each object is kept as compressed JSON (without managedFields), its labels beside it for `select`,
and parsed again when read: as parsed dicts a child took ~50 KB (keys and small values are
separate objects per object), ~1 KB so; a read costs tens of microseconds, and every reader gets
its own copy, so no caller can change what the cache holds.
"""
from __future__ import annotations

import hashlib
import threading
import time
import zlib
from typing import Any, Callable, NamedTuple

from rankops.controller import fastjson
from rankops.controller.kube import Kube
from rankops.modelplan import CHILD_STATUS_READ
from rankops.render.names import FIELD_MANAGER, LABEL_MODEL

CACHED_KINDS = ("Deployment", "Service", "ConfigMap", "Job", "PodDisruptionBudget")

Key = tuple[str, str, str]   # kind, namespace, name


def resource_version(of: dict[str, Any] | str | None) -> int:
    """An object's resourceVersion (or one given as is) as a number; 0 when unknown. The API
    server's are etcd revisions: numbers that grow, so newer is larger."""
    value = of["metadata"].get("resourceVersion") if isinstance(of, dict) else of
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _key(kind: str, obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return kind, meta.get("namespace") or "", meta["name"]


# Kinds whose status no reconcile reads (derived from what modelplan declares it reads): the
# disruption controller's counts on a budget change every time a pod comes or goes, and would
# wake the model for nothing.
STATUS_UNREAD = frozenset(CACHED_KINDS) - CHILD_STATUS_READ


def own_echo(obj: dict[str, Any]) -> bool:
    """Whether a watch event only shows this operator's own apply (the echo of a write whose answer
    the reconcile that made it records): the newest entry of its managedFields is rankops' alone, on
    the object itself (not a subresource), and it is not being deleted. Their times are whole
    seconds: a tie with another manager's write is not an echo."""
    meta = obj.get("metadata") or {}
    entries = meta.get("managedFields") or []
    if not entries or meta.get("deletionTimestamp"):
        return False
    newest = max(str(e.get("time") or "") for e in entries)
    last = [e for e in entries if str(e.get("time") or "") == newest]
    return len(last) == 1 and last[0].get("manager") == FIELD_MANAGER and not last[0].get("subresource")


class _Entry(NamedTuple):
    rv: int
    labels: dict[str, str]
    blob: bytes     # zlib-compressed JSON
    content: bytes  # digest of what a reconcile reads: not the resourceVersion, not an unread status

    @classmethod
    def of(cls, kind: str, obj: dict[str, Any], rv: int) -> _Entry:
        # managedFields are most of a child's bytes and no reconcile reads them.
        meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
        encoded = fastjson.dumps({**obj, "metadata": meta})
        read = {k: v for k, v in obj.items() if k != "metadata" and not (k == "status" and kind in STATUS_UNREAD)}
        read["metadata"] = {k: v for k, v in meta.items() if k != "resourceVersion"}
        content = hashlib.blake2b(fastjson.dumps(read, sort_keys=True), digest_size=8).digest()
        return cls(rv, dict(meta.get("labels") or {}), zlib.compress(encoded, 1), content)

    def object(self) -> dict[str, Any]:
        return fastjson.loads(zlib.decompress(self.blob))


class WatchCache:
    """Watched objects by (kind, namespace, name): a model's children (CACHED_KINDS labelled
    rankops.io/model), RankingModels, or the PoolController's GpuNodePools and Nodes."""

    def __init__(self, relist_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        self.relist_s = relist_s
        self.clock = clock
        self._objects: dict[Key, _Entry] = {}
        # Names by (kind, namespace) and by (kind, namespace, model label): a reconcile selects its
        # own children, and at N=1000 a scan of every object per select was O(models x children).
        self._spaces: dict[tuple[str, str], set[str]] = {}
        self._by_model: dict[tuple[str, str, str], set[str]] = {}
        self._gone: dict[Key, int] = {}            # resourceVersion at deletion
        self._listed: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def observe(self, kind: str, obj: dict[str, Any], deleted: bool = False) -> bool:
        """A watch event, or this process's own write answered by the API server. True when it
        changed what a reconcile reads: False for an older version, for the watch's echo of this
        process's own write, or for a status no reconcile reads (a budget's pod counts)."""
        key, rv = _key(kind, obj), resource_version(obj)
        with self._lock:
            return self._merge(key, obj, rv, deleted)

    def _merge(self, key: Key, obj: dict[str, Any] | None, rv: int, deleted: bool) -> bool:
        current = self._objects.get(key)
        newest = max(current.rv if current else 0, self._gone.get(key, 0))
        if rv and newest and rv < newest:
            return False   # older than what is known
        if deleted or obj is None:
            self._drop(key)
            self._gone[key] = rv
            return True
        self._drop(key)
        entry = self._objects[key] = _Entry.of(key[0], obj, rv)
        self._spaces.setdefault(key[:2], set()).add(key[2])
        model = entry.labels.get(LABEL_MODEL)
        if model is not None:
            self._by_model.setdefault((*key[:2], model), set()).add(key[2])
        self._gone.pop(key, None)
        return current is None or current.content != entry.content

    def _drop(self, key: Key) -> _Entry | None:
        entry = self._objects.pop(key, None)
        if entry is not None:
            for index, at in ((self._spaces, key[:2]), (self._by_model, (*key[:2], entry.labels.get(LABEL_MODEL)))):
                names = index.get(at)
                if names is not None:
                    names.discard(key[2])
                    if not names:
                        del index[at]
        return entry

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """This process deleted it (the watch's DELETED event follows)."""
        key = (kind, namespace or "", name)
        with self._lock:
            current = self._drop(key)
            self._gone[key] = max(self._gone.get(key, 0), current.rv if current else 0)

    def forget_listings(self) -> None:
        """Every (kind, namespace) is listed again at its next read (what is held may be stale)."""
        with self._lock:
            self._listed.clear()

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()
            self._spaces.clear()
            self._by_model.clear()
            self._gone.clear()
            self._listed.clear()

    def fill(self, kube: Kube, kind: str, namespace: str, label_selector: str | None = None) -> None:
        """List `kind` in `namespace` if it was never listed, or not for `relist_s`."""
        if self.needs_listing(kind, namespace):
            items, rv = kube.list_versioned(kind, namespace, label_selector=label_selector)
            self.listed(kind, namespace, items, rv)

    def needs_listing(self, kind: str, namespace: str) -> bool:
        with self._lock:
            at = self._listed.get((kind, namespace or ""))
        return at is None or self.clock() - at >= self.relist_s

    def listed(self, kind: str, namespace: str, items: list[dict[str, Any]], list_rv: int) -> None:
        """A full listing of `kind` in `namespace` (with the rankops label) at `list_rv`."""
        with self._lock:
            present = set()
            for obj in items:
                key = _key(kind, obj)
                present.add(key)
                self._merge(key, obj, resource_version(obj), False)
            space = (kind, namespace or "")
            for key in [(*space, name) for name in self._spaces.get(space, ()) if (*space, name) not in present]:
                if self._objects[key].rv <= list_rv:   # gone by the time of the listing
                    self._merge(key, None, list_rv, True)
            self._listed[(kind, namespace or "")] = self.clock()

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._objects.get((kind, namespace or "", name))
        return entry.object() if entry else None

    def select(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        space = (kind, namespace or "")
        with self._lock:
            model = labels.get(LABEL_MODEL)
            candidates = self._by_model.get((*space, model), ()) if model is not None else self._spaces.get(space, ())
            found = [(name, self._objects[(*space, name)]) for name in sorted(candidates)]
        return [e.object() for _, e in found if all(e.labels.get(lk) == lv for lk, lv in labels.items())]


class CachedKube:
    """A Kube whose reads of rankops' children come from a `WatchCache`; writes go to the API and
    are remembered, so the next read sees them."""

    def __init__(self, kube: Kube, children: WatchCache):
        self.kube = kube
        self.children = children

    def __getattr__(self, name: str) -> Any:   # exists, merge_patch...: straight to the API
        return getattr(self.kube, name)

    def _fill(self, kind: str, namespace: str) -> None:
        self.children.fill(self.kube, kind, namespace, label_selector=LABEL_MODEL)

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        if kind not in CACHED_KINDS or not namespace:
            return self.kube.get(kind, namespace, name)
        self._fill(kind, namespace)
        return self.children.get(kind, namespace, name)

    def list(self, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None,
             label_selector: str | None = None) -> list[dict]:
        if kind not in CACHED_KINDS or not namespace or label_selector or LABEL_MODEL not in (labels or {}):
            return self.kube.list(kind, namespace, labels=labels, label_selector=label_selector)
        self._fill(kind, namespace)
        return self.children.select(kind, namespace, labels or {})

    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict:
        answer = self.kube.apply(obj, dry_run=dry_run)
        if not dry_run and answer and obj["kind"] in CACHED_KINDS \
                and LABEL_MODEL in (answer["metadata"].get("labels") or {}):
            self.children.observe(obj["kind"], answer)
        return answer

    def delete(self, kind: str, namespace: str | None, name: str, propagation: str = "Background") -> bool:
        deleted = self.kube.delete(kind, namespace, name, propagation=propagation)
        if kind in CACHED_KINDS and namespace:
            self.children.forget(kind, namespace, name)
        return deleted


class ClusterWatch:
    """A Kube whose reads of cluster-scoped kinds watched whole (the PoolController's GpuNodePools
    and Nodes) come from a `WatchCache`: listed once, then kept by the watch (and each relist); label
    selection by equality, as a pool's nodeSelector is. Everything else goes to the API."""

    def __init__(self, kube: Kube, watched: WatchCache, kinds: tuple[str, ...]):
        self.kube, self.watched, self.kinds = kube, watched, kinds

    def __getattr__(self, name: str) -> Any:   # apply, merge_patch...: straight to the API
        return getattr(self.kube, name)

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        if kind not in self.kinds or namespace:
            return self.kube.get(kind, namespace, name)
        self.watched.fill(self.kube, kind, None)
        return self.watched.get(kind, None, name)

    def list(self, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None,
             label_selector: str | None = None) -> list[dict]:
        if kind not in self.kinds or namespace or label_selector:
            return self.kube.list(kind, namespace, labels=labels, label_selector=label_selector)
        self.watched.fill(self.kube, kind, None)
        return self.watched.select(kind, None, labels or {})
