"""kopf's HTTP session, with a bound on its connections.

kopf's own session opens connections without limit (aiohttp's TCPConnector(limit=0)): when N
models appear at once it PATCHes all N at once (finalizers, its progress annotations), each on a
new TLS connection. At N=300 that was ~180 connections, ~125 KiB of TLS buffers each and kept
open, and the API server refused what passed its max-mutating-requests-inflight with 429, which
kopf retries after 1, 1, 2, 3, 5... s: most of the time to all Ready. This session has the same
credentials, and requests past the bound wait on the client instead.

Each watch holds its connection for as long as it streams, so the bound is REQUESTS on top of
room for every watch stream: WATCH_ROOM per namespace watched (a kind each, peering included).
Namespace patterns (kopf watches each namespace they match) leave it unbounded, as kopf has it.
"""
from __future__ import annotations

from typing import Any

import aiohttp
import kopf

from rankops.controller import transport, watches

REQUESTS = 16       # kopf's own requests at once (the reconcilers have a connection pool of their own)
WATCH_ROOM = 16     # watch streams per namespace watched; more kinds than rankops watches


def connection_limit(namespaces: list[str] | tuple[str, ...]) -> int:
    """0 (no bound) when a namespace is a pattern; otherwise room for the watches plus REQUESTS."""
    if any(watches.is_pattern(ns) for ns in namespaces):
        return 0
    return REQUESTS + WATCH_ROOM * max(1, len(namespaces))


async def bounded_session(limit: int, client_library: bool = False, **kwargs: Any) -> kopf.AiohttpSession:
    """The operator's credentials (in-cluster or kubeconfig), in a session of at most `limit`
    connections: from kopf's own loaders as the reconcilers' Transport has them, or from the
    kubernetes client where `rankops run` needs it (`client_library`). kopf calls this
    again on a 401, so a rotated ServiceAccount token is read afresh."""
    if client_library:
        info = kopf.login_via_client(**kwargs)
    else:
        info = transport.login(kwargs.get("settings"))
    if info is None:
        raise kopf.LoginError("no Kubernetes credentials: set KUBECONFIG or run in a pod")
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(), trust_env=info.trust_env)
    return kopf.AiohttpSession(server=info.server, default_namespace=info.default_namespace,
                               priority=info.priority, aiohttp_session=session)
