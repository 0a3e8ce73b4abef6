"""The stager of a shared Triton server (issue 42): keeps the pod's model repository holding
exactly the members, and each member's versions, that a file lists, fetched with the strict fetcher.

A member joins or leaves a running server: its directory must come or go without a restart, so
the pod runs `rankops stage-members` beside Triton, and the operator says what the repository
must hold in a file the pod mounts from the server's ConfigMap (the kubelet brings a ConfigMap
volume's changes into a running pod). The same rules as one model's stager (fetcher/stager.py),
one level up: each round reads the file and the repository and converges, at most one fetch per
member (in the file's order), a member's old versions removed only once it has nothing left to
fetch; a member whose fetch fails never holds up the others; a round that cannot read the file
changes nothing. A member's directory that is a link or a file is removed, never followed.

The file (`members.json`), at most MAX_FILE_BYTES and MAX_ENTRIES members:

    {"server": "ranking",
     "members": [{"model": "coarse", "expect": "model.onnx",
                  "versions": [{"name": "1", "dir": 1, "uri": "s3://models/coarse/1", "sha256": null}]},
                 ...]}

A member's directory is `<repository>/<model>`; a directory of the repository that no member
names is removed (the operator lists a member until every pod it could read has unloaded it:
serverplan.plan_server's `lingering`). Versions are fetched (FETCHED_SCHEMES), never file://. `expect` is the
file every version of that member must hold once fetched (its format's: model.onnx, model.pt,
model.plan), so a half-copied or misnamed artifact never reaches Triton.
"""
from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankops.fetcher.stager import (Fetch, Remove, StageListError, StageRound, Wanted, parse_document,
                                    parse_version_list, stage_plan, version_dirs)

MAX_MEMBERS = 32            # a server's seats: the members it holds
# The file lists the members held and, beside them, at most as many that left but may still be
# loaded on a pod (serverplan.plan_server's `lingering`); each entry at its largest (a 2048-byte
# URI and a version's other fields) is under 2.6 KB, so the most the operator writes fits.
MAX_ENTRIES = 2 * MAX_MEMBERS
MAX_FILE_BYTES = 256 * 1024
# A member joins a running pod, so its artifact is fetched, never mounted; and never a file:// path,
# which would copy the stage container's own files (its environment holds the credentials).
FETCHED_SCHEMES = ("s3", "gs", "http", "https")
# A member's directory name is its RankingModel's name: a DNS-1123 label, never a path.
_MODEL_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_EXPECT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}){0,2}")


@dataclass(frozen=True)
class Member:
    model: str
    expect: str | None
    versions: tuple[Wanted, ...]


def parse_members(text: str | bytes, server: str, schemes: Collection[str] = FETCHED_SCHEMES) -> tuple[Member, ...]:
    """The file's members, each checked (a version's URI of one of `schemes`); a StageListError
    names what is wrong."""
    said = "members file: "
    items = parse_document(text, said, "server", server, "this pod's server", MAX_FILE_BYTES).get("members")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ENTRIES:
        raise StageListError(f"{said}`members` must list 1 to {MAX_ENTRIES} members: an empty list would "
                             "remove every model the server serves")
    members: list[Member] = []
    for index, item in enumerate(items):
        where = f"members[{index}]"
        if not isinstance(item, dict):
            raise StageListError(f"{said}{where} must be an object")
        model, expect = item.get("model"), item.get("expect")
        if not isinstance(model, str) or not _MODEL_NAME.fullmatch(model):
            raise StageListError(f"{said}{where}.model must be a RankingModel's name (a DNS-1123 label), "
                                 f"got {model!r}")
        if expect is not None and not (isinstance(expect, str) and _EXPECT.fullmatch(expect)
                                       and ".." not in expect.split("/")):
            raise StageListError(f"{said}{where}.expect must name a file inside the version's directory "
                                 f"(e.g. model.onnx) or be null, got {expect!r}")
        versions = parse_version_list(item.get("versions"), said, f"{where}.versions")
        for index_v, version in enumerate(versions):
            if version.uri.split("://", 1)[0].lower() not in schemes:
                raise StageListError(f"{said}{where}.versions[{index_v}].uri must be fetched ({', '.join(schemes)}), "
                                     f"got {version.uri[:80]!r}")
        members.append(Member(model, expect, versions))
    models = [m.model for m in members]
    if len(set(models)) != len(models):
        raise StageListError(f"{said}a model is listed twice ({sorted(m for m in set(models) if models.count(m) > 1)})")
    return tuple(members)


