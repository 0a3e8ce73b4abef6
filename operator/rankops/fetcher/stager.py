"""The in-pod stager of the in-place switch (issue 41): keeps a Triton pod's model directory holding
exactly the versions a file lists, fetched with the strict fetcher.

The operator cannot write into a pod's volume, and a new version added to the pod template would
restart the pod, which in place exists to avoid. So the pod runs `rankops stage-versions` beside
Triton with the model's volume and credentials (as `fetch-model` has them), and the operator says
what the volume must hold in a file the pod mounts from the model's ConfigMap: the kubelet brings
a ConfigMap volume's changes into a running pod, no restart. Level-based, like everything else
here: each round reads the file and the directory and converges, one fetch at a time; a round
that cannot read the file changes nothing (an unreadable list never empties a volume).

The file (`versions.json`), at most MAX_FILE_BYTES:

    {"model": "ranker",
     "versions": [{"name": "1", "dir": 1, "uri": "s3://models/ranker/1", "sha256": null},
                  {"name": "2", "dir": 2, "uri": "s3://models/ranker/2", "sha256": "ab12..."}]}

`dir` is the Triton version directory (render/tritonconfig.triton_version of `name`): what the
pod's Triton loads. A listed directory missing on the volume is fetched; a numeric directory not
listed is removed (the operator lists a version until every pod has unloaded it, so a file that
drops it is the operator's word that nothing serves it). Hidden entries (the fetcher's staging
copies and locks) are the fetcher's and are left to it.

`stage_plan` is pure; `stage_round` is the shell: it fetches, removes and says what it did.
"""
from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 64 * 1024
MAX_VERSIONS = 8          # the serving version, one being switched to, and room for rollbacks
_VERSION_DIR = re.compile(r"[1-9][0-9]{0,8}")


class StageListError(ValueError):
    """The versions file cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Wanted:
    """One version the volume must hold."""
    name: str                 # the RankingModel's version name
    dir: int                  # its Triton version directory
    uri: str
    sha256: str | None = None


@dataclass(frozen=True)
class StagePlan:
    fetch: tuple[Wanted, ...]      # listed, not on the volume: in the file's order
    remove: tuple[int, ...]        # on the volume, not listed

    @property
    def idle(self) -> bool:
        return not self.fetch and not self.remove


def parse_versions(text: str | bytes, model: str) -> tuple[Wanted, ...]:
    """The file's versions, each checked; a StageListError names what is wrong."""
    doc = parse_document(text, "versions file: ", "model", model, "this pod's model")
    return parse_version_list(doc.get("versions"), "versions file: ", "versions")


