"""kopf's HTTP session is bounded (controller/session.py): a burst of new models waits on the
client instead of opening a TLS connection per PATCH and being refused with 429."""
from __future__ import annotations

import asyncio
import logging

import kopf
import yaml

from rankops.controller import session


def test_the_bound_leaves_room_for_every_watch_and_patterns_are_unbounded():
    assert session.connection_limit([]) == session.REQUESTS + session.WATCH_ROOM
    assert session.connection_limit(["a", "b", "c"]) == session.REQUESTS + 3 * session.WATCH_ROOM
    assert session.connection_limit(["a", "team-*"]) == 0


def test_the_login_keeps_kopfs_credentials_in_a_bounded_session(tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "s3cret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    from kubernetes.config import kube_config
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))   # read at import
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    async def login():
        found = await session.bounded_session(24, logger=logging.getLogger("t"), settings=kopf.OperatorSettings())
        try:
            return found.server, found.aiohttp_session.connector.limit, dict(found.aiohttp_session.headers)
        finally:
            await found.aiohttp_session.close()

    server, limit, headers = asyncio.run(login())
    assert (server, limit) == ("https://127.0.0.1:6443", 24)
    assert headers["Authorization"] == "Bearer s3cret"