def members_document(server: str, members: Iterable[Member]) -> dict[str, Any]:
    """The file's document, as the operator writes it into the server's ConfigMap."""
    return {"server": server, "members": [
        {"model": m.model, "expect": m.expect,
         "versions": [{"name": w.name, "dir": w.dir, "uri": w.uri, "sha256": w.sha256} for w in m.versions]}
        for m in members]}


def model_dirs(names: Iterable[str]) -> set[str]:
    """The model directories among the repository's entries (hidden ones are the fetcher's)."""
    return {name for name in names if _MODEL_NAME.fullmatch(name)}


FetchFor = Callable[[str | None], Fetch]     # a member's `expect` -> the fetch for its versions


def members_round(server: str, repository: Path, members_file: Path, fetch_for: FetchFor, remove: Remove,
                  remove_model: Callable[[Path, str], None],
                  schemes: Collection[str] = FETCHED_SCHEMES) -> StageRound:
    """One round: read the file and the repository; remove the directories of models no longer
    listed (they hold room others need); then for each member in the file's order, fetch its first
    missing version, or, when it has nothing left to fetch, remove its unlisted versions. A member
    whose fetch fails does not hold up the others: it is tried again next round. Errors come back
    as lines with ok False, never as exceptions (stager.stage_round)."""
    try:
        members = parse_members(members_file.read_bytes()[: MAX_FILE_BYTES + 1], server, schemes)
    except OSError as exc:
        return StageRound((f"members file {members_file} unreadable ({exc.strerror or exc}): nothing changed",), False)
    except StageListError as exc:
        return StageRound((f"{exc}: nothing changed",), False)
    done, ok = [], True

    def attempt(what: str, action: Callable[[], object], said: str, doing: str) -> None:
        nonlocal ok
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - one line each; the next round tries again
            done.append(f"{what}: {doing} failed: {exc}")
            ok = False
        else:
            done.append(f"{what}: {said}")

    listed = {m.model for m in members}
    on_volume = model_dirs(p.name for p in repository.iterdir()) if repository.is_dir() else set()
    for model in sorted(on_volume - listed):
        attempt(model, lambda: remove_model(repository, model), "removed (no longer a member)",
                "removing its directory")
    for member in members:
        model_dir = repository / member.model
        if model_dir.is_symlink() or (model_dir.exists() and not model_dir.is_dir()):
            # never followed: a link here could point a fetch or a removal outside the repository
            attempt(member.model, model_dir.unlink, "removed a link or file where its directory belongs",
                    "removing the link or file where its directory belongs")
            continue
        plan = stage_plan(member.versions, version_dirs(p.name for p in model_dir.iterdir())
                          if model_dir.is_dir() else ())
        if plan.fetch:
            version = plan.fetch[0]
            target = model_dir / str(version.dir)

            def fetch(version: Wanted = version, target: Path = target, expect: str | None = member.expect) -> None:
                target.parent.mkdir(exist_ok=True)
                fetch_for(expect)(version, target)
            attempt(f"{member.model} version {version.name}", fetch, f"fetched {version.uri} into {target}",
                    f"fetching {version.uri} into {target}")
            continue
        for directory in plan.remove:
            attempt(f"{member.model} version directory {directory}",
                    lambda d=directory: remove(model_dir, d), "removed (no longer listed)", "removing it")
    return StageRound(tuple(done), ok)


def remove_model_dir(repository: Path, model: str) -> None:
    """Remove a member's directory from the repository; a link is unlinked, never followed."""
    target = repository / model
    if not _MODEL_NAME.fullmatch(model) or target.parent.resolve() != repository.resolve():
        raise ValueError(f"{target} is not a model directory of {repository}")
    if target.is_symlink() or not target.is_dir():
        target.unlink()
    else:
        shutil.rmtree(target)
