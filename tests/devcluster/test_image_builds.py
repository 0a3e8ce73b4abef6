"""`rankops dev images` without buildah: content hashes, build arguments, command lines.

The real builds run in `rankops dev images --check` (minutes, root, buildah): not in this suite.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from rankops_dev import image_builds as ib
from rankops_dev import triton

ROOT = Path(__file__).resolve().parents[2]


def dockerfile_args(path: Path, target: str) -> set[str]:
    """ARG names visible to `target`: the global ones and those of the stages it is built from."""
    from tests.test_images import instructions

    declared, stage, parents = set(), None, {}
    per_stage: dict[str | None, set[str]] = {None: set()}
    for word, args in instructions(path):
        if word == "FROM":
            parts = args.split()
            stage = parts[2]
            parents[stage] = parts[0]
            per_stage[stage] = set()
        elif word == "ARG":
            per_stage[stage].add(args.split("=", 1)[0])
    name = target
    while name in per_stage:
        declared |= per_stage[name]
        name = parents.get(name)
    return declared | per_stage[None]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the files the builds read, to change one at a time."""
    for name in [*ib.context_files(ROOT, "operator"), *ib.context_files(ROOT, ib.TRITON_TARGET)]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    for name in ("dev/rankops_dev/cluster.py", "operator/rankops/__pycache__/cli.cpython-311.pyc"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("left out of the images")
    return tmp_path


def tags(root: Path, base_id: str = "sha256:base", **args: str) -> dict[str, str]:
    return {t: ib.content_tag(root, t, base_id, {**ib.build_args(t, "localhost/rankops-base:x"), **args})
            for t in (*ib.RANKOPS_TARGETS, ib.TRITON_TARGET)}


def test_the_tag_is_a_content_hash_of_the_target_and_its_inputs(repo):
    first = tags(repo)
    assert first == tags(repo), "same inputs, same tags"
    assert len(set(first.values())) == len(first), "each target its own tag"
    for target, tag in first.items():
        assert re.fullmatch(rf"localhost/rankops-{target}:[0-9a-f]{{12}}", tag)


@pytest.mark.parametrize("changed, rebuilt", [
    ("operator/rankops/cli.py", set(ib.RANKOPS_TARGETS)),
    ("images/Dockerfile", set(ib.RANKOPS_TARGETS)),
    ("images/requirements.lock", set(ib.RANKOPS_TARGETS)),
    ("pyproject.toml", set(ib.RANKOPS_TARGETS)),
    (".dockerignore", set(ib.RANKOPS_TARGETS)),
    ("images/Dockerfile.triton-test", {ib.TRITON_TARGET}),
    ("dev/rankops_dev/triton_standin.py", {ib.TRITON_TARGET}),
    ("dev/rankops_dev/triton_cpu_shim.py", {ib.TRITON_TARGET}),
    # Left out of the rankops images by .dockerignore: no rebuild.
    ("dev/rankops_dev/cluster.py", set()),
    ("operator/rankops/__pycache__/cli.cpython-311.pyc", set()),
])
def test_a_changed_file_rebuilds_exactly_the_images_that_copy_it(repo, changed, rebuilt):
    before = tags(repo)
    with open(repo / changed, "a") as fh:
        fh.write("\n# changed\n")
    after = tags(repo)
    assert {t for t in before if before[t] != after[t]} == rebuilt


def test_a_new_base_build_argument_or_mount_rebuilds(repo):
    before = tags(repo)
    assert all(before[t] != tag for t, tag in tags(repo, base_id="sha256:other").items())
    assert all(before[t] != tag for t, tag in tags(repo, VERSION="9.9.9").items())
    args = ib.build_args("operator", "b")
    assert ib.content_tag(repo, "operator", "i", args) != ib.content_tag(repo, "operator", "i", args, ["--volume=/a:/a"])


def test_the_hashed_context_covers_what_the_dockerfile_copies():
    files = ib.context_files(ROOT, "operator")
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()]
    for included in (l[1:] for l in lines if l.startswith("!")):
        assert any(f == included or f.startswith(included + "/") for f in files), included
    assert "operator/rankops/cli.py" in files
    assert not [f for f in files if f.startswith("dev/") or f.endswith(".pyc") or "__pycache__" in f]


@pytest.mark.parametrize("target", ib.RANKOPS_TARGETS)
def test_build_args_of_a_rankops_target_are_arguments_its_dockerfile_declares(target):
    from rankops.images import VERSION

    args = ib.build_args(target, "localhost/rankops-base:bookworm-abc")
    assert args["BASE_IMAGE"] == "localhost/rankops-base:bookworm-abc"
    assert args["VERSION"] == VERSION
    assert set(args) <= dockerfile_args(ROOT / ib.DOCKERFILE, target)
    # download.pytorch.org is unreachable here: the dev gates image is the slim one.
    assert args.get("WITH_TORCH") == ("false" if target == "gates" else None)


