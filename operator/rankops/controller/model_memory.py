"""What the model controller's process remembers across reconciles: requests and log lines saved,
never a decision (a restarted operator reconciles correctly from the status alone)."""
from __future__ import annotations

import logging
import time
from typing import Any

from rankops.controller import pod_metrics, writes
from rankops.controller.plans import Plans

log = logging.getLogger("rankops.models")

MONITOR_REAPPLY_S = 600.0


class ModelMemory:
    """What this process remembers across the reconciles of its models (the ModelController owns
    one): nothing in it is needed for a correct reconcile, it saves requests and repeated lines.

    - `writes`: the children last applied and refused, per model (controller/writes.py).
    - `plans`: the plan pool (controller/plans.py), which keeps the shapes planned; by default one
      that plans in the reconcile's own thread.
    - `monitors_applied`: ServiceMonitors applied, by (namespace, name): the digest of what was
      applied, when, and the model (name, uid) it is for. They are applied again when it changes,
      after MONITOR_REAPPLY_S, or when `monitors_gone` finds one deleted; not on every reconcile.
    - `monitoring_notes`: what _apply_monitoring has logged, so a missing CRD or right is one line
      per process, not one per reconcile; a success clears it, so the same problem coming back is
      logged again. `secrets_unchecked`: that Secrets may not be read was said.
    - `metrics`: the serving pods' Triton metrics, read bounded and off the reconcile
      (controller/pod_metrics.py).
    - `in_place`, `in_place_keys`: an in-place switch's executor and key (controller/inplace_shell.py);
      a restarted operator reads the pods' indexes again, and gates without a verdict run again.
    """

    def __init__(self, writes_memory: writes.Writes | None = None, clock=time.monotonic,
                 metrics: pod_metrics.PodMetrics | None = None, plans: Plans | None = None):
        self.writes = writes_memory or writes.Writes()
        self.metrics = metrics or pod_metrics.PodMetrics()   # without a kick: read at once, bounded
        self.plans = plans or Plans()
        self.clock = clock
        self.secrets_unchecked = False
        self.monitoring_notes: set[str] = set()
        self.monitors_applied: dict[tuple[str, str], tuple[str, float, str, str]] = {}
        self.api_keys: set[str] = set()          # uids whose restricted-API key Secret is known to exist
        self.network_policies: set[str] = set()  # uids whose NetworkPolicy this process applied
        # rollout.strategy inPlace (controller/inplace_shell.py): each switching model's executor (its
        # requests in flight and the gates' verdicts), and the restricted-API keys read back for it.
        self.in_place: dict[str, Any] = {}
        self.in_place_keys: dict[str, str] = {}

    def monitors_gone(self, present: set[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """(namespace, model, uid) of the models whose applied ServiceMonitor is no longer listed
        (`present`: the rankops ServiceMonitors the API server lists); forgotten, so their next
        reconcile applies it again. ServiceMonitors are not watched (their CRD is optional)."""
        gone = [key for key in list(self.monitors_applied) if key not in present]
        return [(key[0], *self.monitors_applied.pop(key)[2:]) for key in gone]

    def note(self, key: str, level: int, message: str) -> None:
        if key not in self.monitoring_notes:
            self.monitoring_notes.add(key)
            log.log(level, message)
