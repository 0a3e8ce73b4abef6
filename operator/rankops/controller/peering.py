"""A standby replica: kopf peering, so of several `rankops run` processes exactly one acts.

kopf pauses an operator while a live peer of higher priority is in the same peering object,
and pauses all of them while two share the highest priority. Replicas of one Deployment are
alike, so each draws its own random priority: the highest acts, the others stand by with their
watches stopped and take over when its record goes (at once when it exits cleanly, it removes
itself; after `lifetime` seconds without a keep-alive when it is killed). A peered operator
starts paused until it has read the peering object, so a newcomer never acts before it knows
whether another one already does.
"""
from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Callable

import kopf

from rankops.controller.kube import ApiError, ApiMissing, Kube

GROUP, VERSION = "kopf.dev", "v1"
MAX_PRIORITY = 2**31 - 1


def random_priority() -> int:
    # Two replicas drawing the same number would both pause: 1 in 2^31.
    return random.SystemRandom().randint(1, MAX_PRIORITY)


@dataclass(frozen=True)
class Peering:
    name: str
    priority: int
    lifetime: int


def peering_objects(name: str, namespaces: list[str]) -> list[tuple[str | None, dict]]:
    """(namespace or None, body) of the peering objects kopf needs: one ClusterKopfPeering
    cluster-wide, or a KopfPeering in each watched namespace."""
    if not namespaces:
        return [(None, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterKopfPeering", "metadata": {"name": name}})]
    return [(ns, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KopfPeering", "metadata": {"name": name, "namespace": ns}})
            for ns in namespaces]


def ensure_peering_objects(kube: Kube, name: str, namespaces: list[str]) -> None:
    """Create the peering objects that do not exist yet (kopf only patches them)."""
    for namespace, body in peering_objects(name, namespaces):
        where = f"in namespace {namespace}" if namespace else "cluster-wide"
        try:
            kube.create(body)
        except ApiMissing:
            raise RuntimeError(f"cannot create the kopf peering object {name!r} {where}: this cluster does not "
                               "serve kopf.dev/v1 (are the chart's kopf.dev CRDs installed?)") from None
        except ApiError as exc:
            if exc.status != 409:  # another replica created it first
                raise RuntimeError(f"cannot create the kopf peering object {name!r} {where}: "
                                   f"{exc.status} {exc.reason} (are the chart's kopf.dev CRDs installed?)") from exc


KOPF_PEERING_LOGGER = "kopf._core.engines.peering"
PAUSING = ("Pausing operations", "Pausing all operators")   # kopf's words as it pauses this replica
RESUMING = "Resuming operations"


class PauseState(logging.Filter):
    """Whether kopf keeps this replica paused. kopf has no API for it; its peering engine logs each
    pause and resume (the lines e2e/test_standby reads), so this filter on that logger follows them.
    Work that kopf does not drive itself (the watch-event kicks, their retry timers) asks it before
    it acts: a standby writes nothing. Every watched namespace's peering object pauses together (the
    replicas of one Deployment watch the same namespaces), so one flag is enough."""

    def __init__(self, paused: bool = False):
        super().__init__()
        self._paused = threading.Event()
        if paused:
            self._paused.set()
        # Called as this replica is paused: what it remembers of the cluster stops being kept
        # up to date (its watches stop) while a peer acts.
        self.on_pause: list[Callable[[], None]] = []

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def set(self, paused: bool) -> None:
        was = self.paused
        (self._paused.set if paused else self._paused.clear)()
        if paused and not was:
            for forget in self.on_pause:
                forget()

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(PAUSING):
            self.set(True)
        elif message.startswith(RESUMING):
            self.set(False)
        return True   # the line is logged as before


def follow_pauses(state: PauseState) -> None:
    """A peered operator starts paused until kopf has read the peering object (and then logs its
    resume); kopf's INFO lines must be made to be seen, whatever the log level."""
    state.set(True)
    logger = logging.getLogger(KOPF_PEERING_LOGGER)
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    if state not in logger.filters:
        logger.addFilter(state)


def register(peering: Peering, state: PauseState) -> None:
    """kopf reads the keep-alive lifetime from its settings, set at startup; from now on `state`
    (the controllers') follows kopf's pauses of this replica."""
    follow_pauses(state)

    @kopf.on.startup()
    def peering_lifetime(settings: kopf.OperatorSettings, **_):
        settings.peering.lifetime = peering.lifetime