def parse_document(text: str | bytes, said: str, key: str, expected: str, whose: str,
                   max_bytes: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """A stager's file as a JSON object of at most `max_bytes` whose `key` is `expected`."""
    if len(text) > max_bytes:
        raise StageListError(f"{said}{len(text)} bytes, at most {max_bytes}")
    try:
        doc: Any = json.loads(text)
    except ValueError as exc:
        raise StageListError(f"{said}not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get(key) != expected:
        raise StageListError(f"{said}`{key}` must be {expected!r} ({whose}), "
                             f"got {doc.get(key) if isinstance(doc, dict) else doc!r}")
    return doc


def parse_version_list(items: Any, said: str, where: str) -> tuple[Wanted, ...]:
    """One model's versions list (`where` names it in errors), each checked."""
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_VERSIONS:
        raise StageListError(f"{said}`{where}` must list 1 to {MAX_VERSIONS} versions: an empty list "
                             "would remove the serving one")
    wanted: list[Wanted] = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise StageListError(f"{said}{at} must be an object")
        name, directory, uri, sha256 = item.get("name"), item.get("dir"), item.get("uri"), item.get("sha256")
        if not isinstance(name, str) or not name:
            raise StageListError(f"{said}{at}.name must be the version's name")
        if not isinstance(directory, int) or isinstance(directory, bool) or not _VERSION_DIR.fullmatch(str(directory)):
            raise StageListError(f"{said}{at}.dir must be a Triton version number (1 or more), "
                                 f"got {directory!r}")
        if not isinstance(uri, str) or not uri:
            raise StageListError(f"{said}{at}.uri must be the version's artifact URI")
        if sha256 is not None and not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
            raise StageListError(f"{said}{at}.sha256 must be 64 lowercase hex digits or null")
        wanted.append(Wanted(name, directory, uri, sha256))
    dirs = [w.dir for w in wanted]
    if len(set(dirs)) != len(dirs):
        raise StageListError(f"{said}{where}: two versions share a Triton version directory ({dirs}): "
                             "give the versions numeric names")
    return tuple(wanted)


def version_dirs(names: Iterable[str]) -> set[int]:
    """The Triton version directories among a model directory's entries (hidden ones are the fetcher's)."""
    return {int(name) for name in names if _VERSION_DIR.fullmatch(name)}


def stage_plan(wanted: Iterable[Wanted], on_volume: Iterable[int]) -> StagePlan:
    """What makes the volume hold exactly `wanted`: fetches first (the new version before anything
    goes), then removals."""
    wanted = tuple(wanted)
    present = set(on_volume)
    listed = {w.dir for w in wanted}
    return StagePlan(fetch=tuple(w for w in wanted if w.dir not in present),
                     remove=tuple(sorted(present - listed)))


@dataclass(frozen=True)
class StageRound:
    """What one round did, a line each, and whether anything failed (the file, a fetch, a removal)."""
    lines: tuple[str, ...]
    ok: bool


Fetch = Callable[[Wanted, Path], None]        # (version, its directory) -> fetched, or raises
Remove = Callable[[Path, int], None]          # (model directory, version directory) -> removed


def stage_round(model: str, model_dir: Path, versions_file: Path, fetch: Fetch, remove: Remove) -> StageRound:
    """One round: read the file and the directory, fetch at most one missing version, remove the
    unlisted ones once nothing is left to fetch. Says what it did or why it did nothing, a line
    each; the file's, the fetcher's and a removal's errors come back as lines with ok False, never
    as exceptions, so a bad round leaves the volume as it was and the next round tries again."""
    try:
        data = versions_file.read_bytes()[: MAX_FILE_BYTES + 1]
        wanted = parse_versions(data, model)
    except OSError as exc:
        return StageRound((f"versions file {versions_file} unreadable ({exc.strerror or exc}): nothing changed",), False)
    except StageListError as exc:
        return StageRound((f"{exc}: nothing changed",), False)
    plan = stage_plan(wanted, version_dirs(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else ())
    if plan.fetch:
        version = plan.fetch[0]
        target = model_dir / str(version.dir)
        try:
            fetch(version, target)
        except Exception as exc:  # noqa: BLE001 - the fetcher's errors are one line each; the next round retries
            return StageRound((f"version {version.name}: fetching {version.uri} into {target} failed: {exc}",), False)
        return StageRound((f"version {version.name}: fetched {version.uri} into {target}",), True)
    done, ok = [], True
    for directory in plan.remove:
        try:
            remove(model_dir, directory)
        except (OSError, ValueError) as exc:   # a read-only or busy volume: said, tried again next round
            done.append(f"version directory {directory}: removing it failed: {exc}")
            ok = False
        else:
            done.append(f"version directory {directory}: removed (no longer listed)")
    return StageRound(tuple(done), ok)


def fetched_with(limits: Any, expect: str | None = None) -> Fetch:
    """The strict fetcher (fetcher/fetch.py) with `limits`, each version checked against its sha256;
    with `expect`, the file every version must hold (as fetch-model --expect; the digest covers it)."""
    from rankops.fetcher import fetch as fetcher

    def fetch(version: Wanted, target: Path) -> None:
        fetcher.fetch(version.uri, target, expect, limits=limits, sha256=version.sha256)
    return fetch


def versions_document(model: str, wanted: Iterable[Wanted]) -> dict[str, Any]:
    """The file's document, as the operator writes it into the model's ConfigMap."""
    return {"model": model, "versions": [{"name": w.name, "dir": w.dir, "uri": w.uri, "sha256": w.sha256}
                                         for w in wanted]}


def remove_version_dir(model_dir: Path, directory: int) -> None:
    """Remove a version directory from `model_dir`: a plain directory, or the fetcher's symlink and
    the hidden copy it points to. A link to anything outside `model_dir` is unlinked, never followed."""
    target = model_dir / str(directory)
    root = model_dir.resolve()
    if target.parent.resolve() != root:
        raise ValueError(f"{target} is not in the model's directory {model_dir}")
    if target.is_symlink():
        pointed = (target.parent / target.readlink()).resolve()
        target.unlink()
        if pointed.parent == root and pointed.name.startswith(f".{target.name}.") and pointed.is_dir():
            shutil.rmtree(pointed)
    elif target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    for leftover in model_dir.glob(f".{target.name}.*"):     # the fetcher's lock and stale copies
        shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
