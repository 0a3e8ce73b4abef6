"""The pod sandbox ("pause") image of the real node, made here: no registry is reachable.

A static Go program that sleeps until SIGTERM/SIGINT and reaps orphans (what the pause image of
Kubernetes does), built once into the binaries' cache, laid out as a one-layer OCI archive that
`ctr images import` takes.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

PAUSE_IMAGE = "localhost/rankops-pause:1"
PAUSE_SOURCE = """package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tstop := make(chan os.Signal, 1)
\tsignal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
\tchildren := make(chan os.Signal, 8)
\tsignal.Notify(children, syscall.SIGCHLD)
\tgo func() {
\t\tfor range children {
\t\t\tfor {
\t\t\t\tvar status syscall.WaitStatus
\t\t\t\tif pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
\t\t\t\t\tbreak
\t\t\t\t}
\t\t\t}
\t\t}
\t}()
\t<-stop
}
"""


def build_pause(out: Path) -> Path:
    """`out` (a static binary), built with the Go toolchain unless it is already there."""
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix="rankops-pause-") as src:
        Path(src, "go.mod").write_text("module rankops.local/pause\n\ngo 1.21\n")
        Path(src, "main.go").write_text(PAUSE_SOURCE)
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
        subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", f"{out}.tmp", "."],
                       cwd=src, env=env, check=True, capture_output=True)
    os.replace(f"{out}.tmp", out)
    return out


def _blob(tar: tarfile.TarFile, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def layer_tar(binary: bytes) -> bytes:
    """One layer: /pause, mode 0755, owned by root, fixed mtime (same bytes each time)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = len(binary), 0o755, 0
        tar.addfile(info, io.BytesIO(binary))
    return buffer.getvalue()


def image_config(diff_id: str) -> dict:
    return {"architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]}}


def write_archive(binary: bytes, out: Path, name: str = PAUSE_IMAGE) -> Path:
    """An OCI image layout in a tar (oci-layout, index.json, blobs/) naming the image `name`."""
    layer = layer_tar(binary)
    with tarfile.open(out, "w") as tar:
        layer_desc = _blob(tar, layer)
        config_desc = _blob(tar, json.dumps(image_config(layer_desc["digest"])).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}]}
        manifest_desc = _blob(tar, json.dumps(manifest).encode())
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name}}]}
        for file_name, data in (("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                                ("index.json", json.dumps(index).encode())):
            info = tarfile.TarInfo(file_name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out
