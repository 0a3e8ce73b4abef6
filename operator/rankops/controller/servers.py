"""Reconcile one SharedServer (issue 42): read, plan (serverplan.plan_server, pure), execute, and
return what to record (server_status, pure).

    read: the server; its members (the RankingModels naming it, from the models' watch) in arrival
          order, each with the version the server's status says it holds; its pods (its own watch);
          its ConfigMap as last written (the ports and files the plan keeps); its pool
    plan: ServerPods.round reads each ready pod's repository index (bounded) and plans
    execute: its objects applied all or nothing (writes.Writes, owned by the server), a departed
          member's Service and EndpointSlice deleted, the loads and unloads sent on workers

A member's own reconcile renders nothing and reads its line of the server's status
(modelplan.member_plan); the controller kicks the members whose line changed.
"""
from __future__ import annotations

import base64
import datetime as dt
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rankops import server_autoscale, server_status, server_switch, serverplan
from rankops.api.base import unknown_fields_message
from rankops.api.errors import describe
from rankops.api.gpunodepool import GpuNodePool
from rankops.api.phases import DegradedReason
from rankops.api.rankingmodel import RankingModel
from rankops.api.sharedserver import SharedServer, SharedServerStatus
from rankops.controller import writes
from rankops.controller.kube import ApiError, Kube
from rankops.controller.server_switches import Switches
from rankops.controller.shared_pods import LoadConfig, ServerPod, ServerPods
from rankops.fetcher.members import parse_members
from rankops.fetcher.stager import StageListError
from rankops.render import names, serving
from rankops.render.policy import TenantPolicy, server_problems
from rankops.render.shared_server import (CONFIGS_KEY, MEMBERS_KEY, ROUTES_KEY, FrozenMember, clients_by_port,
                                          parse_configs, served_sha256)
from rankops.rollout.readiness import pod_ready
from rankops.rollout.record import Event, iso
from rankops.triton.repository import config_json
from rankops.triton.route import RouteError, parse_routes

REFUSED_RETRY_S = 30.0   # a write of its objects the API server refused: tried again (writes.Writes paces it)


@dataclass
class Result:
    status: SharedServerStatus
    events: list[Event] = field(default_factory=list)
    write: bool = True
    requeue_after: float | None = None
    polls: bool = False
    changed_members: tuple[str, ...] = ()     # members whose status line changed: their reconcile reads it


