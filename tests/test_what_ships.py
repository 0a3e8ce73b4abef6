"""What ships: the product's wheel and images hold the product and nothing else.

The dev harness (local cluster, the real nodes, image builds, the S3 and Triton
fixtures, the validator's sample host trees, `rankops dev`) is the rankops-dev distribution under
dev/; tests and benchmarks stay in the repository. Both wheels are built here from what the
images' build stage copies, and their files listed; `rankops dev` finds the harness through the
`rankops.commands` entry point, and says how to install it where it is absent."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "dev"
# Paths inside a wheel that are harness, fixtures or tests, whichever package they hide in.
NOT_PRODUCT = ("rankops_dev/", "rankops/devcluster/", "rankops/commands/dev", "sample_hosts", "conftest",
               "tests/", "e2e/", "benchmarks/", "build.sh", "kwok/", "sccadmit/", "real_cluster", "fakecluster",
               "nvidia-smi-")


def build_wheel(source: Path, out: Path) -> list[str]:
    """The files of the wheel pip builds from `source` (no dependencies fetched)."""
    # Without isolation where setuptools is at hand (no download); else pip fetches the backend.
    args = ["--no-build-isolation"] if _has_setuptools() else []
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *args, "--wheel-dir", str(out),
                           str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [wheel] = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def _has_setuptools() -> bool:
    """Whether the setuptools here can build both pyproject files: their `license` expression needs
    77+ (a Python 3.11 venv bundles 65). If not, pip fetches the backend into an isolated build."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("setuptools").split(".")[0]) >= 77
    except (PackageNotFoundError, ValueError):
        return False


def build_stage_copies() -> list[str]:
    """The repository paths images/Dockerfile's wheel-building stage copies."""
    stage, found = None, []
    for line in (ROOT / "images" / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            stage = words[-1]
        elif words[:1] == ["COPY"] and stage == "build":
            found += [w for w in words[1:-1] if not w.startswith("--")]
    return found


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory) -> list[str]:
    """The product's wheel, built as the images build it: from the files their build stage copies."""
    source = tmp_path_factory.mktemp("product-src")
    for path in build_stage_copies():
        if (ROOT / path).is_dir():
            shutil.copytree(ROOT / path, source / path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / path, source / path)
    return build_wheel(source, tmp_path_factory.mktemp("product-wheel"))


def test_the_product_wheel_holds_no_harness_fixture_dev_command_or_test(product_wheel):
    assert "rankops/cli.py" in product_wheel and "rankops/commands/run.py" in product_wheel
    assert "rankops/validator/checks.py" in product_wheel
    leaked = sorted(name for name in product_wheel if any(mark in name for mark in NOT_PRODUCT))
    assert not leaked, leaked
    [points] = [name for name in product_wheel if name.endswith(".dist-info/entry_points.txt")]
    assert points.startswith("rankops-")


def test_the_harness_wheel_holds_the_harness_and_registers_rankops_dev(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(DEV, source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    files = build_wheel(source, tmp_path / "wheel")
    for name in ("rankops_dev/real_cluster.py", "rankops_dev/kubeapi.py", "rankops_dev/sample_hosts.py",
                 "rankops_dev/commands/dev.py", "rankops_dev/build.sh", "rankops_dev/nvidia-smi-t4-535.xml", "rankops_dev/kwok/pod-ready.yaml",
                 "rankops_dev/sccadmit/main.go"):
        assert name in files, name
    assert not [name for name in files if name.startswith("rankops/")]
    [points] = [name for name in files if name.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(next((tmp_path / "wheel").glob("*.whl"))).read(points).decode()
    assert "[rankops.commands]" in text and "dev = rankops_dev.commands.dev:add_commands" in text, text


def test_the_images_build_context_leaves_the_harness_and_the_tests_out():
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == "*"
    included = {l[1:] for l in lines if l.startswith("!")}
    assert not [p for p in included if p.split("/")[0] in ("dev", "tests", "e2e", "benchmarks", "scripts")], included
    assert set(build_stage_copies()) <= included
    # Nothing of the harness is left where the images do look.
    assert not [p for p in (ROOT / "operator").rglob("*") if any(m in p.as_posix() for m in NOT_PRODUCT)]
    # The dev image builds hash what the images' context holds: nothing under dev/.
    from rankops_dev import image_builds

    assert not [f for f in image_builds.context_files(ROOT, "operator") if f.startswith("dev/")]


def test_rankops_dev_says_how_to_install_the_harness_where_it_is_absent(monkeypatch, capsys):
    import importlib.metadata

    from rankops import cli

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    assert cli.main(["dev", "up", "--nodes", "3"]) == 2
    assert "pip install -e ./dev" in capsys.readouterr().err
    assert cli.main(["dev", "--help"]) == 2
    with pytest.raises(SystemExit):  # only `rankops dev` takes arguments it does not know
        cli.main(["crds", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_rankops_dev_is_found_through_the_entry_point_rankops_dev_registers(tmp_path):
    """As an installed rankops-dev is found: its metadata on the path (entry_points.txt from
    dev/pyproject.toml), the sources from the checkout."""
    project = tomllib.loads((DEV / "pyproject.toml").read_text())["project"]
    info = tmp_path / f"rankops_dev-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("[rankops.commands]\n" + "".join(
        f"{name} = {target}\n" for name, target in project["entry-points"]["rankops.commands"].items()))
    path = os.pathsep.join([str(tmp_path), str(ROOT / "operator"), str(DEV)])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "rankops", "dev", "--help"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: rankops dev" in done.stdout and "demo" in done.stdout, done.stdout
