"""The Dockerfiles under images/: they cannot be built here (no container engine), so check
what a build would rely on: the pinned UBI 8 Python base, the package installed from this
repository, a numeric non-root user, the OCI and Red Hat labels, and an entrypoint that is a
real `rankops` sub-command of this very CLI.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGES = {"operator": ["run"], "validator": ["validate-node"], "gates": ["gate"]}
BASE = re.compile(r"^registry\.access\.redhat\.com/ubi8/python-311:(?P<tag>[0-9][0-9A-Za-z.-]*)$")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(instrs):
    starts = [i for i, (word, _) in enumerate(instrs) if word == "FROM"]
    return instrs[starts[-1]:]


def exec_form(instrs, word: str) -> list[str]:
    found = [args for w, args in instrs if w == word]
    if not found:
        return []
    value = json.loads(found[-1])  # exec (JSON) form: no shell between the runtime and rankops
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{word} must be a JSON array"
    return value


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


@pytest.fixture(scope="module")
def cli():
    from rankops.cli import build_parser
    return build_parser()


def test_there_is_one_dockerfile_per_image():
    assert sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile")) == sorted(IMAGES)


@pytest.mark.parametrize("image", IMAGES)
def test_base_is_the_pinned_ubi8_python_image(image):
    instrs = instructions(ROOT / "images" / image / "Dockerfile")
    args = dict(a.split("=", 1) for w, a in instrs if w == "ARG" and "=" in a)
    froms = [a.split()[0] for w, a in instrs if w == "FROM"]
    assert froms and all(f == "${BASE_IMAGE}" for f in froms), froms
    match = BASE.match(args.get("BASE_IMAGE", ""))
    assert match, f"BASE_IMAGE {args.get('BASE_IMAGE')!r} is not ubi8/python-311 pinned by a version tag"


def test_all_images_share_one_base():
    bases = {dict(a.split("=", 1) for w, a in instructions(ROOT / "images" / i / "Dockerfile")
                  if w == "ARG" and "=" in a)["BASE_IMAGE"] for i in IMAGES}
    assert len(bases) == 1, f"bump the base in every Dockerfile together: {bases}"


@pytest.mark.parametrize("image", IMAGES)
def test_installs_this_package(image):
    instrs = instructions(ROOT / "images" / image / "Dockerfile")
    copies = " ".join(a for w, a in instrs if w == "COPY")
    for needed in ("pyproject.toml", "README.md", "operator"):
        assert needed in copies.split(), f"the build needs {needed} from the repository"
    build_runs = [a for w, a in instrs if w == "RUN" and "pip wheel" in a]
    assert build_runs and "/src" in build_runs[0], "build the wheel from the copied source"
    final_runs = " ".join(a for w, a in final_stage(instrs) if w == "RUN")
    assert "pip install" in final_runs and "rankops-*.whl" in final_runs
    assert "--no-cache-dir" in final_runs, "keep pip's cache out of the image"
    # torch only where the TorchScript reference runs, and from the CPU wheel index.
    mentions_torch = "[torch]" in final_runs
    assert mentions_torch == (image == "gates")
    if mentions_torch:
        assert "download.pytorch.org/whl/cpu" in (ROOT / "images" / image / "Dockerfile").read_text()


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_numeric_non_root_user(image):
    final = final_stage(instructions(ROOT / "images" / image / "Dockerfile"))
    users = [a for w, a in final if w == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} must be numeric and non-zero (runAsNonRoot)"


@pytest.mark.parametrize("image", IMAGES)
def test_carries_oci_and_red_hat_labels(image):
    final = final_stage(instructions(ROOT / "images" / image / "Dockerfile"))
    labels = {}
    for w, a in final:
        if w == "LABEL":
            labels.update(item.split("=", 1) for item in shlex.split(a))
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.version",
                "org.opencontainers.image.source", "org.opencontainers.image.licenses",
                "org.opencontainers.image.description", "name", "vendor", "version", "summary"):
        assert labels.get(key), f"{image}: missing label {key}"
    assert labels["org.opencontainers.image.title"] == f"rankops-{image}"
    assert labels["name"].endswith(f"/rankops-{image}")


@pytest.mark.parametrize("image,command", IMAGES.items())
def test_entrypoint_is_a_real_rankops_command(cli, image, command):
    final = final_stage(instructions(ROOT / "images" / image / "Dockerfile"))
    entrypoint = exec_form(final, "ENTRYPOINT")
    assert entrypoint[:1] == ["rankops"], f"{image}: ENTRYPOINT {entrypoint} does not start rankops"
    assert entrypoint[1:] == command
    assert subparser(cli, command[0]) is not None, f"`rankops {command[0]}` is not a command of rankops.cli"
    # The default CMD must parse too (or be --help, which exits 0).
    try:
        cli.parse_args(entrypoint[1:] + exec_form(final, "CMD"))
    except SystemExit as exc:
        assert exc.code == 0, f"{image}: `{' '.join(entrypoint + exec_form(final, 'CMD'))}` is rejected by the CLI"


def test_the_console_script_is_declared():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["rankops"] == "rankops.cli:main"


@pytest.mark.parametrize("image", IMAGES)
def test_installs_the_package_with_its_dependencies(image):
    """`rankops fetch-model` (init containers, from any of these images) needs boto3 for s3:// and gs://."""
    import tomllib
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"boto3\b", d) for d in dependencies)
    final_runs = " ".join(a for w, a in final_stage(instructions(ROOT / "images" / image / "Dockerfile")) if w == "RUN")
    assert "--no-deps" not in final_runs, "the final install must bring the package's dependencies"
