"""The operator's own HTTP transport (controller/transport.py): `rankops run` never imports the
kubernetes package (kopf would pull in its ~865 generated modules), Kube over the Transport
against a real API server, and credentials read again as tokens rotate."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kopf
import pytest
import yaml

from rankops.controller import transport
from rankops.controller.kube import ApiError, ApiMissing, Kube, open_stream, send


# `rankops run` as the command line runs it, up to kopf.run (which reports and exits instead).
PROBE = textwrap.dedent('''
    import builtins, json, sys
    real_import = builtins.__import__

    def fake_run(memo, **_):
        OPERATOR = memo.operator
        loaded = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] == "kubernetes" and mod is not None)
        print(json.dumps({"kubernetes": loaded[:5], "api": type(OPERATOR.kube.api).__name__,
                          "client_library": OPERATOR.client_library}))
        raise SystemExit(0)

    def patched(name, *args, **kwargs):
        module = real_import(name, *args, **kwargs)
        if name == "kopf":   # each time: kopf's own imports of itself come before its __init__ binds run
            sys.modules["kopf"].run = fake_run
        return module

    builtins.__import__ = patched
    from rankops.cli import main
    sys.exit(main(["run"]))
''')


def _kubeconfig(path: Path, server: str, user: dict, cluster: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, **(cluster or {"insecure-skip-tls-verify": True})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "team"}}]}))
    return path


def _probe(kubeconfig: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**env, "KUBECONFIG": str(kubeconfig)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_rankops_run_never_imports_the_kubernetes_package(tmp_path):
    found, _ = _probe(_kubeconfig(tmp_path / "config", "https://127.0.0.1:1", {"token": "t"}))
    assert found == {"kubernetes": [], "api": "Transport", "client_library": False}


def test_an_exec_plugin_user_falls_back_to_the_kubernetes_client_and_says_so(tmp_path):
    """kopf's loader cannot run an exec plugin: the kubernetes client does it, at a cost in memory."""
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": "from-plugin"}}
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                     "args": ["-c", f"print({json.dumps(json.dumps(credential))})"], "interactiveMode": "Never"}}
    found, log = _probe(_kubeconfig(tmp_path / "config", "https://127.0.0.1:1", user))
    assert found["client_library"] and found["api"] == "ApiClient" and found["kubernetes"]
    assert "exec plugin" in log and "MiB more memory" in log


