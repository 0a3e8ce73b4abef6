"""The Triton test image's `tritonserver` shim: the rendered config, loadable on a CPU."""
from __future__ import annotations

from pathlib import Path

from rankops_dev import triton, triton_cpu_shim

CONFIG = '''name: "ranker"
platform: "onnxruntime_onnx"
max_batch_size: 512
instance_group [{ count: 2 kind: KIND_GPU gpus: [0] }]
dynamic_batching { max_queue_delay_microseconds: 1000 }
'''


def test_the_only_edit_is_the_one_the_real_triton_fixture_makes():
    text, edits = triton_cpu_shim.cpu_config(CONFIG)
    assert edits == 1 and "KIND_GPU" not in text
    assert text == CONFIG.replace("KIND_GPU", "KIND_CPU")
    fixture_text, fixture_edits = triton.cpu_config(CONFIG)  # the protobuf edit of the real-Triton fixture
    assert "KIND_CPU" in fixture_text and len(fixture_edits) == 1


def test_the_shadow_repository_links_versions_and_rewrites_only_configs(tmp_path: Path):
    repository, shadow = tmp_path / "models", tmp_path / "shadow"
    (repository / "ranker" / "1").mkdir(parents=True)
    (repository / "ranker" / "1" / "model.onnx").write_bytes(b"onnx")
    (repository / "ranker" / "config.pbtxt").write_text(CONFIG)
    (repository / "ranker" / "config.pbtxt").chmod(0o444)  # a ConfigMap's subPath: read-only
    triton_cpu_shim.shadow(repository, shadow)
    assert (shadow / "ranker" / "1").is_symlink() and (shadow / "ranker" / "1" / "model.onnx").read_bytes() == b"onnx"
    assert "KIND_CPU" in (shadow / "ranker" / "config.pbtxt").read_text()
    assert (repository / "ranker" / "config.pbtxt").read_text() == CONFIG   # the source is untouched
    # A restarted container finds its /tmp as it left it: the shadow is made again, not refused.
    (repository / "ranker" / "2").mkdir()
    triton_cpu_shim.shadow(repository, shadow)
    assert (shadow / "ranker" / "2").is_symlink()


def test_the_mirror_follows_versions_a_stager_adds_and_removes(tmp_path: Path):
    repository, shadow = tmp_path / "models", tmp_path / "shadow"
    (repository / "ranker" / "1").mkdir(parents=True)
    (repository / "ranker" / "config.pbtxt").write_text(CONFIG)
    triton_cpu_shim.shadow(repository, shadow)
    # the stager's way: a hidden complete copy, then the version's link to it
    (repository / "ranker" / ".2.v-abc").mkdir()
    (repository / "ranker" / "2").symlink_to(".2.v-abc")
    triton_cpu_shim.shadow(repository, shadow, quiet=True)
    assert (shadow / "ranker" / "2").is_dir() and (shadow / "ranker" / "2").is_symlink()
    (repository / "ranker" / "1").rmdir()
    triton_cpu_shim.shadow(repository, shadow, quiet=True)
    assert sorted(p.name for p in (shadow / "ranker").iterdir()) == [".2.v-abc", "2", "config.pbtxt"]
    # a running server's config stays what it started with
    (shadow / "ranker" / "config.pbtxt").write_text("as loaded")
    triton_cpu_shim.shadow(repository, shadow, quiet=True)
    assert (shadow / "ranker" / "config.pbtxt").read_text() == "as loaded"


def test_the_server_is_started_on_the_shadow_with_every_other_argument_as_given(tmp_path, monkeypatch):
    (tmp_path / "models" / "m").mkdir(parents=True)
    monkeypatch.setattr(triton_cpu_shim, "SHADOW", tmp_path / "shadow")
    calls = []
    monkeypatch.setattr(triton_cpu_shim.os, "execv", lambda path, argv: calls.append((path, argv)))
    monkeypatch.setattr(triton_cpu_shim.os, "fork", lambda: calls.append("forked the mirror") or 4242)
    triton_cpu_shim.main([f"--model-repository={tmp_path / 'models'}", "--model-control-mode=explicit",
                          "--load-model=m", "--http-port=8000"])
    assert calls == ["forked the mirror", (triton_cpu_shim.REAL, [triton_cpu_shim.REAL, f"--model-repository={tmp_path / 'shadow'}",
                                             "--model-control-mode=explicit", "--load-model=m", "--http-port=8000"])]
