"""The one in-memory Kubernetes API the controller tests run against: all of controller.kube.Kube.

It behaves like the API server where the operator's code could tell the difference:

- objects by (kind, namespace, name), cluster-scoped kinds under namespace None; names checked as
  Kube checks them (InvalidName before any request);
- a uid per object; one resourceVersion counter for the whole cluster, bumped by each write and
  stored as a string; metadata.generation 1 on create, bumped when the spec changes;
- lists by a labels dict or a label selector ("k=v,k2!=v2,key,!key"; as Kube, a selector wins over
  the dict); a namespaced kind listed with no namespace: all namespaces; list items carry no kind;
- server-side apply: under one field manager, a field it applied before and no longer applies is
  removed unless another manager applied it too; what others wrote stays; managedFields say who;
  a dry run stores nothing; the main resource's writes leave status alone;
- RFC 7386 merge patches (None removes a key, lists are replaced), on the object (status left
  alone) or on its status subresource (only status), with a metadata.resourceVersion in the patch
  as a precondition (409 when it is not the stored one);
- 404 answered as Kube answers it: get and merge_patch None, delete False;
- deletion: an object with finalizers (or deleted in the foreground) gets a deletionTimestamp and
  stays until its finalizers are emptied; a namespace being deleted refuses new objects (403
  NamespaceTerminating);
- every request logged in `calls`; `fail` makes requests fail, `before`/`after` run a test's code
  around them (another writer between a read and a write, a controller reacting to a write).

`put`, `set_status` and `finish_deletion` are the test's and the cluster's own controllers' writes:
not requests of the operator, not logged, never failed.
"""
from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from rankops.controller.kube import KINDS, ApiError
from rankops.controller.patching import apply_merge_patch
from rankops.render import names
from rankops.render.names import FIELD_MANAGER

DELETED_AT = "2026-12-01T00:00:00Z"
OTHER_MANAGER = "kubectl"   # whoever writes with put(): not the operator
_SYSTEM_META = ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "managedFields")

Key = tuple[str, "str | None", str]


@dataclass
class Call:
    """One request: `body` what was sent (apply, create, merge_patch), `options` its query (dry_run,
    propagation, subresource, labels, label_selector), `status` how it was answered (200, 404, 409...)."""
    method: str
    kind: str
    namespace: str | None
    name: str | None
    body: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    status: int | None = None

    @property
    def dry_run(self) -> bool:
        return bool(self.options.get("dry_run"))


@dataclass
class _Rule:
    method: str
    kind: str | None
    action: Any                  # an exception to raise, or a callable(call)
    times: int | None            # None: every matching call
    name: str | None = None

    def matches(self, call: Call) -> bool:
        return (self.method == call.method and (self.kind is None or self.kind == call.kind)
                and (self.name is None or self.name == call.name))


def status_error(status: int, reason: str = "", message: str = "", causes: list[dict] | None = None) -> ApiError:
    """An ApiError as the API server answers it: a Status object for a body."""
    reason = reason or {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid",
                        500: "InternalError", 503: "ServiceUnavailable"}.get(status, "Error")
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "reason": reason,
            "message": message or reason, "details": {"causes": causes or []}}
    return ApiError(status, reason, json.dumps(body).encode())


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: `patch` applied to `target` (a new value; neither is changed)."""
    return apply_merge_patch(copy.deepcopy(target), copy.deepcopy(patch))


def _applied(old: Any, mine_before: Any, others: list[Any], new: Any) -> Any:
    """Server-side apply of `new` by one manager over `old`: lists and scalars are replaced; a key
    this manager applied before (`mine_before`) and leaves out now goes, unless another manager's
    applied configuration (`others`) has it too."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return copy.deepcopy(new)
    out = copy.deepcopy(old)
    before = mine_before if isinstance(mine_before, dict) else {}
    for key in before:
        if key not in new and not any(isinstance(o, dict) and key in o for o in others):
            out.pop(key, None)
    for key, value in new.items():
        out[key] = _applied(old.get(key), before.get(key),
                            [o.get(key) for o in others if isinstance(o, dict)], value)
    return out


