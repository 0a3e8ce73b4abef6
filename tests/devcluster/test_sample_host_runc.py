"""The demo's real node shows its validator pods a sample RHEL 8 host: containerd's runc is a
wrapper that rewrites only the validator's /host bind mounts of a container being created.

The wrapper runs here against a stand-in runc that records what it was given; the demo
(e2e/test_demo.py) runs it under containerd with the validator image.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from rankops_dev import real_node_config as cfg
from rankops_dev import sample_host_runc as wrapper
from rankops.validator.daemonset import HOST_MOUNTS, HOST_ROOT

LAYOUT = cfg.NodeLayout(Path("/w/node"), "n0", "10.200.0.1", "10.245.0.0/24", "10.96.0.0/16")


def bind(source: str, destination: str) -> dict:
    return {"type": "bind", "source": source, "destination": destination, "options": ["rbind", "ro"]}


def test_the_wrapper_knows_the_validators_mount_root():
    assert wrapper.VALIDATOR_HOST_ROOT == HOST_ROOT  # it imports nothing of rankops: held here


def test_only_a_host_path_mounted_at_its_own_place_under_host_is_redirected(tmp_path):
    sample = tmp_path / "sample"
    (sample / "etc").mkdir(parents=True)
    (sample / "etc" / "os-release").write_text('ID="rhel"\n')
    config = {"mounts": [
        bind("/etc", "/host/etc"),
        bind("/proc", "/host/proc"),                        # absent from the sample: made empty
        bind("/var/lib/kubelet/pods/x/volumes/y", "/host/etc/y"),  # not a host view: untouched
        bind("/etc", "/etc-copy"),                          # not under /host: untouched
        {"type": "proc", "source": "proc", "destination": "/proc"},
    ]}
    redirected = wrapper.redirect_host_mounts(config, sample)
    assert redirected == ["/etc", "/proc"]
    sources = [m["source"] for m in config["mounts"]]
    assert sources == [str(sample / "etc"), str(sample / "proc"), "/var/lib/kubelet/pods/x/volumes/y", "/etc", "proc"]
    assert (sample / "proc").is_dir()  # /proc is a directory here, so its stand-in is one


def test_every_validator_mount_would_be_redirected(tmp_path):
    config = {"mounts": [bind(path, HOST_ROOT + path) for path, _ in HOST_MOUNTS]}
    assert wrapper.redirect_host_mounts(config, tmp_path / "sample") == [path for path, _ in HOST_MOUNTS]
    assert all(m["source"].startswith(str(tmp_path / "sample")) for m in config["mounts"])


def test_the_bundle_is_found_for_create_and_run_only(tmp_path):
    assert wrapper.bundle_of(["--root", "/r", "create", "--bundle", "/b", "--pid-file", "p", "id1"]) == Path("/b")
    assert wrapper.bundle_of(["create", "-b", "/b2", "id"]) == Path("/b2")
    assert wrapper.bundle_of(["run", "--bundle=/b3", "id"]) == Path("/b3")
    assert wrapper.bundle_of(["--root", "/r", "state", "id"]) is None
    assert wrapper.bundle_of(["exec", "--process", "p.json", "id"]) is None


def test_containerd_runs_the_wrapper_only_for_a_node_with_a_sample_host(tmp_path):
    plain = tomllib.loads(cfg.containerd_config(LAYOUT))
    options = plain["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["options"]
    assert options["BinaryName"] == "/usr/sbin/runc"
    sampled = dataclasses.replace(LAYOUT, sample_host=Path("/w/hosts/n0"))
    options = tomllib.loads(cfg.containerd_config(sampled))["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]["runc"]["options"]
    assert options["BinaryName"] == "/w/node/runc-sample-host"


def test_the_script_rewrites_a_create_and_passes_every_call_to_runc(tmp_path):
    """The generated shell script, run as containerd's shim would: `create` edits config.json
    and then runs runc with the same arguments; `state` goes to runc untouched."""
    log = tmp_path / "runc.log"
    fake_runc = tmp_path / "runc"
    fake_runc.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake_runc.chmod(0o755)
    sample = tmp_path / "sample"
    layout = dataclasses.replace(LAYOUT, work_dir=tmp_path, runc=str(fake_runc), sample_host=sample)
    script = Path(layout.runtime_binary)
    script.write_text(cfg.sample_host_runc_script(layout, sys.executable))
    script.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"mounts": [bind("/etc", "/host/etc")]}))

    args = ["--root", "/run/r", "--log", "/l", "create", "--bundle", str(bundle), "--pid-file", "p", "c1"]
    subprocess.run([str(script), *args], check=True, env={"PATH": os.environ["PATH"]})
    subprocess.run([str(script), "--root", "/run/r", "state", "c1"], check=True)

    assert json.loads((bundle / "config.json").read_text())["mounts"][0]["source"] == str(sample / "etc")
    assert log.read_text().splitlines() == [" ".join(args), "--root /run/r state c1"]


def test_a_private_root_is_told_from_a_shared_one():
    from rankops_dev.real_node import root_mount_is_shared

    private = "27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n22 27 0:21 / /proc rw - proc proc rw\n"
    shared = "27 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    assert not root_mount_is_shared(private)
    assert root_mount_is_shared(shared)