class ServerMemory:
    """What the ServerController remembers per server (by uid), lost on a restart at the cost of a
    read: each server's pod shell, its API key, the specs its held members last validated with."""

    def __init__(self, load_config: LoadConfig = config_json, kick: Callable[[str], None] = lambda uid: None,
                 wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        self.load_config, self.kick = load_config, kick
        self.wall_clock = wall_clock        # when each pod's counters were read (a rate's window)
        self.readings: dict[str, dict[str, Any]] = {}   # server uid -> its pods' last counters (autoscaling)
        self.shells: dict[str, ServerPods] = {}
        self.switches: dict[str, Switches] = {}        # server uid -> its members' switches in flight
        self.keys: dict[str, str] = {}
        self.last_valid: dict[str, Any] = {}        # member uid -> its last valid RankingModelSpec
        self.writes = writes.Writes()

    def shell(self, uid: str, key: str, staging_wait_s: float) -> ServerPods:
        shell = self.shells.get(uid)
        if shell is None or shell.staging_wait_s != staging_wait_s or shell.headers != {serving.API_KEY_HEADER: key}:
            if shell is not None:
                shell.close()
            shell = self.shells[uid] = ServerPods({serving.API_KEY_HEADER: key}, staging_wait_s,
                                                  load_config=self.load_config, on_done=lambda: self.kick(uid))
        return shell

    def forget(self, uid: str) -> None:
        shell = self.shells.pop(uid, None)
        if shell is not None:
            shell.close()
        self.keys.pop(uid, None)
        self.readings.pop(uid, None)
        switches = self.switches.pop(uid, None)
        if switches is not None:
            switches.close()
        self.writes.forget(uid)


def members_of(models: Sequence[dict[str, Any]], namespace: str, server: str) -> list[dict[str, Any]]:
    """The RankingModels of `namespace` naming `server`, in arrival order (creation, then name), not being deleted."""
    named = [m for m in models if (m.get("metadata") or {}).get("namespace") == namespace
             and ((m.get("spec") or {}).get("server") == server)
             and not m["metadata"].get("deletionTimestamp")]
    return sorted(named, key=lambda m: (m["metadata"].get("creationTimestamp") or "", m["metadata"]["name"]))


def server_pod(pod: dict[str, Any]) -> ServerPod:
    meta, status = pod["metadata"], pod.get("status") or {}
    return ServerPod(meta["name"], meta.get("uid", ""), status.get("podIP") or "", pod_ready(pod),
                     (pod.get("spec") or {}).get("nodeName"), bool(meta.get("deletionTimestamp")))


def reconcile(kube: Kube, body: dict[str, Any], models: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]],
              memory: ServerMemory, policy: TenantPolicy = TenantPolicy(), now: dt.datetime | None = None) -> Result:
    """`models`: the RankingModels of the server's namespace as watched; `pods`: the server's."""
    now = now or dt.datetime.now(dt.timezone.utc)
    meta = body["metadata"]
    namespace, name, uid, generation = meta["namespace"], meta["name"], meta["uid"], meta.get("generation")
    old, unknown = SharedServerStatus.from_stored(body.get("status") or {})
    events = [Event("Warning", "StatusFieldsUnknown", unknown_fields_message(unknown))] if unknown else []
    try:
        server = SharedServer.model_validate({"metadata": meta, "spec": body.get("spec") or {}})
    except ValidationError as exc:
        return _blocked(old, DegradedReason.INVALID_SPEC, "; ".join(describe(exc)) + " (fix the spec; what serves is "
                        "left as it was)", generation, now, events)
    spec = server.spec
    refused = server_problems(spec, policy)
    if refused:
        return _blocked(old, DegradedReason.NOT_ALLOWED_ON_THIS_CLUSTER, "; ".join(refused) + " (what serves is left "
                        "as it was)", generation, now, events)
    requirements = None
    if spec.node_pool:
        pool = kube.get("GpuNodePool", None, spec.node_pool)
        if pool is None:
            return _blocked(old, DegradedReason.NODE_POOL_NOT_FOUND, f"GpuNodePool {spec.node_pool} does not exist: "
                            "create it or fix spec.nodePool; what serves is left as it was", generation, now, events)
        try:
            requirements = GpuNodePool.model_validate({"metadata": pool["metadata"], "spec": pool.get("spec") or {}})\
                .spec.requirements
        except ValidationError as exc:
            return _blocked(old, DegradedReason.NODE_POOL_INVALID, f"GpuNodePool {spec.node_pool} has an invalid spec "
                            f"({'; '.join(describe(exc))})", generation, now, events)
    placement = serving.pool_placement(spec.node_pool, requirements, spec.triton_image)

    found = [_member_read(body_of, memory) for body_of in members_of(models, namespace, name)]
    held = server_status.held_versions(old)
    views, unreadable = serverplan.member_views(found, held, memory.last_valid,
                                                {line.name: line.config_digest for line in old.members if line.config_digest},
                                                {line.name: record for line in old.members
                                                 if (record := server_switch.record_of(line)) is not None},
                                                {line.name: server_switch.acted_in(line) for line in old.members})
    named = {m["metadata"]["uid"] for m in models}
    for uid_gone in [u for u in memory.last_valid if u not in named]:
        del memory.last_valid[uid_gone]

    config = kube.get("ConfigMap", namespace, names.server_name(name))
    ports, staged, configs = _written(config, name)
    frozen = ()
    if unreadable:      # held, and no valid spec of it known here: served as it was, its clients as admitted
        clients = clients_by_port(kube.get("NetworkPolicy", namespace, names.server_name(name)))
        served = {line.name: line.served_sha256 for line in old.members}
        entries = {s.model: s for s in staged}
        records = {line.name: server_switch.record_of(line) for line in old.members}
        frozen = tuple(FrozenMember(m.name, held[m.name], m.error, clients.get(ports.get(m.name), ()),
                                    _served_config(name, configs.get(m.name), entries.get(m.name), served.get(m.name)),
                                    records.get(m.name))
                       for m in unreadable)
    key = _api_key(kube, server, memory)
    shell = memory.shell(uid, key, float(spec.fetch.deadline_seconds))
    seen_pods = [server_pod(p) for p in pods]
    read_began = time.monotonic()       # a switch's load that ended after this is not in this read's indexes
    pods_read = shell.read(seen_pods, [*(v.name for v in views), *(f.name for f in frozen)],
                           {line.name: line.config_digest for line in old.members if line.config_digest})
    load = _load_seen(shell, spec, old, seen_pods,
                      [*(v.name for v in views if v.held_version), *(f.name for f in frozen)],
                      now, memory.wall_clock, memory.readings.get(uid))
    if load is not None and load.reading is not None:
        memory.readings[uid] = dict(load.reading)
    switches = memory.switches.setdefault(uid, Switches(memory.load_config))
    seen = switches.seen(views, seen_pods, pods_read, read_began, shell, namespace, {serving.API_KEY_HEADER: key},
                         route_port=lambda pod, member: ports.get(member))
    services = kube.list("Service", namespace)
    plan = serverplan.plan_server(name, namespace, spec, views, pods_read, ports, placement, policy, staged,
                                  taken=_taken(services, uid), frozen=frozen, replicas_now=old.replicas or 0,
                                  load=load, previous_configs=configs, switch_seen=seen, now=now)
    try:         # the objects first: a refused write sends no load or unload either
        memory.writes.apply_all(kube, meta, [_owned(obj, server) for obj in plan.objects])
    except writes.ChildRefused as exc:
        result = _blocked(old, DegradedReason.CHILD_REFUSED, str(exc), generation, now, events)
        result.requeue_after = REFUSED_RETRY_S
        return result
    shell.adopt(switches.confirmed(plan.adopted))
    shell.execute(plan)
    switches.execute(plan.switches, plan.switch_configs)
    _delete_departed(kube, namespace, name, {m.name for m in plan.members if m.port is not None}, services)

    decided = server_status.server_status(plan, old, generation, iso(now))
    return Result(decided.status, [*events, *decided.events],
                  requeue_after=serverplan.next_look_s(plan, bool(shell.unread), shell.next_due_s()),
                  changed_members=server_status.changed_members(old, decided.status))


