"""The plan pool: the shapes planned, by the digest of their inputs, and the thread that plans them,
so planning one model never holds a thread that serves others.

A reconcile asks `resolve` for its shape. Most find it kept (the planner is deterministic: the same
inputs give the same shape, or fail the same way), or recorded in status.plan (a restarted
operator). A plan still to make is made on the pool's thread (`done` given): the reconcile ends at
once (PlanPending), changing nothing, and each model that asked is reconciled again when the plan
is made (`done`, the work queue's kick). One plan per digest is made at a time, however many
models ask. Without `done` (tests, `rankops render`-like callers), a plan is made in the caller.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable

from rankops.api.planning import PlanStatus
from rankops.render import planned
from rankops.render.desired import RenderError, ResolvedShape, resolve_shape

log = logging.getLogger("rankops.plans")
SHAPES_KEPT = 4096

Kept = tuple[ResolvedShape, PlanStatus | None]


class PlanPending(Exception):
    """The plan is being made; the model is reconciled again when it is."""


class Plans:
    def __init__(self, done: Callable[[Hashable], None] | None = None, workers: int = 1, kept: int = SHAPES_KEPT):
        self._done = done
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rankops-plan") if done is not None else None
        self._lock = threading.Lock()
        self._kept = kept
        self._shapes: OrderedDict[str, Kept | RenderError] = OrderedDict()   # digest -> shape, or why none
        # digest -> the models that asked for it, in the order they asked
        self._waiting: dict[str, dict[Hashable, None]] = {}

    def resolve(self, spec: Any, profile: dict[int, float] | None, recorded: PlanStatus | None = None,
                who: Hashable = None) -> Kept:
        """The shape to serve and the status.plan that says why (`recorded`: the status.plan now).
        RenderError: no shape can be made; PlanPending: it is being made on the pool's thread."""
        digest = planned.inputs_digest(spec, profile)
        if digest is None:   # nothing to plan (or planning refuses: resolve_shape says why)
            resolved = resolve_shape(spec, profile)
            return resolved, planned.plan_status(resolved)
        with self._lock:
            kept = self._shapes.get(digest)
            if kept is not None:
                self._shapes.move_to_end(digest)
        if isinstance(kept, RenderError):
            raise RenderError(str(kept))
        if kept is not None:
            return kept
        resolved = planned.from_status(spec, recorded, digest)
        if resolved is not None:
            self._keep(digest, (resolved, recorded))
            return resolved, recorded
        if self._pool is None:
            return self._plan(spec, profile, digest)
        self._ask(digest, lambda: self._plan(spec, profile, digest), who)
        raise PlanPending(digest)

    def pending(self, digest: str) -> bool:
        with self._lock:
            return digest in self._waiting

    def _keep(self, digest: str, kept: Kept | RenderError) -> None:
        with self._lock:
            self._shapes[digest] = kept
            while len(self._shapes) > self._kept:
                self._shapes.popitem(last=False)

    def _plan(self, spec: Any, profile: dict[int, float] | None, digest: str) -> Kept:
        started = time.monotonic()
        try:
            resolved = resolve_shape(spec, profile)
        except RenderError as exc:
            self._keep(digest, exc)
            raise
        except Exception as exc:   # a planner bug: said as PlanFailed, not retried on every reconcile
            self._keep(digest, RenderError(f"the planner failed: {type(exc).__name__}: {exc}"))
            raise
        kept = (resolved, planned.plan_status(resolved, digest))
        self._keep(digest, kept)
        # Said once per plan made (a reconcile that reuses one says nothing): how often and how long it plans.
        log.info(f"planned inputs {digest[:12]} in {time.monotonic() - started:.2f} s: maxBatchSize "
                 f"{resolved.shape.max_batch_size}, {resolved.shape.instances_per_gpu} instance(s)/GPU, "
                 f"{resolved.replicas} replica(s)")
        return kept

    def _ask(self, digest: str, make: Callable[[], Any], who: Hashable) -> None:
        """Make the plan `digest` unless it is being made already; then reconcile `who` again."""
        with self._lock:
            waiting = self._waiting.get(digest)
            if waiting is not None:
                waiting.setdefault(who, None)
                return
            self._waiting[digest] = {who: None}
        self._pool.submit(self._make, digest, make)

    def _make(self, digest: str, make: Callable[[], Any]) -> None:
        try:
            make()
        except Exception as exc:  # noqa: BLE001 - kept as the plan's failure; the reconcile says why
            log.warning(f"planning {digest[:12]} failed: {exc}")
        finally:
            with self._lock:
                waiting = self._waiting.pop(digest, {})
        for who in sorted(waiting, key=repr):
            self._done(who)
