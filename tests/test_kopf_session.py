"""kopf's HTTP session is bounded (controller/session.py): a burst of new models waits on the
client instead of opening a TLS connection per PATCH and being refused with 429."""
from __future__ import annotations

import asyncio
import logging

import kopf
import pytest
import yaml

from rankops.controller import session


def test_the_bound_leaves_room_for_every_watch_and_patterns_are_unbounded():
    assert session.connection_limit([]) == session.REQUESTS + session.WATCH_ROOM
    assert session.connection_limit(["a", "b", "c"]) == session.REQUESTS + 3 * session.WATCH_ROOM
    assert session.connection_limit(["a", "team-*"]) == 0


def _kubeconfig(tmp_path, token: str):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return kubeconfig


def _login(client_library: bool = False):
    async def login():
        found = await session.bounded_session(24, client_library=client_library, logger=logging.getLogger("t"),
                                              settings=kopf.OperatorSettings())
        try:
            return found.server, found.aiohttp_session.connector.limit, dict(found.aiohttp_session.headers)
        finally:
            await found.aiohttp_session.close()

    return asyncio.run(login())


@pytest.mark.parametrize("client_library", [False, True], ids=["kopf-loaders", "kubernetes-client"])
def test_the_login_keeps_the_operators_credentials_in_a_bounded_session(tmp_path, monkeypatch, client_library):
    """The same credentials source as the reconcilers' transport (commands/run.py): kopf's own
    loaders, or the kubernetes client's where the kubeconfig needs it."""
    kubeconfig = _kubeconfig(tmp_path, "s3cret")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    if client_library:
        from kubernetes.config import kube_config
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))   # read at import
    else:   # the client library must not be what reads it
        monkeypatch.setattr(kopf, "login_via_client", lambda **_: pytest.fail("kubernetes client used"))
    server, limit, headers = _login(client_library)
    assert (server, limit) == ("https://127.0.0.1:6443", 24)
    assert headers["Authorization"] == "Bearer s3cret"


def test_a_login_again_reads_a_rotated_token(tmp_path, monkeypatch):
    """kopf logs in again on a 401: the token written since (a rotated one) is the one used."""
    kubeconfig = _kubeconfig(tmp_path, "old")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert _login()[2]["Authorization"] == "Bearer old"
    _kubeconfig(tmp_path, "new")
    assert _login()[2]["Authorization"] == "Bearer new"