def _fields(value: Any) -> dict:
    """The fieldsV1 of a configuration: {"f:spec": {"f:replicas": {}}}."""
    if not isinstance(value, dict):
        return {}
    return {f"f:{k}": _fields(v) for k, v in value.items()}


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeCluster:
    """An empty cluster; `FakeCluster(obj, ...)` puts those objects in it."""

    def __init__(self, *objects: dict):
        self.objects: dict[Key, dict] = {}
        self.calls: list[Call] = []
        self.applied: list[dict] = []      # the bodies of the applies that were stored (not dry runs)
        self._version = itertools.count(1)
        self._uids = itertools.count(1)
        self._last_version = 0
        self._configs: dict[Key, dict[str, Any]] = {}   # the last configuration each manager applied
        self._rules: list[_Rule] = []
        self._after: list[_Rule] = []
        for obj in objects:
            self.put(obj)

    # -- the test's hooks --

    def fail(self, method: str, kind: str | None, error: int | Exception, times: int | None = None,
             name: str | None = None) -> None:
        """Answer `method` requests ("get", "exists", "list", "list_versioned", "apply" (dry runs
        too), "create", "delete", "merge_patch") of `kind` (None: any) with `error`, a status (an
        ApiError with a Status body) or an exception; `times` times, or until `heal`."""
        exc = status_error(error, message=f"{method} {kind} refused by the test") if isinstance(error, int) else error
        self._rules.append(_Rule(method, kind, exc, times, name))

    def heal(self, method: str | None = None, kind: str | None = None) -> None:
        """Stop the failures `fail` asked for (of that method and kind, or all)."""
        self._rules = [r for r in self._rules if callable(r.action) or method not in (None, r.method)
                       or kind not in (None, r.kind)]

    def before(self, method: str, kind: str | None, fn: Callable[[Call], None], times: int | None = 1,
               name: str | None = None) -> None:
        """Run `fn(call)` before serving a matching request (once by default): another writer
        between the operator's read and its write, a controller that acts on reads..."""
        self._rules.append(_Rule(method, kind, fn, times, name))

    def after(self, method: str, kind: str | None, fn: Callable[[Call], None], times: int | None = None,
              name: str | None = None) -> None:
        """Run `fn(call)` after a matching request succeeded and stored something (every time by
        default): e.g. the Deployment controller rolling out what was applied."""
        self._after.append(_Rule(method, kind, fn, times, name))

    def requests(self, method: str | None = None, kind: str | None = None) -> list[Call]:
        return [c for c in self.calls if method in (None, c.method) and kind in (None, c.kind)]

    def _begin(self, call: Call) -> Call:
        self.calls.append(call)
        for rule in list(self._rules):
            if rule.matches(call):
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                if callable(rule.action):
                    rule.action(call)
                else:
                    call.status = getattr(rule.action, "status", 0)
                    raise rule.action
        return call

    def _done(self, call: Call, status: int = 200) -> None:
        call.status = status
        if status >= 300 or call.dry_run:
            return
        for rule in list(self._after):
            if rule.matches(call):
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._after.remove(rule)
                rule.action(call)

    # -- storage --

    @staticmethod
    def key(kind: str, namespace: str | None, name: str) -> Key:
        kind_ = KINDS[kind]
        kind_.path(namespace if kind_.namespaced else None, name)   # InvalidName, as Kube raises it
        return kind, (namespace if kind_.namespaced else None), name

    def _bump(self) -> str:
        self._last_version = next(self._version)
        return str(self._last_version)

    def _store(self, key: Key, obj: dict, old: dict | None, manager: str, operation: str) -> dict:
        """Write `obj` under `key` as the API server does: system fields kept or made."""
        meta = obj.setdefault("metadata", {})
        obj["kind"] = key[0]
        obj.setdefault("apiVersion", KINDS[key[0]].group_version)
        if key[0] == "Secret" and obj.get("stringData"):    # stored as data, base64, as the API server does
            import base64
            obj.setdefault("data", {}).update({k: base64.b64encode(v.encode()).decode()
                                               for k, v in obj.pop("stringData").items()})
        meta["name"] = key[2]
        if key[1] is not None:
            meta["namespace"] = key[1]
        else:
            meta.pop("namespace", None)
        if old is None:
            meta["uid"] = meta.get("uid") or f"uid-{next(self._uids)}"
            meta["creationTimestamp"] = DELETED_AT.replace("12-01", "11-01")
            meta["generation"] = 1
            meta.pop("deletionTimestamp", None)
            managers: list[dict] = []
        else:
            old_meta = old["metadata"]
            for system in ("uid", "creationTimestamp", "deletionTimestamp"):
                if system in old_meta:
                    meta[system] = old_meta[system]
                else:
                    meta.pop(system, None)
            meta["generation"] = old_meta.get("generation", 1) + (obj.get("spec") != old.get("spec"))
            managers = [m for m in old_meta.get("managedFields") or [] if m["manager"] != manager]
        configs = self._configs.get(key, {})
        fields = _fields(configs.get(manager)) if operation == "Apply" else \
            _fields({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
        meta["managedFields"] = managers + [{"manager": manager, "operation": operation, "fieldsV1": fields}]
        meta["resourceVersion"] = self._bump()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects.pop(key, None)     # its last finalizer went: so does it
            self._configs.pop(key, None)
        else:
            self.objects[key] = obj
        return copy.deepcopy(obj)

    def _namespace_open(self, key: Key) -> None:
        namespace = self.objects.get(("Namespace", None, key[1])) if key[1] else None
        if namespace and namespace["metadata"].get("deletionTimestamp") and key not in self.objects:
            raise status_error(403, "Forbidden", f'{KINDS[key[0]].plural} "{key[2]}" is forbidden: unable to create '
                               f"new content in namespace {key[1]} because it is being terminated",
                               [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                                 "message": f"namespace {key[1]} is being terminated"}])

    def put(self, obj: dict, manager: str = OTHER_MANAGER) -> dict:
        """Create or replace `obj` (its status too, or the stored status when it has none): the
        test's or a cluster controller's write. System fields are the cluster's, a uid given is kept."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = self.key(obj["kind"], meta.get("namespace"), meta["name"])
        old = self.objects.get(key)
        for system in _SYSTEM_META[1:]:
            meta.pop(system, None)
        if old is not None:
            if not meta.get("uid"):
                meta.pop("uid", None)
            if "status" not in obj and "status" in old:
                obj["status"] = copy.deepcopy(old["status"])
        return self._store(key, obj, old, manager, "Update")

    def set_status(self, kind: str, namespace: str | None, name: str, status: dict) -> dict:
        """What a controller or kubelet reports: the object's whole status replaced."""
        key = self.key(kind, namespace, name)
        obj = copy.deepcopy(self.objects[key])
        obj["status"] = copy.deepcopy(status)
        return self._store(key, obj, self.objects[key], f"{kind.lower()}-controller", "Update")

    def finish_deletion(self, kind: str, namespace: str | None, name: str) -> None:
        """The garbage collector (or whoever holds them) removes the finalizers: the object goes."""
        key = self.key(kind, namespace, name)
        obj = copy.deepcopy(self.objects[key])
        obj["metadata"]["finalizers"] = []
        self._store(key, obj, self.objects[key], "garbage-collector", "Update")

    def stored(self, kind: str, namespace: str | None, name: str) -> dict | None:
        """The object as stored, without a request (a copy)."""
        return copy.deepcopy(self.objects.get(self.key(kind, namespace, name)))

    # -- controller.kube.Kube --

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        call = self._begin(Call("get", kind, namespace, name))
        found = self.objects.get(self.key(kind, namespace, name))
        self._done(call, 200 if found else 404)
        return copy.deepcopy(found)

    def exists(self, kind: str, namespace: str | None, name: str) -> bool:
        call = self._begin(Call("exists", kind, namespace, name))
        found = self.key(kind, namespace, name) in self.objects
        self._done(call, 200 if found else 404)
        return found

    def _listed(self, kind: str, namespace: str | None, selector: str) -> list[dict]:
        KINDS[kind].path(namespace)
        items = []
        for (k, ns, _), obj in sorted(self.objects.items(), key=lambda item: (item[0][1] or "", item[0][2])):
            if k == kind and (namespace is None or not KINDS[kind].namespaced or ns == namespace) \
                    and _matches(obj["metadata"].get("labels") or {}, selector):
                item = copy.deepcopy(obj)
                item.pop("kind", None)   # a list's items carry no kind (nor apiVersion)
                item.pop("apiVersion", None)
                items.append(item)
        return items

    def list(self, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None,
             label_selector: str | None = None) -> list[dict]:
        call = self._begin(Call("list", kind, namespace, None,
                                options={"labels": labels, "label_selector": label_selector}))
        selector = label_selector or ",".join(f"{k}={v}" for k, v in (labels or {}).items())
        items = self._listed(kind, namespace, selector)
        self._done(call)
        return items

    def list_versioned(self, kind: str, namespace: str | None = None,
                       label_selector: str | None = None) -> tuple[list[dict], int]:
        call = self._begin(Call("list_versioned", kind, namespace, None, options={"label_selector": label_selector}))
        items = self._listed(kind, namespace, label_selector or "")
        for item in items:
            item["kind"] = kind   # as Kube.list_versioned puts it back
        self._done(call)
        return items, self._last_version

    def apply(self, obj: dict, dry_run: bool = False, field_manager: str = FIELD_MANAGER) -> dict:
        meta = obj["metadata"]
        call = self._begin(Call("apply", obj["kind"], meta.get("namespace"), meta["name"], copy.deepcopy(obj),
                                {"dry_run": dry_run, "field_manager": field_manager}))
        key = self.key(obj["kind"], meta.get("namespace"), meta["name"])
        self._namespace_open(key)
        old = self.objects.get(key)
        config = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("kind", "apiVersion", "status")}
        config["metadata"] = {k: v for k, v in config.get("metadata", {}).items() if k not in _SYSTEM_META}
        configs = dict(self._configs.get(key, {}))
        others = [c for m, c in configs.items() if m != field_manager]
        base = copy.deepcopy(old) if old else {}
        new = _applied(base, configs.get(field_manager), others, config)
        new["apiVersion"] = obj.get("apiVersion") or KINDS[obj["kind"]].group_version
        if old and "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        if dry_run:
            answer = copy.deepcopy(new)
            answer.setdefault("metadata", {}).update(
                {k: v for k, v in (old or {}).get("metadata", {}).items() if k in ("uid", "resourceVersion")})
            answer["kind"] = obj["kind"]
            self._done(call)
            return answer
        configs[field_manager] = config
        self._configs[key] = configs
        stored = self._store(key, new, old, field_manager, "Apply")
        self.applied.append(copy.deepcopy(obj))
        self._done(call)
        return stored

    def create(self, obj: dict) -> dict:
        meta = obj["metadata"]
        call = self._begin(Call("create", obj["kind"], meta.get("namespace"), meta["name"], copy.deepcopy(obj)))
        key = self.key(obj["kind"], meta.get("namespace"), meta["name"])
        if key in self.objects:
            call.status = 409
            raise status_error(409, "AlreadyExists", f'{KINDS[key[0]].plural} "{key[2]}" already exists')
        self._namespace_open(key)
        body = copy.deepcopy(obj)
        for system in _SYSTEM_META:
            body.get("metadata", {}).pop(system, None)
        stored = self._store(key, body, None, FIELD_MANAGER, "Update")
        self._done(call, 201)
        return stored

    def delete(self, kind: str, namespace: str | None, name: str, propagation: str = "Background") -> bool:
        call = self._begin(Call("delete", kind, namespace, name, options={"propagation": propagation}))
        key = self.key(kind, namespace, name)
        old = self.objects.get(key)
        if old is None:
            self._done(call, 404)
            return False
        obj = copy.deepcopy(old)
        meta = obj["metadata"]
        if propagation == "Foreground" and "foregroundDeletion" not in (meta.get("finalizers") or []):
            meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
        if not meta.get("finalizers"):
            self.objects.pop(key)
            self._configs.pop(key, None)
            self._bump()
        elif not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = DELETED_AT
            old["metadata"]["deletionTimestamp"] = DELETED_AT   # _store keeps the stored one
            self._store(key, obj, old, "kube-apiserver", "Update")
        self._done(call)
        return True

    def merge_patch(self, kind: str, namespace: str | None, name: str, patch: dict,
                    subresource: str | None = None) -> dict | None:
        call = self._begin(Call("merge_patch", kind, namespace, name, copy.deepcopy(patch),
                                {"subresource": subresource}))
        key = self.key(kind, namespace, name)
        if subresource not in (None, "status"):
            raise AssertionError(f"no subresource {subresource!r} here")
        old = self.objects.get(key)
        if old is None:
            self._done(call, 404)
            return None
        patch = copy.deepcopy(patch)
        wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if wanted is not None and str(wanted) != old["metadata"]["resourceVersion"]:
            call.status = 409
            raise status_error(409, "Conflict", f'Operation cannot be fulfilled on {KINDS[kind].plural} "{name}": '
                               "the object has been modified; please apply your changes to the latest version "
                               "and try again")
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in patch:
                new = merge(old, {"status": patch["status"]})
        else:
            patch.pop("status", None)
            for system in _SYSTEM_META:
                (patch.get("metadata") or {}).pop(system, None)
            new = merge(old, patch)
        stored = self._store(key, new, old, FIELD_MANAGER, "Update")
        self._done(call)
        return stored


