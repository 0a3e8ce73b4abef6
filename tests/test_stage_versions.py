"""The in-pod stager (fetcher/stager.py, `rankops stage-versions`): a model directory kept holding
exactly the versions a file lists, with the real strict fetcher from file:// sources."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankops.fetcher import stager
from rankops.fetcher.stager import StageListError, Wanted, parse_versions, stage_plan, stage_round

ROOT = Path(__file__).resolve().parents[1]


def _artifact(root: Path, version: str, body: bytes) -> tuple[str, str]:
    source = root / "store" / version
    source.mkdir(parents=True)
    (source / "model.onnx").write_bytes(body)
    return source.as_uri(), hashlib.sha256(body).hexdigest()


def _write(path: Path, model: str, versions: list[Wanted]) -> None:
    path.write_text(json.dumps(stager.versions_document(model, versions)))


def _round(model_dir: Path, versions_file: Path) -> list[str]:
    done = stage_round("ranker", model_dir, versions_file, stager.fetched_with(stager_limits()),
                       stager.remove_version_dir)
    assert done.ok == (not any("failed" in line or "nothing changed" in line for line in done.lines))
    return list(done.lines)


def stager_limits():
    from rankops.fetcher.fetch import Limits
    return Limits(deadline_s=30)


@pytest.mark.parametrize("doc, field", [
    ({"model": "other", "versions": [{"name": "1", "dir": 1, "uri": "file:///x"}]}, "`model` must be 'ranker'"),
    ({"model": "ranker", "versions": []}, "an empty list would remove the serving one"),
    ({"model": "ranker", "versions": [{"name": "1", "dir": 0, "uri": "file:///x"}]}, "versions[0].dir"),
    ({"model": "ranker", "versions": [{"name": "1", "dir": "1", "uri": "file:///x"}]}, "versions[0].dir"),
    ({"model": "ranker", "versions": [{"name": "1", "dir": True, "uri": "file:///x"}]}, "versions[0].dir"),
    ({"model": "ranker", "versions": [{"name": "1", "dir": 1, "uri": ""}]}, "versions[0].uri"),
    ({"model": "ranker", "versions": [{"name": "1", "dir": 1, "uri": "file:///x", "sha256": "ABC"}]},
     "versions[0].sha256"),
    ({"model": "ranker", "versions": [{"name": "a", "dir": 1, "uri": "file:///a"},
                                      {"name": "b", "dir": 1, "uri": "file:///b"}]}, "give the versions numeric names"),
    ({"model": "ranker", "versions": [{"name": str(i), "dir": i, "uri": "file:///x"} for i in range(1, 10)]},
     "1 to 8 versions"),
])
def test_a_bad_versions_file_is_refused_naming_the_field(doc, field):
    with pytest.raises(StageListError) as caught:
        parse_versions(json.dumps(doc), "ranker")
    assert field in str(caught.value)


def test_an_oversized_or_non_json_file_is_refused():
    with pytest.raises(StageListError, match="at most 65536"):
        parse_versions(b" " * (stager.MAX_FILE_BYTES + 1), "ranker")
    with pytest.raises(StageListError, match="not JSON"):
        parse_versions("{", "ranker")


def test_the_plan_fetches_what_is_listed_and_missing_and_removes_what_is_not_listed():
    one, two = Wanted("1", 1, "s3://b/1"), Wanted("2", 2, "s3://b/2")
    assert stage_plan([one, two], {1}) == stager.StagePlan(fetch=(two,), remove=())
    assert stage_plan([two], {1, 2}) == stager.StagePlan(fetch=(), remove=(1,))
    assert stage_plan([one], {1}).idle
    # The fetcher's hidden staging copies and locks are not versions.
    assert stager.version_dirs(["1", ".1.v-abc", ".2.lock", "config.pbtxt", "02", "3"]) == {1, 3}


def test_rounds_fetch_the_new_version_then_remove_the_old_once_it_is_no_longer_listed(tmp_path):
    model_dir, versions_file = tmp_path / "models" / "ranker", tmp_path / "versions.json"
    model_dir.mkdir(parents=True)
    uri1, sha1 = _artifact(tmp_path, "1", b"v1 weights")
    uri2, sha2 = _artifact(tmp_path, "2", b"v2 weights")
    one, two = Wanted("1", 1, uri1, sha1), Wanted("2", 2, uri2, sha2)

    _write(versions_file, "ranker", [one])
    assert _round(model_dir, versions_file) == [f"version 1: fetched {uri1} into {model_dir / '1'}"]
    _write(versions_file, "ranker", [one, two])
    assert _round(model_dir, versions_file) == [f"version 2: fetched {uri2} into {model_dir / '2'}"]
    assert (model_dir / "2" / "model.onnx").read_bytes() == b"v2 weights"
    assert _round(model_dir, versions_file) == []          # converged: nothing to do

    _write(versions_file, "ranker", [two])
    assert _round(model_dir, versions_file) == ["version directory 1: removed (no longer listed)"]
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(["2", *[p.name for p in model_dir.glob(".2.*")]])
    assert not list(model_dir.glob(".1.*"))                # the fetcher's hidden copy of 1 went too
    assert (model_dir / "2" / "model.onnx").read_bytes() == b"v2 weights"


def test_a_round_that_cannot_judge_changes_nothing(tmp_path):
    model_dir, versions_file = tmp_path / "models" / "ranker", tmp_path / "versions.json"
    model_dir.mkdir(parents=True)
    uri1, sha1 = _artifact(tmp_path, "1", b"v1 weights")
    uri2, _ = _artifact(tmp_path, "2", b"v2 weights")
    _write(versions_file, "ranker", [Wanted("1", 1, uri1, sha1)])
    _round(model_dir, versions_file)

    versions_file.unlink()                                 # the ConfigMap key gone: remove nothing
    [line] = _round(model_dir, versions_file)
    assert "unreadable" in line and "nothing changed" in line and (model_dir / "1").exists()
    versions_file.write_text('{"model": "ranker", "versions": []}')
    [line] = _round(model_dir, versions_file)
    assert "empty list" in line and (model_dir / "1").exists()

    # A version whose bytes do not match its sha256 is not staged; the other stays listed and served.
    _write(versions_file, "ranker", [Wanted("1", 1, uri1, sha1), Wanted("2", 2, uri2, "0" * 64)])
    [line] = _round(model_dir, versions_file)
    assert line.startswith("version 2: fetching") and "failed" in line and "sha256" in line.lower(), line
    assert not (model_dir / "2").exists() and (model_dir / "1" / "model.onnx").read_bytes() == b"v1 weights"


def test_a_removal_that_fails_is_said_and_tried_again(tmp_path):
    model_dir, versions_file = tmp_path / "models" / "ranker", tmp_path / "versions.json"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "2").mkdir()
    _write(versions_file, "ranker", [Wanted("2", 2, "s3://b/ranker/2")])

    def busy(directory: Path, version: int) -> None:
        raise OSError(16, "Device or resource busy")
    done = stage_round("ranker", model_dir, versions_file, stager.fetched_with(stager_limits()), busy)
    assert not done.ok and done.lines == ("version directory 1: removing it failed: [Errno 16] Device or resource busy",)
    assert (model_dir / "1").is_dir()
    done = stage_round("ranker", model_dir, versions_file, stager.fetched_with(stager_limits()),
                       stager.remove_version_dir)
    assert done.ok and done.lines == ("version directory 1: removed (no longer listed)",)
    assert not (model_dir / "1").exists() and (model_dir / "2").is_dir()


def test_the_command_runs_a_round_and_says_what_it_did(tmp_path):
    model_dir, versions_file = tmp_path / "models" / "ranker", tmp_path / "versions.json"
    model_dir.mkdir(parents=True)
    uri1, sha1 = _artifact(tmp_path, "1", b"v1 weights")
    _write(versions_file, "ranker", [Wanted("1", 1, uri1, sha1)])
    command = [sys.executable, "-m", "rankops", "stage-versions", "--model", "ranker", "--model-dir", str(model_dir),
               "--versions-file", str(versions_file), "--once"]
    env = {"PYTHONPATH": str(ROOT / "operator"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and "version 1: fetched" in done.stdout, done.stdout + done.stderr
    _write(versions_file, "other", [Wanted("1", 1, uri1, sha1)])
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "`model` must be 'ranker'" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([*command, "--interval", "0"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "--interval must be above 0" in done.stderr


def test_with_expect_a_version_lacking_the_file_is_not_staged(tmp_path):
    # What the rendered pods pass (--expect model.onnx): a version missing Triton's file is a failed
    # round, the volume as it was, as fetch-model --expect fails the init container.
    model_dir, versions_file = tmp_path / "models" / "ranker", tmp_path / "versions.json"
    model_dir.mkdir(parents=True)
    uri1, sha1 = _artifact(tmp_path, "1", b"v1 weights")
    _write(versions_file, "ranker", [Wanted("1", 1, uri1, sha1)])
    done = stage_round("ranker", model_dir, versions_file, stager.fetched_with(stager_limits(), "model.plan"),
                       stager.remove_version_dir)
    assert not done.ok and "model.plan" in done.lines[0] and not (model_dir / "1").exists()
    done = stage_round("ranker", model_dir, versions_file, stager.fetched_with(stager_limits(), "model.onnx"),
                       stager.remove_version_dir)
    assert done.ok and (model_dir / "1" / "model.onnx").read_bytes() == b"v1 weights"


def test_the_command_refuses_a_bad_expect_before_any_round(tmp_path):
    command = [sys.executable, "-m", "rankops", "stage-versions", "--model", "ranker", "--model-dir",
               str(tmp_path / "m"), "--versions-file", str(tmp_path / "v.json"), "--once", "--expect", "../model.onnx"]
    env = {"PYTHONPATH": str(ROOT / "operator"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "--expect '../model.onnx' must name a file inside" in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()