def _load_seen(shell: ServerPods, spec: Any, old: SharedServerStatus, pods: Sequence[ServerPod],
               held: Sequence[str], now: dt.datetime, wall_clock: Callable[[], dt.datetime],
               previous: dict[str, Any] | None) -> serverplan.LoadSeen | None:
    """The pods' load for spec.autoscaling: each ready pod's metrics read when a reading is due."""
    if not spec.autoscaling.enabled:
        return None
    if not server_autoscale.reading_due(spec, old.autoscaling, now):
        return serverplan.LoadSeen(now, old.autoscaling)
    reading, problems, not_asked = shell.read_load(pods, held, wall_clock)
    return serverplan.LoadSeen(now, old.autoscaling, reading, previous, problems, not_asked)


def _member_read(body: dict[str, Any], memory: ServerMemory) -> serverplan.MemberRead:
    """A member as read, its spec validated; a valid spec is remembered (memory.last_valid)."""
    meta = body["metadata"]
    manual = {k: v for k in server_switch.MANUAL_ANNOTATIONS
              if isinstance(v := (meta.get("annotations") or {}).get(k), str)}
    try:
        spec = RankingModel.model_validate({"metadata": meta, "spec": body.get("spec") or {}}).spec
    except ValidationError as exc:
        return serverplan.MemberRead(meta["name"], meta["uid"], None, "; ".join(describe(exc)), manual)
    memory.last_valid[meta["uid"]] = spec
    return serverplan.MemberRead(meta["name"], meta["uid"], spec, manual=manual)


