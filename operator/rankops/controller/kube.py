"""A small, explicit Kubernetes REST layer: server-side apply, get, list, delete, status patch.

It knows the handful of kinds rankops touches (no discovery round-trips at start-up) and turns
404 into None and optional APIs that are not installed (Gateway API, OpenShift Routes,
ServiceMonitors) into `ApiMissing`, so the caller decides what each means.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rankops import metrics
from rankops.controller import fastjson
from rankops.controller.transport import Transport
from rankops.render.names import FIELD_MANAGER

if TYPE_CHECKING:
    from kubernetes import client

# What a name or namespace may be to go into a request path as one segment: every kind here is
# named as a DNS subdomain or label. Anything else ("a/../../b", "..", "x?y") would ask for
# another path, so it is refused before a request is made.
_SEGMENT = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class InvalidName(ValueError):
    """A name or namespace that cannot be one segment of an API path."""


def _segment(what: str, value: str) -> str:
    if not _SEGMENT.fullmatch(value) or len(value) > 253:
        raise InvalidName(f"{what} {value!r} is not a Kubernetes object name (lower-case letters, digits, "
                          "'-' and '.', at most 253 characters)")
    return value


@dataclass(frozen=True)
class Kind:
    group_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{_segment('namespace', namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{_segment(self.plural[:-1] + ' name', name)}"
        if sub:
            base += f"/{_segment('subresource', sub)}"
        return base


KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "Service": Kind("v1", "services"),
    "Pod": Kind("v1", "pods"),
    "Node": Kind("v1", "nodes", namespaced=False),
    "Namespace": Kind("v1", "namespaces", namespaced=False),
    "Deployment": Kind("apps/v1", "deployments"),
    "DaemonSet": Kind("apps/v1", "daemonsets"),
    "ReplicaSet": Kind("apps/v1", "replicasets"),
    "Job": Kind("batch/v1", "jobs"),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "EndpointSlice": Kind("discovery.k8s.io/v1", "endpointslices"),
    "HorizontalPodAutoscaler": Kind("autoscaling/v2", "horizontalpodautoscalers"),
    "RankingModel": Kind("rankops.io/v1alpha1", "rankingmodels"),
    "GpuNodePool": Kind("rankops.io/v1alpha1", "gpunodepools", namespaced=False),
    "SharedServer": Kind("rankops.io/v1alpha1", "sharedservers"),
    "HTTPRoute": Kind("gateway.networking.k8s.io/v1", "httproutes"),
    "Route": Kind("route.openshift.io/v1", "routes"),
    "ServiceMonitor": Kind("monitoring.coreos.com/v1", "servicemonitors"),
    "ClusterKopfPeering": Kind("kopf.dev/v1", "clusterkopfpeerings", namespaced=False),
    "KopfPeering": Kind("kopf.dev/v1", "kopfpeerings"),
}


class ApiMissing(Exception):
    """The API group/kind is not served by this cluster (e.g. no Gateway API CRDs)."""


class ApiError(Exception):
    """A request the API server refused: `status` (403, 409, 422, 5xx...), `reason`, the raw `body`
    (a Status object, as JSON bytes). The operator's own, so it needs no kubernetes package."""

    def __init__(self, status: int, reason: str = "", body: bytes | None = None):
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class Kube:
    """`api`: a Transport (`rankops run`), or a kubernetes ApiClient (dev tools, benchmarks, e2e;
    none: the kubernetes client's default configuration)."""

    def __init__(self, api: Transport | client.ApiClient | None = None):
        if api is None:
            from kubernetes import client
            api = client.ApiClient()
        self.api = api

    def _call(self, method: str, path: str, body: Any = None, query: list | None = None,
              content_type: str = "application/json", accept: str = "application/json") -> dict | None:
        answer = send(self.api, method, path, body=body, query=query,
                      headers={"Content-Type": content_type, "Accept": accept})
        metrics.observe_api_request(method, path)
        if answer.status == 404:
            if _is_missing_api(answer.data):
                raise ApiMissing(path)
            return None
        if answer.status >= 400:
            raise ApiError(answer.status, answer.reason, answer.data)
        return fastjson.loads(answer.data) if answer.data else None   # every apply's answer: orjson

    def apply(self, obj: dict[str, Any], dry_run: bool = False, field_manager: str = FIELD_MANAGER) -> dict:
        """Server-side apply under rankops' field manager, forcing ownership of the fields it sets.
        `dry_run`: the API server validates and admits it as if written, and stores nothing."""
        kind = KINDS[obj["kind"]]
        meta = obj["metadata"]
        query = [("fieldManager", field_manager), ("force", "true")] + ([("dryRun", "All")] if dry_run else [])
        return self._call("PATCH", kind.path(meta.get("namespace"), meta["name"]), body=obj, query=query,
                          content_type="application/apply-patch+yaml")

    def create(self, obj: dict[str, Any]) -> dict:
        """POST: ApiError 409 when it exists already."""
        kind = KINDS[obj["kind"]]
        return self._call("POST", kind.path(obj["metadata"].get("namespace")), body=obj)

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        return self._call("GET", KINDS[kind].path(namespace, name))

    def exists(self, kind: str, namespace: str | None, name: str) -> bool:
        """Whether the object exists, reading its metadata only (a Secret's data never comes back)."""
        return self._call("GET", KINDS[kind].path(namespace, name), accept=_METADATA_ONLY) is not None

    def list(self, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None,
             label_selector: str | None = None) -> list[dict]:
        selector = label_selector or ",".join(f"{k}={v}" for k, v in (labels or {}).items())
        query = [("labelSelector", selector)] if selector else []
        found = self._call("GET", KINDS[kind].path(namespace), query=query)
        return (found or {}).get("items", [])

    def list_versioned(self, kind: str, namespace: str | None = None,
                       label_selector: str | None = None) -> tuple[list[dict], int]:
        """The items, and the resourceVersion the listing was taken at (0 if unknown)."""
        query = [("labelSelector", label_selector)] if label_selector else []
        found = self._call("GET", KINDS[kind].path(namespace), query=query) or {}
        items = found.get("items", [])
        for item in items:   # a list's items carry no kind
            item.setdefault("kind", kind)
        try:
            version = int((found.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            version = 0
        return items, version

    def list_page(self, kind: str, namespace: str | None, label_selector: str, limit: int,
                  token: str = "") -> tuple[list[dict], str, str]:
        """One page of a listing: its items (with their kind and apiVersion, which a list's items
        lack), the resourceVersion it was taken at, and the token of the next page ("" at the end)."""
        query = [("labelSelector", label_selector), ("limit", str(limit))] + ([("continue", token)] if token else [])
        found = self._call("GET", KINDS[kind].path(namespace), query=query) or {}
        items = found.get("items") or []
        for item in items:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", KINDS[kind].group_version)
        meta = found.get("metadata") or {}
        return items, str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")

    def delete(self, kind: str, namespace: str | None, name: str, propagation: str = "Background") -> bool:
        """Delete; `propagation="Foreground"` keeps the object until its dependents are gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        return self._call("DELETE", KINDS[kind].path(namespace, name), body=body) is not None

    def merge_patch(self, kind: str, namespace: str | None, name: str, patch: dict,
                    subresource: str | None = None) -> dict | None:
        return self._call("PATCH", KINDS[kind].path(namespace, name, subresource), body=patch,
                          content_type="application/merge-patch+json")


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    data: bytes


def send(api: Transport | client.ApiClient, method: str, path: str, *, body: Any = None, query: list | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30) -> Answer:
    """One request, any status answered: on a Transport, or on a kubernetes ApiClient's (its auth
    and TLS). The client library is imported only for the latter: `rankops run` never loads it."""
    if isinstance(api, Transport):
        response = api.request(method, path, body=body, query=query, headers=headers, timeout=timeout)
        return Answer(response.status, response.reason or "", response.data or b"")
    return _send_on_client(api, method, path, body=body, query=query, headers=headers, timeout=timeout)


def _send_on_client(api: client.ApiClient, method: str, path: str, *, body: Any, query: list | None,
                    headers: dict[str, str] | None, timeout: float) -> Answer:
    """Works with both generations of the generated client: kubernetes >= 37 (param_serialize) and
    the older one (call_api with a resource path), which fetch-model's botocore keeps us on."""
    from kubernetes.client.exceptions import ApiException

    headers = dict(headers or {})
    if hasattr(api, "param_serialize"):
        method, url, headers, _, _ = api.param_serialize(method=method, resource_path=path, query_params=query or [],
                                                         header_params=headers, auth_settings=["BearerToken"])
        # The REST layer serialises dict bodies as JSON, which is also valid apply-patch YAML.
        response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout)
        response.read()
        return Answer(response.status, response.reason or "", response.data or b"")
    try:
        response = api.call_api(path, method, query_params=query or [], header_params=headers, body=body,
                                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
                                _return_http_data_only=True)
    except ApiException as exc:
        raw = exc.body if isinstance(exc.body, bytes) else (exc.body or "").encode()
        return Answer(exc.status or 0, exc.reason or "", raw)
    return Answer(response.status, response.reason or "", response.data or b"")