# -- what the cluster's controllers, scheduler and kubelets do --

def ready_node(name: str, **labels: str) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": dict(labels)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def roll_out(cluster: FakeCluster, namespace: str, name: str, ready: bool = True) -> dict:
    """The Deployment controller: the Deployment's generation observed, its replicas updated (and
    Ready, or not); no pods."""
    dep = cluster.objects[cluster.key("Deployment", namespace, name)]
    replicas = dep["spec"].get("replicas", 1)
    return cluster.set_status("Deployment", namespace, name, {
        "observedGeneration": dep["metadata"]["generation"], "replicas": replicas,
        "readyReplicas": replicas if ready else 0, "updatedReplicas": replicas})


def run_deployment(cluster: FakeCluster, namespace: str, name: str, node: str = "gpu-1") -> None:
    """The Deployment rolled out, its pods scheduled on `node`, up and Ready."""
    dep = roll_out(cluster, namespace, name)
    template = dep["spec"]["template"]["metadata"]["labels"]
    for i in range(dep["spec"].get("replicas", 1)):
        cluster.put({"kind": "Pod", "metadata": {"name": f"{name}-{template.get(names.LABEL_VERSION)}-{i}",
                                                 "namespace": namespace, "labels": dict(template)},
                     "spec": {"nodeName": node},
                     "status": {"conditions": [{"type": "Ready", "status": "True"}]}})


def finish_job(cluster: FakeCluster, namespace: str, name: str, verdict: Any) -> None:
    """The gate Job ran: Complete or Failed, its pod's termination message the verdict."""
    job = cluster.objects[cluster.key("Job", namespace, name)]
    cluster.set_status("Job", namespace, name,
                       {"conditions": [{"type": "Complete" if verdict.passed else "Failed", "status": "True"}]})
    cluster.put({"kind": "Pod", "metadata": {"name": f"{name}-x", "namespace": namespace,
                                             "labels": {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                                                        "batch.kubernetes.io/job-name": name}},
                 "status": {"containerStatuses": [{"name": "gate", "state": {"terminated": {
                     "exitCode": verdict.exit_code, "message": verdict.to_json()}}}]}})
