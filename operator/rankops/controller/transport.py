"""The operator's HTTP to the API server, without the kubernetes package.

The operator sends raw REST calls (controller/kube.py); the kubernetes client would be ~865
generated modules (~40 MiB resident) only to carry them. This is urllib3 (what that client
sends with too) and kopf's own credential loaders: in-cluster ServiceAccount first, then
KUBECONFIG or ~/.kube/config. What those loaders cannot do, a kubeconfig user with an exec
plugin or an auth-provider, `client_library_needed` names: `rankops run` then uses the
kubernetes client for credentials and transport instead.

Bound ServiceAccount tokens rotate (the kubelet rewrites the file; the old token stays valid a
while): the credentials are re-read every REFRESH_S, as the kubernetes client does, and once
more on a 401 before that request is sent again. The CA and client certificate are read once.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlencode

import urllib3
import yaml

if TYPE_CHECKING:
    import kopf

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")   # kopf's loader reads here
REFRESH_S = 60.0
USER_AGENT = "rankops-operator"   # what the API server's audit log and metrics name the requests by

log = logging.getLogger("rankops.transport")


def in_cluster() -> bool:
    """In a pod: a ServiceAccount token and the API server's address, as the kubernetes client asks."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").exists()


@dataclass(frozen=True)
class _KubeconfigUser:
    user: dict
    user_dir: Path      # relative paths in a kubeconfig are relative to the file that says them
    cluster_dir: Path


def _kubeconfig_user() -> _KubeconfigUser | None:
    """The current context's user, merged over the KUBECONFIG files as kopf's loader does (the
    first file to name an entry wins); None when there is no kubeconfig."""
    value = os.environ.get("KUBECONFIG")
    if not value and os.path.exists(os.path.expanduser("~/.kube/config")):
        value = "~/.kube/config"
    if not value:
        return None
    current: str | None = None
    contexts: dict[str, dict] = {}
    users: dict[str, tuple[dict, Path]] = {}
    clusters: dict[str, Path] = {}
    for path in (Path(os.path.expanduser(p.strip())) for p in value.split(os.pathsep) if p.strip()):
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        current = current or config.get("current-context")
        for item in config.get("contexts") or []:
            contexts.setdefault(item["name"], item.get("context") or {})
        for item in config.get("users") or []:
            users.setdefault(item["name"], (item.get("user") or {}, path.parent))
        for item in config.get("clusters") or []:
            clusters.setdefault(item["name"], path.parent)
    context = contexts.get(current or "", {})
    user, user_dir = users.get(context.get("user", ""), ({}, Path.cwd()))
    return _KubeconfigUser(user, user_dir, clusters.get(context.get("cluster", ""), Path.cwd()))


def client_library_needed() -> str | None:
    """'exec' or 'auth-provider' when the kubeconfig's user needs the kubernetes client to get a
    token (kopf's loader does not run plugins); None when kopf's loaders do. Reads no kopf."""
    if in_cluster():
        return None
    try:
        found = _kubeconfig_user()
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None   # login() says what is wrong with it
    for key in ("exec", "auth-provider"):
        if found is not None and found.user.get(key):
            return key
    return None


def login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """Credentials from kopf's loaders, in-cluster first; kopf.LoginError when there are none."""
    import kopf

    settings = settings or kopf.OperatorSettings()
    if in_cluster():
        info = kopf.login_with_service_account(settings=settings)
        if info is not None:
            # kopf names the Service (needs cluster DNS); the client library uses the address it is given.
            host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            host = f"[{host}]" if ":" in host else host
            return dataclasses.replace(info, server=f"https://{host}:{port}")
    found = _kubeconfig_user()
    if found is None:
        raise kopf.LoginError("no in-cluster ServiceAccount, no KUBECONFIG, no ~/.kube/config")
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is None or not info.server:
        raise kopf.LoginError("the kubeconfig's current context names no server")
    # kopf's loader leaves relative file paths as written, and tokenFile to the client library.
    changes: dict[str, Any] = {}
    for field, base in (("ca_path", found.cluster_dir), ("certificate_path", found.user_dir),
                        ("private_key_path", found.user_dir)):
        value = getattr(info, field)
        if value and not os.path.isabs(os.path.expanduser(str(value))):
            changes[field] = str(base / str(value))
    if not info.token and found.user.get("tokenFile"):
        token_file = Path(os.path.expanduser(found.user["tokenFile"]))
        changes["token"] = (found.user_dir / token_file).read_text(encoding="utf-8").strip()
    return dataclasses.replace(info, **changes) if changes else info


class Transport:
    """Requests to one API server on a pool of at most `maxsize` kept-alive connections (more at
    once open and close extra ones, as the kubernetes client's pool does); thread-safe.

    `login` returns the credentials (kopf.ConnectionInfo): called now, every `refresh_s`, and
    when the server answers 401."""

    def __init__(self, login: Callable[[], kopf.ConnectionInfo], maxsize: int = 10,
                 refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic):
        self._login = login
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        info = login()
        self.server = info.server.rstrip("/")
        self.default_namespace = info.default_namespace
        self._headers = info.as_http_headers()
        self._fresh_until = clock() + refresh_s
        pool: dict[str, Any] = {"num_pools": 1, "maxsize": maxsize}
        if self.server.startswith("https:"):
            pool["ssl_context"] = info.as_ssl_context()
        self._http = urllib3.ProxyManager(info.proxy_url, **pool) if info.proxy_url else urllib3.PoolManager(**pool)

    def _credentials(self, again: bool = False) -> dict[str, str]:
        with self._lock:
            now = self._clock()
            if again or now >= self._fresh_until:
                try:
                    self._headers = self._login().as_http_headers()
                except Exception as exc:  # noqa: BLE001 - a token file mid-rewrite: the old one still works
                    log.warning("could not re-read the Kubernetes credentials, keeping the ones read before: %s", exc)
                self._fresh_until = now + self._refresh_s
            return self._headers

    def request(self, method: str, path: str, *, body: Any = None, query: list | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30,
                stream: bool = False) -> urllib3.BaseHTTPResponse:
        """Any status answered; ConnectionError when no answer comes. `stream`: the body is left to be
        read as it comes (release_conn after)."""
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        # A dict body goes as JSON, which is also valid apply-patch YAML.
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        for again in (False, True):
            sent = {"Accept": "application/json", "User-Agent": USER_AGENT, **(headers or {}),
                    **self._credentials(again)}
            if data is not None:
                sent.setdefault("Content-Type", "application/json")
            try:
                response = self._http.request(method, url, body=data, headers=sent, preload_content=not stream,
                                              timeout=urllib3.Timeout(total=timeout))
            except urllib3.exceptions.HTTPError as exc:   # unreachable, reset, timed out: OSError, as callers expect
                raise ConnectionError(f"{method} {self.server}{path}: {exc}") from exc
            if response.status != 401 or again:
                return response
            response.drain_conn()   # expired credentials (a rotated token): read them again, once
            response.release_conn()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.clear()
