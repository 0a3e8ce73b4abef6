"""The watch streams of the busiest kinds, without kopf: a model's Deployments, Services, Jobs,
budgets and pods, and a shared server's pods and Deployments.

kopf hands every watch event through its per-object machinery (a task per object, its loggers,
memories, cause detection and handler matching), and it watches every object of a kind in the
cluster, filtering by label in the operator. For these kinds an event's only use is the watch
cache (controller/cache.py) and a kick, so they are watched here: the API server selects them by
label, and a thread per stream lists them, then watches from the listing's resourceVersion and
hands each event on as kopf did (type None: seen by the listing; the listing is redone after a
410 Gone and on resuming from a peering pause, as kopf's is).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from rankops.controller import fastjson
from rankops.controller.kube import KINDS, ApiError, Kube, open_stream

WATCH_TIMEOUT_S = 300      # the API server ends each watch after this; it is resumed where it was
LIST_PAGE = 500            # objects per listing page
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)   # after a failed list or watch: the next wait, then the last one again
PAUSE_POLL_S = 1.0
PATTERN_CHARACTERS = "*?!,"   # kopf's namespace globs: `team-*`, `!kube-*`, `a,b`

log = logging.getLogger("rankops.watches")


@dataclass(frozen=True)
class Stream:
    """One kind, the objects carrying `label` (any value), and what each event goes to: a dict
    {"type": None | "ADDED" | "MODIFIED" | "DELETED", "object": ...}, as kopf's event handlers got it."""
    kind: str
    label: str
    deliver: Callable[[dict[str, Any]], None]


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Watch(threading.Thread):
    """One stream in one namespace (None: every namespace), for as long as the process runs."""

    def __init__(self, kube: Kube, stream: Stream, namespace: str | None = None,
                 paused: Callable[[], bool] = lambda: False):
        super().__init__(daemon=True, name=f"watch-{stream.kind.lower()}-{stream.label.rsplit('/', 1)[-1]}")
        self.kube, self.stream, self.namespace, self.paused = kube, stream, namespace, paused
        self.path = KINDS[stream.kind].path(namespace)
        self.version = ""                   # the last resourceVersion handed on ("": list first)
        self.stopping = threading.Event()
        self.listed = threading.Event()   # set once the first listing was handed on

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            if self.paused():
                self.version = ""   # what this replica held is forgotten while paused: listed again on resuming
                self.stopping.wait(PAUSE_POLL_S)
                continue
            try:
                if not self.version:
                    self.version = self._list()
                    self.listed.set()
                self._watch()
                failures = 0
            except Expired:
                self.version = ""
            except Exception as exc:  # noqa: BLE001 - unreachable, refused, reset: tried again, never given up
                wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                log.warning("watch of %s (label %s%s) failed, again in %.0f s: %s", self.stream.kind,
                            self.stream.label, f", namespace {self.namespace}" if self.namespace else "", wait, exc)
                self.stopping.wait(wait)

    def _list(self) -> str:
        """Every object now, handed on as kopf's listing was (type None); the listing's resourceVersion."""
        token, version = "", ""
        while True:
            items, at, token = self.kube.list_page(self.stream.kind, self.namespace, self.stream.label,
                                                   limit=LIST_PAGE, token=token)
            version = version or at     # every page is of the first one's snapshot
            for item in items:
                self._deliver({"type": None, "object": item})
            if not token:
                return version

    def _watch(self) -> None:
        """Events from `version` on, until the server ends the watch; `version` follows them (and the
        bookmarks), so the next watch resumes after the last event handed on."""
        query = [("labelSelector", self.stream.label), ("watch", "true"), ("resourceVersion", self.version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(WATCH_TIMEOUT_S))]
        try:
            response = open_stream(self.kube.api, self.path, query, timeout=WATCH_TIMEOUT_S + 30)
        except ApiError as exc:
            if exc.status == 410:
                raise Expired() from exc
            raise
        try:
            for line in lines(response):
                if self.stopping.is_set() or self.paused():
                    raise Expired()
                event = fastjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired()
                    raise ApiError(int(obj.get("code") or 0), str(obj.get("message") or obj.get("reason") or ""))
                if kind != "BOOKMARK":
                    self._deliver(event)
                self.version = str((obj.get("metadata") or {}).get("resourceVersion") or self.version)
        finally:
            response.release_conn()

    def _deliver(self, event: dict[str, Any]) -> None:
        try:
            self.stream.deliver(event)
        except Exception:  # noqa: BLE001 - one event's handler failing must not end the stream
            meta = (event.get("object") or {}).get("metadata") or {}
            log.exception("handling a %s event of %s %s/%s failed", event.get("type") or "listing", self.stream.kind,
                          meta.get("namespace"), meta.get("name"))


def lines(response: Any) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch response, as they come."""
    buffer = b""
    for chunk in response.stream(65536):
        buffer += chunk
        if b"\n" not in chunk:
            continue
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


def is_pattern(namespace: str) -> bool:
    """A namespace given to `rankops run -n` that is one of kopf's patterns, not a name."""
    return any(c in namespace for c in PATTERN_CHARACTERS)


def start(kube: Kube, streams: list[Stream], namespaces: list[str],
          paused: Callable[[], bool] = lambda: False) -> list[Watch]:
    """A thread per stream and namespace watched (none named: one for the whole cluster), started.
    Namespace patterns (kopf's globs: `team-*`, `!kube-*`; they need cluster-wide read access) are
    watched cluster-wide and matched here, as kopf matches them."""
    patterns = [ns for ns in namespaces if is_pattern(ns)]
    if patterns:
        streams = [Stream(s.kind, s.label, _in_namespaces(s.deliver, namespaces)) for s in streams]
    scopes: list[str | None] = [None] if patterns or not namespaces else list(namespaces)
    watches = [Watch(kube, stream, namespace, paused) for stream in streams for namespace in scopes]
    for watch in watches:
        watch.start()
    return watches


def _in_namespaces(deliver: Callable[[dict[str, Any]], None], patterns: list[str]) -> Callable[[dict[str, Any]], None]:
    from kopf._cogs.structs.references import match_namespace

    def matched(event: dict[str, Any]) -> None:
        namespace = ((event.get("object") or {}).get("metadata") or {}).get("namespace") or ""
        if any(match_namespace(namespace, pattern) for pattern in patterns):
            deliver(event)
    return matched
