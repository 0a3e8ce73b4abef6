"""A container's environment as the kubelet gives it (dev/rankops_dev/container_env.py), which the
real-Triton fixture starts rendered Triton containers with."""
from __future__ import annotations

import pytest

from rankops_dev.container_env import ContainerConfigError, container_env, expand

POD = {"metadata": {"name": "web-1", "namespace": "reco", "uid": "u-1", "labels": {"app": "web"},
                    "annotations": {"a/b": "c"}},
       "spec": {"serviceAccountName": "gate"}}


def test_expansion_follows_kubernetes():
    env = {"NODE_NAME": "n1", "A": "x"}
    assert expand("--node=$(NODE_NAME)", env) == "--node=n1"
    assert expand("$(MISSING) $$(A) $(A)", env) == "$(MISSING) $(A) x"


def test_environment_order_and_sources():
    container = {"envFrom": [{"secretRef": {"name": "creds"}, "prefix": "S3_"}, {"configMapRef": {"name": "opt", "optional": True}}],
                 "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "URL", "value": "http://$(IP):8000"},
                         {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "KEY"}}},
                         {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                         {"name": "PATH", "value": "/x"}]}
    env = container_env(container, POD, {"PATH": "/usr/bin", "HOME": "/root"}, {}, {"creds": {"KEY": "k"}},
                        "10.245.0.9", "node-a")
    assert env == {"PATH": "/x", "HOME": "/root", "S3_KEY": "k", "IP": "10.245.0.9",
                   "URL": "http://10.245.0.9:8000", "KEY": "k", "APP": "web"}


def test_a_missing_required_source_is_a_config_error_naming_it():
    with pytest.raises(ContainerConfigError, match='"creds" not found') as caught:
        container_env({"envFrom": [{"secretRef": {"name": "creds"}}]}, POD, {}, {}, {}, "10.245.0.2", "n")
    assert caught.value.reason == "CreateContainerConfigError"
    with pytest.raises(ContainerConfigError, match="couldn't find key X"):
        container_env({"env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "X"}}}]},
                      POD, {}, {"c": {"Y": "1"}}, {}, "10.245.0.2", "n")
    with pytest.raises(ContainerConfigError, match="spec.hostname"):
        container_env({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}}]},
                      POD, {}, {}, {}, "10.245.0.2", "n")
