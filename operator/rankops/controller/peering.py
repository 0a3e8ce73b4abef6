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

import random
from dataclasses import dataclass

import kopf

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


def ensure_peering_objects(api_client, name: str, namespaces: list[str]) -> None:
    """Create the peering objects that do not exist yet (kopf only patches them)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api_client)
    for namespace, body in peering_objects(name, namespaces):
        try:
            if namespace is None:
                custom.create_cluster_custom_object(GROUP, VERSION, "clusterkopfpeerings", body)
            else:
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "kopfpeerings", body)
        except ApiException as exc:
            if exc.status != 409:  # another replica created it first
                where = f"in namespace {namespace}" if namespace else "cluster-wide"
                raise RuntimeError(f"cannot create the kopf peering object {name!r} {where}: "
                                   f"{exc.status} {exc.reason} (are the chart's kopf.dev CRDs installed?)") from exc


def register(peering: Peering) -> None:
    """kopf reads the keep-alive lifetime from its settings, set at startup."""
    @kopf.on.startup()
    def peering_lifetime(settings: kopf.OperatorSettings, **_):
        settings.peering.lifetime = peering.lifetime
