"""kopf's handlers: decorators only, each delegating to the controllers `rankops run` built
(controller/runtime.py), which kopf passes in its memo (`memo.models`, `memo.pools`,
`memo.operator`). Importing this module registers the handlers with kopf, and does nothing else:
it starts no thread and reads no setting.

The event handlers are async: they only note what they see and queue kicks, never wait on the
API. A sync handler runs on kopf's executor, behind the reconciles there (create handlers and
ticks, up to seconds each): at N=1000 a Deployment that became Ready was seen minutes later.
"""
from __future__ import annotations

import kopf

from rankops.api.crdgen import GROUP, VERSION
from rankops.controller import runtime, session


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_):
    runtime.configure_kopf(settings, memo.operator.workers)
    runtime.start(memo.models, memo.pools)


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs):
    # kopf's own session opens a connection per request at once, without bound (controller/session.py).
    return await session.bounded_session(memo.operator.kopf_connections, client_library=memo.operator.client_library,
                                         **kwargs)


# --- RankingModels: the ModelController's caches and queue. Their children and pods (and a
# shared server's pods and Deployments) are watched without kopf (controller/watches.py: by label,
# at a fraction of kopf's cost per event), started with the controllers above.

# The models that name an input (a pool, a latency-profile ConfigMap), so its change reconciles them.
@kopf.index(GROUP, VERSION, "rankingmodels")
def models_by_input(namespace, name, uid, spec, **_):
    keys = {}
    if spec.get("nodePool"):
        keys[("GpuNodePool", spec["nodePool"])] = (namespace, name, uid)
    profile = (spec.get("planning") or {}).get("latencyProfileConfigMap") or {}
    if profile.get("name"):
        keys[("ConfigMap", namespace, profile["name"])] = (namespace, name, uid)
    return keys


@kopf.on.event("", "v1", "configmaps")
async def configmap_event(event, models_by_input: kopf.Index, memo: kopf.Memo, **_):
    memo.models.configmap_event(event, models_by_input)


# No kopf change handler for models: those wrote two annotations and a finalizer into every new
# model (and, under load, ran the creation handler again on an older body, after their
# consistency wait); events come in order.
@kopf.on.event(GROUP, VERSION, "rankingmodels")
async def rankingmodel_event(event, memo: kopf.Memo, **_):
    memo.models.model_event(event)


# --- SharedServers: the ServerController (the models' `servers`: its members are models), fed by
# its own events, its pods' and its Deployments' (controller/watches.py); its members' events reach it
# through model_event

@kopf.on.event(GROUP, VERSION, "sharedservers")
async def sharedserver_event(event, memo: kopf.Memo, **_):
    memo.models.servers.server_event(event)


# --- GpuNodePools: the PoolController, on the same model: its queue, fed by these events, and its
# own finalizer (no kopf change handler: those kept a second reconcile path, kopf's finalizer and a
# timer task per pool)

@kopf.index(GROUP, VERSION, "gpunodepools")
def pool_selectors(name, uid, spec, **_):
    return {name: (uid, dict(spec.get("nodeSelector") or {}))}


@kopf.on.event(GROUP, VERSION, "gpunodepools")
async def gpunodepool_event(event, models_by_input: kopf.Index, pool_selectors: kopf.Index, memo: kopf.Memo, **_):
    memo.pools.pool_event(event, models_by_input, pool_selectors)


@kopf.on.event("", "v1", "nodes")
async def node_event(event, pool_selectors: kopf.Index, memo: kopf.Memo, **_):
    memo.models.node_event(event["object"], event.get("type") == "DELETED")
    memo.pools.node_event(event, pool_selectors)