def open_stream(api: Transport | client.ApiClient, path: str, query: list, timeout: float = 90) -> Any:
    """A GET whose body is read as it comes (a watch): the urllib3 response; ApiError if refused."""
    headers = {"Accept": "application/json"}
    if isinstance(api, Transport):
        response = api.request("GET", path, query=query, headers=headers, timeout=timeout, stream=True)
    elif hasattr(api, "param_serialize"):
        method, url, headers, _, _ = api.param_serialize(method="GET", resource_path=path, query_params=query,
                                                         header_params=headers, auth_settings=["BearerToken"])
        response = api.call_api(method, url, header_params=headers, _request_timeout=timeout).response
    else:
        response = api.call_api(path, "GET", query_params=query, header_params=headers, auth_settings=["BearerToken"],
                                _preload_content=False, _request_timeout=timeout, _return_http_data_only=True)
    if response.status >= 400:
        raise ApiError(response.status, response.reason or "", response.data)
    return response


def _is_missing_api(raw: bytes | None) -> bool:
    """A 404 for an unknown resource type (no such API) rather than for an absent object."""
    try:
        details = json.loads(raw or b"{}")
    except ValueError:
        return True
    # An absent object answers a Status with details.name; an unknown API answers 404 page not found.
    return details.get("kind") != "Status" or not details.get("details")


def namespace_terminating(exc: ApiError) -> bool:
    """A write refused because its namespace is being deleted (403, or 409 for a name whose old
    object is going): expected while a namespace with RankingModels in it goes, not a fault."""
    if exc.status not in (403, 409):
        return False
    try:
        details = json.loads(exc.body or b"{}")
    except ValueError:
        return False
    causes = (details.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "NamespaceTerminating" for c in causes) or \
        "being terminated" in str(details.get("message", ""))
