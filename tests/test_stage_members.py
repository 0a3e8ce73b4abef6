"""A shared server's stager (fetcher/members.py, `rankops stage-members`): the model repository
kept holding exactly the members, and their versions, that a file lists, with the real strict
fetcher from file:// sources."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankops.fetcher import members as staged
from rankops.fetcher.members import Member, members_round, parse_members, remove_model_dir
from rankops.fetcher.stager import StageListError, Wanted, fetched_with, remove_version_dir
from rankops.fetcher.fetch import Limits

ROOT = Path(__file__).resolve().parents[1]


def _artifact(root: Path, model: str, version: str, body: bytes) -> Wanted:
    source = root / "store" / model / version
    source.mkdir(parents=True)
    (source / "model.onnx").write_bytes(body)
    return Wanted(version, int(version), source.as_uri(), hashlib.sha256(body).hexdigest())


def _write(path: Path, members: list[Member], server: str = "ranking") -> None:
    path.write_text(json.dumps(staged.members_document(server, members)))


def _round(repository: Path, members_file: Path) -> list[str]:
    """One round; the tests' artifacts are local directories (file://), which the command never takes."""
    done = members_round("ranking", repository, members_file, lambda expect: fetched_with(Limits(deadline_s=30), expect),
                         remove_version_dir, remove_model_dir, schemes=("file",))
    assert done.ok == (not any("failed" in line or "nothing changed" in line for line in done.lines))
    return list(done.lines)


def _one(model: str = "coarse", **version) -> dict:
    return {"model": model, "expect": "model.onnx",
            "versions": [{"name": "1", "dir": 1, "uri": "s3://models/x/1", "sha256": None, **version}]}


@pytest.mark.parametrize("doc, field", [
    ({"server": "other", "members": [_one()]}, "`server` must be 'ranking'"),
    ({"server": "ranking", "members": []}, "would remove every model the server serves"),
    ({"server": "ranking", "members": [_one("../etc")]}, "members[0].model must be a RankingModel's name"),
    ({"server": "ranking", "members": [_one("Coarse")]}, "members[0].model"),
    ({"server": "ranking", "members": [{**_one(), "expect": "../model.onnx"}]}, "members[0].expect"),
    ({"server": "ranking", "members": [{**_one(), "expect": "/model.onnx"}]}, "members[0].expect"),
    ({"server": "ranking", "members": [{**_one(), "versions": []}]}, "`members[0].versions` must list 1 to"),
    ({"server": "ranking", "members": [_one(dir=0)]}, "members[0].versions[0].dir"),
    ({"server": "ranking", "members": [_one(), _one()]}, "a model is listed twice (['coarse'])"),
    ({"server": "ranking", "members": [_one(f"m{i}") for i in range(65)]}, "1 to 64 members"),
    ({"server": "ranking", "members": [_one(uri="file:///proc/self/environ")]},
     "members[0].versions[0].uri must be fetched (s3, gs, http, https)"),
])
def test_a_bad_members_file_is_refused_naming_the_field(doc, field):
    with pytest.raises(StageListError) as caught:
        parse_members(json.dumps(doc), "ranking")
    assert field in str(caught.value)


def test_the_largest_file_the_operator_writes_is_read():
    """Every seat held and as many members lingering, each field at its API bound (a 63-character
    name, a 2048-byte URI, a sha256): within the file's bytes and entries."""
    from rankops.api.bounds import URI_MAX
    from rankops.render.shared_server import members_json

    def entry(i: int) -> Member:
        name = f"m{i:02d}" + "x" * 60
        uri = "s3://models/" + "u" * (URI_MAX - len("s3://models/"))
        return Member(name, "model.onnx", (Wanted("v" * 63, 999_999_999, uri, "f" * 64),))

    text = members_json("ranking", [entry(i) for i in range(staged.MAX_ENTRIES)])
    assert staged.MAX_ENTRIES == 2 * staged.MAX_MEMBERS and len(text) <= staged.MAX_FILE_BYTES
    assert len(parse_members(text, "ranking")) == staged.MAX_ENTRIES


def test_members_come_one_fetch_a_round_and_go_once_nothing_is_left_to_fetch(tmp_path):
    repository, members_file = tmp_path / "models", tmp_path / "members.json"
    repository.mkdir()
    coarse = _artifact(tmp_path, "coarse", "1", b"coarse-1")
    fine = _artifact(tmp_path, "fine", "1", b"fine-1")
    _write(members_file, [Member("coarse", "model.onnx", (coarse,)), Member("fine", "model.onnx", (fine,))])

    assert _round(repository, members_file) == [f"coarse version 1: fetched {coarse.uri} into {repository}/coarse/1",
                                                f"fine version 1: fetched {fine.uri} into {repository}/fine/1"]
    assert _round(repository, members_file) == []
    assert (repository / "fine" / "1" / "model.onnx").read_bytes() == b"fine-1"

    # fine leaves and coarse gets version 2: fine's room first, coarse's old version once the new is there
    coarse2 = _artifact(tmp_path, "coarse", "2", b"coarse-2")
    _write(members_file, [Member("coarse", "model.onnx", (coarse2,))])
    assert _round(repository, members_file) == ["fine: removed (no longer a member)",
                                                f"coarse version 2: fetched {coarse2.uri} into {repository}/coarse/2"]
    assert (repository / "coarse" / "1").exists()
    assert _round(repository, members_file) == ["coarse version directory 1: removed (no longer listed)"]
    assert sorted(p.name for p in repository.iterdir()) == ["coarse"]
    assert _round(repository, members_file) == []


