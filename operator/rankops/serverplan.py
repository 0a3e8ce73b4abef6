"""What one pod of a shared tritonserver must load and unload, and each member's state in it (issue 42).

Pure, level-based: from the members the server should hold (model -> Triton version) and the
pod's repository index (triton/repository.py, read from the pod and checked), the loads and
unloads that bring the pod there. Running it again on the converged index asks for nothing.

A member's state in a pod:
- Serving: its wanted version is READY (an older version may still be there during a reload).
- Loading: its wanted version is LOADING (or UNLOADING: a transition, not loaded again meanwhile).
- Failed: Triton tried and refused it (UNAVAILABLE with a reason other than "unloaded"): its
  artifact missing or corrupt, its config refused, the device out of memory. The other members are
  untouched: Triton loads and fails models one by one. A failed member is not loaded again on every
  round (`retry_failed`): its spec or artifact changes, or the caller's backoff says when.
- Absent: the pod has never loaded it, or it was unloaded (Failed instead when its last load was refused).
Every model the pod holds that is not a member is unloaded: a member removed, or a model nobody named;
a member serving its version beside another READY one is loaded again, which drops the other.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rankops.triton.repository import IndexEntry

SERVING, LOADING, FAILED, ABSENT = "Serving", "Loading", "Failed", "Absent"
UNLOADED = "unloaded"           # the reason Triton gives a version it unloaded on request


@dataclass(frozen=True)
class MemberState:
    model: str
    state: str                  # SERVING | LOADING | FAILED | ABSENT
    reason: str = ""            # Triton's, when FAILED


@dataclass(frozen=True)
class PodActions:
    load: tuple[str, ...] = ()      # members to load (or reload at their wanted version), by name
    unload: tuple[str, ...] = ()    # models the pod holds that are not members

    @property
    def nothing(self) -> bool:
        return not self.load and not self.unload


def member_state(model: str, version: int, index: Iterable[IndexEntry], load_error: str = "") -> MemberState:
    """`load_error`: the pod's answer to the last load of this version, when it refused it. Triton lists
    no version for a model whose version directory is missing (the artifact never came), so the
    refusal is the only word of that failure."""
    entry = next((e for e in index if e.name == model and e.version == version), None)
    if entry is not None and entry.state == "READY":
        return MemberState(model, SERVING)
    if entry is not None and entry.state in ("LOADING", "UNLOADING"):     # in transition: not loaded again
        return MemberState(model, LOADING, entry.state.lower())
    if load_error:
        return MemberState(model, FAILED, load_error)
    if entry is not None and entry.reason and entry.reason != UNLOADED:
        return MemberState(model, FAILED, entry.reason)
    return MemberState(model, ABSENT)


def pod_actions(members: Mapping[str, int], index: Iterable[IndexEntry], load_errors: Mapping[str, str] | None = None,
                retry_failed: bool = False) -> PodActions:
    """The loads and unloads that make the pod hold exactly `members` (model -> Triton version);
    `load_errors`: member -> the pod's refusal of its last load."""
    entries, errors = list(index), load_errors or {}
    load = []
    for model, version in sorted(members.items()):
        state = member_state(model, version, entries, errors.get(model, "")).state
        stale = any(e.name == model and e.version != version and e.state == "READY" for e in entries)
        if state == ABSENT or (state == FAILED and retry_failed) or (state == SERVING and stale):
            # a load's version policy names the one version: Triton drops the others as it loads
            load.append(model)
    held = {e.name for e in entries if e.state in ("READY", "LOADING")}
    return PodActions(tuple(load), tuple(sorted(held - set(members))))