def test_no_credentials_is_said_as_before(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    done = subprocess.run([sys.executable, "-m", "rankops.cli", "run"], capture_output=True, text=True, timeout=120,
                          env={**env, "KUBECONFIG": "", "HOME": str(tmp_path)})
    assert done.returncode == 2
    assert "rankops run: no Kubernetes credentials:" in done.stderr and "(set KUBECONFIG or run in a pod)" in done.stderr


def test_the_kubeconfig_login_resolves_relative_paths_and_token_files(tmp_path, monkeypatch):
    """As the kubernetes client reads a kubeconfig: paths relative to its file, tokenFile read."""
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("from-file\n")
    config = _kubeconfig(tmp_path / "config", "https://h:6443", {"tokenFile": "creds/token"},
                         {"certificate-authority": "creds/ca.crt"})
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info = transport.login()
    assert (info.server, info.token, info.default_namespace) == ("https://h:6443", "from-file", "team")
    assert info.ca_path == str(tmp_path / "creds" / "ca.crt")
    assert transport.client_library_needed() is None
    _kubeconfig(config, "https://h:6443", {"auth-provider": {"name": "oidc", "config": {}}})
    assert transport.client_library_needed() == "auth-provider"


def test_in_cluster_the_server_is_the_address_the_pod_is_given(monkeypatch):
    monkeypatch.setattr(transport, "in_cluster", lambda: True)
    monkeypatch.setattr(kopf, "login_with_service_account",
                        lambda **_: kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="sa"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert transport.login().server == "https://[fd00::1]:443"
    assert transport.client_library_needed() is None, "in a pod the ServiceAccount comes first"


def test_credentials_are_read_again_each_refresh_period():
    now = [0.0]
    tokens = iter(["one", "two", "three"])
    read = []

    def login():
        read.append(next(tokens))
        return kopf.ConnectionInfo(server="http://127.0.0.1:1", token=read[-1])

    t = transport.Transport(login, refresh_s=60, clock=lambda: now[0])
    assert t._credentials() == {"Authorization": "Bearer one"}
    now[0] = 59
    assert t._credentials() == {"Authorization": "Bearer one"} and len(read) == 1
    now[0] = 61
    assert t._credentials() == {"Authorization": "Bearer two"}


def test_an_unreachable_server_is_an_oserror():
    t = transport.Transport(lambda: kopf.ConnectionInfo(server="http://127.0.0.1:1"), maxsize=2)
    with pytest.raises(OSError):
        send(t, "GET", "/version", timeout=2)


# --- against a real API server ---------------------------------------------------------------

# `plane`: etcd and an API server, one per module (tests/conftest.py)


def test_kube_over_the_transport_against_the_api_server(plane, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    t = transport.Transport(transport.login, maxsize=4)
    kube = Kube(t)
    name = "transport-test"
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default",
                                                                 "labels": {"t": "x"}}, "data": {"a": "1"}}
    applied = kube.apply(cm)
    assert applied["data"] == {"a": "1"} and applied["metadata"]["managedFields"][0]["manager"] == "rankops"
    assert kube.get("ConfigMap", "default", name)["data"] == {"a": "1"}
    assert [o["metadata"]["name"] for o in kube.list("ConfigMap", "default", labels={"t": "x"})] == [name]
    assert kube.merge_patch("ConfigMap", "default", name, {"data": {"b": "2"}})["data"] == {"a": "1", "b": "2"}
    assert kube.exists("ConfigMap", "default", name)
    with pytest.raises(ApiError) as caught:
        kube.create(cm)
    assert caught.value.status == 409 and json.loads(caught.value.body)["reason"] == "AlreadyExists"
    assert kube.delete("ConfigMap", "default", name)
    assert kube.get("ConfigMap", "default", name) is None, "404 for an absent object is None"
    with pytest.raises(ApiMissing):
        kube.list("ServiceMonitor", "default")   # no monitoring.coreos.com CRDs here
    with pytest.raises(ApiError) as caught:
        kube.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
                    "spec": {"ports": [{"port": 0}]}})
    assert caught.value.status == 422 and b"spec.ports[0].port" in caught.value.body
    stream = open_stream(t, "/api/v1/namespaces/default/configmaps", [("watch", "true"), ("timeoutSeconds", "1")])
    try:
        assert stream.status == 200 and b'"type":"ADDED"' in stream.read()
    finally:
        stream.release_conn()
    t.close()


def test_a_401_reads_the_credentials_again_once(plane, tmp_path, monkeypatch):
    """A rotated token: the request refused with the old one goes again with the one read now."""
    server = yaml.safe_load(plane.kubeconfig.read_text())["clusters"][0]["cluster"]
    config = _kubeconfig(tmp_path / "config", server["server"], {"token": "expired"}, server)
    monkeypatch.setenv("KUBECONFIG", str(config))
    t = transport.Transport(transport.login, maxsize=2)
    try:
        assert send(t, "GET", "/api/v1/namespaces/default").status == 401, "refused again after one retry"
        _kubeconfig(config, server["server"], {"token": plane.token}, server)   # the kubelet rewrote it
        assert send(t, "GET", "/api/v1/namespaces/default").status == 200
        assert t._credentials() == {"Authorization": f"Bearer {plane.token}"}
    finally:
        t.close()


def test_peering_objects_are_created_through_kube(plane, monkeypatch):
    """`rankops run --peering` creates kopf's peering objects (controller/peering.py): a cluster
    without kopf's CRDs is told as such; with them, the second replica's create finds it there."""
    import time

    from rankops.controller import peering

    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    t = transport.Transport(transport.login, maxsize=2)
    kube = Kube(t)
    try:
        with pytest.raises(RuntimeError, match="does not serve kopf.dev/v1"):
            peering.ensure_peering_objects(kube, "p", [])
        install = Path(__file__).resolve().parents[1] / "manifests" / "install.yaml"
        crds = [d for d in yaml.safe_load_all(install.read_text())
                if d and d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "kopf.dev"]
        assert len(crds) == 2
        for crd in crds:
            assert send(t, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd,
                        headers={"Content-Type": "application/json"}).status == 201
        deadline = time.monotonic() + 30
        while True:   # served once Established and in discovery
            try:
                peering.ensure_peering_objects(kube, "p", ["default"])
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        peering.ensure_peering_objects(kube, "p", ["default"])   # already there: another replica made it
        peering.ensure_peering_objects(kube, "p", [])
        assert kube.get("KopfPeering", "default", "p")["metadata"]["name"] == "p"
        assert kube.get("ClusterKopfPeering", None, "p")["kind"] == "ClusterKopfPeering"
    finally:
        t.close()