def _blocked(old: SharedServerStatus, reason: str, message: str, generation: int | None, now: dt.datetime,
             events: list[Event]) -> Result:
    decided = server_status.blocked(old, reason, message, generation, iso(now))
    return Result(decided.status, [*events, *decided.events])


def _served_config(server: str, text: str | None, entry: Any, full: str | None) -> str | None:
    """A frozen member's config from configs.json, only when it and its members.json entry are what its
    pods serve (the full hash the operator wrote in the server's status): anyone who may edit the
    ConfigMap could write another config, or other files."""
    if text is None or entry is None or full is None:
        return None
    return text if served_sha256(server, text, entry) == full else None


def _written(config: dict[str, Any] | None, server: str) -> tuple[dict[str, int], tuple[Any, ...], dict[str, str]]:
    """The ports (member -> port), staged members and served configs the ConfigMap holds; nothing of
    what cannot be read."""
    data = (config or {}).get("data") or {}
    try:
        ports = {model: port for port, model in parse_routes(data.get(ROUTES_KEY) or "{}").items()}
    except (RouteError, RecursionError):     # whoever may edit the ConfigMap may nest it past the parser
        ports = {}
    try:
        staged = parse_members(data[MEMBERS_KEY], server) if data.get(MEMBERS_KEY) else ()
    except StageListError:
        staged = ()
    return ports, staged, parse_configs(data.get(CONFIGS_KEY))


def _owned(obj: dict[str, Any], server: SharedServer) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [{"apiVersion": server.api_version, "kind": server.kind,
                                           "name": server.name, "uid": server.metadata["uid"],
                                           "controller": True, "blockOwnerDeletion": True}]
    return obj


def _api_key(kube: Kube, server: SharedServer, memory: ServerMemory) -> str:
    """The server's restricted-API key (its pods read it from the Secret): made once with a random
    key and owned by the server; read back when it exists already."""
    uid, namespace = server.metadata["uid"], server.metadata["namespace"]
    if uid in memory.keys:
        return memory.keys[uid]
    secret_name = names.api_key_secret_name(names.server_name(server.name))
    key = secrets.token_hex(32)
    try:
        kube.create(_owned(serving.api_key_secret(names.server_name(server.name), namespace, key), server))
    except ApiError as exc:
        if exc.status != 409:
            raise
        found = kube.get("Secret", namespace, secret_name) or {}
        stored = (found.get("data") or {}).get(serving.API_KEY_SECRET_KEY)
        if stored is None:
            raise ApiError(409, f"Secret {secret_name} holds no {serving.API_KEY_SECRET_KEY}") from None
        key = base64.b64decode(stored).decode()
    memory.keys[uid] = key
    return key


def _taken(services: Sequence[dict[str, Any]], server_uid: str) -> dict[str, str]:
    """Service name -> who holds it, for the namespace's Services the server does not own."""
    taken = {}
    for service in services:
        owner = next((o for o in service["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        if owner is None or owner.get("uid") != server_uid:
            taken[service["metadata"]["name"]] = f"{owner['kind']} {owner['name']}" if owner else "no owner"
    return taken


def _delete_departed(kube: Kube, namespace: str, server: str, held: set[str], services: Sequence[dict[str, Any]]) -> None:
    """A member that left (or was never held) has no Service or EndpointSlice of the server's.
    `services`: the namespace's, as listed this round."""
    selector = f"{names.LABEL_SERVER}={server}"
    for service in services:
        labels = service["metadata"].get("labels") or {}
        model = labels.get(names.LABEL_MODEL)
        if labels.get(names.LABEL_SERVER) == server and model and model not in held:
            kube.delete("Service", namespace, service["metadata"]["name"])
    for slice_ in kube.list("EndpointSlice", namespace, label_selector=selector):
        model = (slice_["metadata"].get("labels") or {}).get(names.LABEL_MODEL)
        if model and model not in held:
            kube.delete("EndpointSlice", namespace, slice_["metadata"]["name"])