def test_the_triton_test_image_is_built_as_the_fixture_installs_it():
    args = ib.build_args(ib.TRITON_TARGET, "localhost/rankops-base:bookworm-abc")
    assert args == {"BASE_IMAGE": "localhost/rankops-base:bookworm-abc", "PYTRITON_VERSION": triton.PYTRITON_VERSION,
                    "STUB_REQUIREMENTS": " ".join(triton.STUB_REQUIREMENTS)}
    path = ROOT / ib.TRITON_DOCKERFILE
    assert set(args) <= dockerfile_args(path, ib.TRITON_TARGET)
    text = path.read_text()
    # Its own defaults agree with the fixture's, and each stand-in backend is there.
    assert f"ARG PYTRITON_VERSION={triton.PYTRITON_VERSION}" in text
    assert f'ARG STUB_REQUIREMENTS="{" ".join(triton.STUB_REQUIREMENTS)}"' in text
    for backend in triton.STANDIN_BACKENDS:
        assert f"COPY triton_standin.py /opt/tritonserver/backends/{backend}/model.py" in text
    # The shim is the `tritonserver` on PATH; the server it execs keeps its name (the tests find it by it).
    assert "COPY --chmod=0755 triton_cpu_shim.py /opt/tritonserver/bin/tritonserver" in text
    from rankops_dev import triton_cpu_shim
    assert f"mv /opt/tritonserver/bin/tritonserver {triton_cpu_shim.REAL}" in text
    assert Path(triton_cpu_shim.REAL).name == "tritonserver"
    from rankops.render.serving import TRITON_UID
    assert re.search(rf"^USER {TRITON_UID}$", text, re.M), "runs as NVIDIA's triton-server user, as the pods do"
    with pytest.raises(ValueError):
        ib.build_args("nope", "x")


def test_the_base_is_shaped_like_the_ubi8_image_the_dockerfile_assumes():
    from tests.test_images import final_stage, image_instructions

    users = [a for w, a in final_stage(image_instructions("operator")) if w == "USER"]
    assert users == [str(ib.APP_UID)]
    assert ib.BASE_ENV["PATH"].startswith(f"{ib.APP_ROOT}/bin:"), "pip and the console scripts from the venv"
    assert f"python3 -m venv {ib.APP_ROOT}" in ib.BASE_SETUP
    assert f"chown -R {ib.APP_UID}:0 {ib.APP_ROOT}" in ib.BASE_SETUP
    assert f"--user={ib.APP_UID}" in ib.base_config_command("c")
    assert re.fullmatch(r"localhost/rankops-base:bookworm-[0-9a-f]{12}", ib.base_tag())


def test_missing_tools_are_named_with_the_apt_packages_to_install():
    assert ib.missing_tools(lambda tool: f"/usr/bin/{tool}") == []
    missing = ib.missing_tools(lambda tool: None if tool == "debootstrap" else "/usr/bin/buildah")
    assert missing == ["debootstrap"]
    assert "apt-get install -y debootstrap" in ib.missing_tools_message(missing)
    assert "apt-get install -y buildah debootstrap" in ib.missing_tools_message(ib.missing_tools(lambda _: None))


def test_command_lines():
    assert ib.debootstrap_command(Path("/r"), Path("/d")) == [
        "debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "--cache-dir=/d",
        "bookworm", "/r", "http://deb.debian.org/debian"]
    build = ib.build_command("images/Dockerfile", "gates", "localhost/rankops-gates:abc",
                             {"BASE_IMAGE": "b", "WITH_TORCH": "false"}, "/repo", ["--volume=/x:/x:ro"])
    assert build == ["buildah", "bud", "--isolation=chroot", "--layers", "--force-rm", "--volume=/x:/x:ro",
                     "-f", "images/Dockerfile", "--target", "gates", "--build-arg=BASE_IMAGE=b",
                     "--build-arg=WITH_TORCH=false", "-t", "localhost/rankops-gates:abc", "/repo"]
    assert ib.export_command("localhost/rankops-operator:abc", Path("/out")) == [
        "buildah", "push", "-q", "localhost/rankops-operator:abc",
        "oci-archive:/out/rankops-operator.tar:localhost/rankops-operator:abc"]
    assert ib.host_trust_mounts(lambda p: False) == []
    assert ib.host_trust_mounts(lambda p: True) == [
        "--volume=/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
        f"--volume=/etc/ssl/certs/ca-certificates.crt:{ib.APP_ROOT}/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem:ro"]


def test_the_table_shows_size_and_time_per_image():
    rows = ib.table([ib.Built("operator", "localhost/rankops-operator:abc", 21.64, False, "502 MB"),
                     ib.Built("gates", "localhost/rankops-gates:def", 0.04, True, "502 MB")]).splitlines()
    assert rows[0].split() == ["image", "size", "build"]
    assert rows[1].split() == ["localhost/rankops-operator:abc", "502", "MB", "21.6", "s", "built"]
    assert rows[2].split()[-1] == "cached"