def test_a_round_that_cannot_judge_changes_nothing(tmp_path):
    repository, members_file = tmp_path / "models", tmp_path / "members.json"
    (repository / "coarse" / "1").mkdir(parents=True)
    lines = _round(repository, members_file)
    assert lines[0].startswith(f"members file {members_file} unreadable") and lines[0].endswith("nothing changed")
    members_file.write_text('{"server": "ranking", "members": []}')
    assert "would remove every model" in _round(repository, members_file)[0]
    assert (repository / "coarse" / "1").is_dir()


def test_a_member_that_cannot_be_fetched_never_holds_up_the_others(tmp_path):
    repository, members_file = tmp_path / "models", tmp_path / "members.json"
    (repository / "gone" / "1").mkdir(parents=True)
    broken = tmp_path / "store" / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "weights.bin").write_bytes(b"x")          # not the file its format needs
    fine = _artifact(tmp_path, "fine", "1", b"fine-1")
    _write(members_file, [Member("broken", "model.onnx", (Wanted("1", 1, broken.as_uri()),)),
                          Member("fine", "model.onnx", (fine,))])
    removed, failed, fetched = _round(repository, members_file)
    assert removed == "gone: removed (no longer a member)"
    assert failed.startswith(f"broken version 1: fetching {broken.as_uri()} into") and "failed" in failed
    assert "model.onnx" in failed
    assert fetched == f"fine version 1: fetched {fine.uri} into {repository}/fine/1"
    assert not (repository / "broken" / "1").exists()
    again, = _round(repository, members_file)           # tried again each round, alone
    assert again.startswith("broken version 1") and "failed" in again


def test_a_link_or_file_where_a_members_directory_belongs_is_removed_never_followed(tmp_path):
    repository, members_file, outside = tmp_path / "models", tmp_path / "members.json", tmp_path / "outside"
    repository.mkdir()
    (outside / "7").mkdir(parents=True)
    (repository / "coarse").symlink_to(outside)
    (repository / "fine").write_text("not a directory")
    coarse = _artifact(tmp_path, "coarse", "1", b"coarse-1")
    fine = _artifact(tmp_path, "fine", "1", b"fine-1")
    _write(members_file, [Member("coarse", "model.onnx", (coarse,)), Member("fine", "model.onnx", (fine,))])
    assert _round(repository, members_file) == ["coarse: removed a link or file where its directory belongs",
                                                "fine: removed a link or file where its directory belongs"]
    assert (outside / "7").is_dir() and sorted(p.name for p in outside.iterdir()) == ["7"]
    _round(repository, members_file)
    assert (repository / "coarse" / "1" / "model.onnx").read_bytes() == b"coarse-1"
    assert (repository / "fine" / "1" / "model.onnx").read_bytes() == b"fine-1"


def test_removing_a_member_never_follows_a_link_out_of_the_repository(tmp_path):
    repository, outside = tmp_path / "models", tmp_path / "outside"
    repository.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("x")
    (repository / "gone").symlink_to(outside)
    remove_model_dir(repository, "gone")
    assert not (repository / "gone").exists() and (outside / "keep").exists()
    with pytest.raises(ValueError):
        remove_model_dir(repository, "..")


def test_the_command_runs_a_round_and_says_what_it_did(tmp_path):
    import functools
    import http.server
    import threading

    repository, members_file = tmp_path / "models", tmp_path / "members.json"
    repository.mkdir()
    coarse = _artifact(tmp_path, "coarse", "1", b"coarse-1")
    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    store = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(quiet, directory=str(tmp_path / "store")))
    threading.Thread(target=store.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{store.server_address[1]}/coarse/1/model.onnx"
        _write(members_file, [Member("coarse", "model.onnx", (Wanted("1", 1, uri, coarse.sha256),))])
        command = [sys.executable, "-m", "rankops", "stage-members", "--once", "--server", "ranking",
                   "--repository", str(repository), "--members-file", str(members_file)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"rankops stage-members: coarse version 1: fetched {uri} into {repository}/coarse/1"
        assert (repository / "coarse" / "1" / "model.onnx").read_bytes() == b"coarse-1"
    finally:
        store.shutdown()
    _write(members_file, [Member("coarse", "model.onnx", (coarse,))])      # file:// refused by the command
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1 and "uri must be fetched (s3, gs, http, https)" in done.stdout
    _write(members_file, [Member("coarse", "model.onnx", (Wanted("1", 1, uri),))], server="other")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1 and "`server` must be 'ranking'" in done.stdout
    done = subprocess.run([*command, "--interval", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "--interval must be above 0" in done.stderr
