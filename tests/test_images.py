"""images/Dockerfile, one target per image: CI has no container engine (the real builds are
`rankops dev images --check`, scripts/build-images-check.sh), so check what each target's build would rely on: the pinned UBI 8 Python base, the package installed from this
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
DOCKERFILE = ROOT / "images" / "Dockerfile"
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


def stages(path: Path = DOCKERFILE) -> tuple[list[tuple[str, str]], dict[str, tuple[str, list]]]:
    """The instructions before the first FROM (global ARGs), and each named stage: name ->
    (what it is FROM, its instructions after the FROM)."""
    instrs = instructions(path)
    head, named, current = [], {}, None
    for word, args in instrs:
        if word == "FROM":
            parts = args.split()
            assert len(parts) == 3 and parts[1].upper() == "AS", f"every stage is named: FROM {args}"
            current = parts[2]
            assert current not in named, f"stage {current} twice"
            named[current] = (parts[0], [])
        elif current is None:
            head.append((word, args))
        else:
            named[current][1].append((word, args))
    return head, named


def image_instructions(kind: str) -> list[tuple[str, str]]:
    """Target `kind` as a build of it sees it, flattened as if it were its own Dockerfile: the
    global ARGs, the stages it copies from, then one final stage holding its parents' instructions
    and its own (FROM a stage name is that stage, continued)."""
    head, named = stages()
    assert kind in named, f"images/Dockerfile has no target {kind}"
    chain, base = [], kind
    while base in named:
        chain.insert(0, base)
        base = named[base][0]
    final = [("FROM", f"{base} AS {kind}")] + [i for stage in chain for i in named[stage][1]]
    copied_from = [a.split()[0].split("=", 1)[1] for stage in chain for w, a in named[stage][1]
                   if w == "COPY" and a.startswith("--from=")]
    earlier = [i for name in copied_from for i in [("FROM", f"{named[name][0]} AS {name}"), *named[name][1]]]
    return head + earlier + final


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


def test_one_dockerfile_has_a_target_per_image_and_makes_the_operator_by_default():
    assert sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("images/**/Dockerfile")) == ["images/Dockerfile"]
    _, named = stages()
    assert set(IMAGES) <= set(named), sorted(named)
    assert list(named)[-1] == "operator", "a build without --target makes the last stage"


@pytest.mark.parametrize("image", IMAGES)
def test_base_is_the_pinned_ubi8_python_image(image):
    instrs = image_instructions(image)
    args = dict(a.split("=", 1) for w, a in instrs if w == "ARG" and "=" in a)
    froms = [a.split()[0] for w, a in instrs if w == "FROM"]
    assert froms and all(f == "${BASE_IMAGE}" for f in froms), froms
    match = BASE.match(args.get("BASE_IMAGE", ""))
    assert match, f"BASE_IMAGE {args.get('BASE_IMAGE')!r} is not ubi8/python-311 pinned by a version tag"


def test_all_images_share_one_base():
    bases = {dict(a.split("=", 1) for w, a in image_instructions(i)
                  if w == "ARG" and "=" in a)["BASE_IMAGE"] for i in IMAGES}
    assert len(bases) == 1, f"bump the base in every Dockerfile together: {bases}"


@pytest.mark.parametrize("image", IMAGES)
def test_installs_this_package(image):
    instrs = image_instructions(image)
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
        assert "download.pytorch.org/whl/cpu" in DOCKERFILE.read_text()


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_numeric_non_root_user(image):
    final = final_stage(image_instructions(image))
    users = [a for w, a in final if w == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} must be numeric and non-zero (runAsNonRoot)"


@pytest.mark.parametrize("image", IMAGES)
def test_carries_oci_and_red_hat_labels(image):
    final = final_stage(image_instructions(image))
    labels = {}
    for w, a in final:
        if w == "LABEL":
            labels.update(item.split("=", 1) for item in shlex.split(a))
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.version",
                "org.opencontainers.image.source", "org.opencontainers.image.licenses",
                "org.opencontainers.image.description", "name", "vendor", "version", "summary", "maintainer"):
        assert labels.get(key), f"{image}: missing label {key}"
    assert labels["org.opencontainers.image.title"] == f"rankops-{image}"
    assert labels["name"].endswith(f"/rankops-{image}")


@pytest.mark.parametrize("image,command", IMAGES.items())
def test_entrypoint_is_a_real_rankops_command(cli, image, command):
    final = final_stage(image_instructions(image))
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
    final_runs = " ".join(a for w, a in final_stage(image_instructions(image)) if w == "RUN")
    assert "--no-deps" not in final_runs, "the final install must bring the package's dependencies"


def dockerfile_labels(image: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for w, a in final_stage(image_instructions(image)):
        if w == "LABEL":
            labels.update(item.split("=", 1) for item in shlex.split(a))
    return labels


def built_images() -> dict[str, str]:
    """repository name -> the images/<kind> whose Dockerfile builds it (its OCI title)."""
    return {dockerfile_labels(kind)["org.opencontainers.image.title"]: kind for kind in IMAGES}


def named_defaults() -> dict[str, str]:
    """Every image reference this project hands out as a default: where -> reference."""
    from rankops.api.gpunodepool import DEFAULT_VALIDATOR_IMAGE
    from rankops.api.rankingmodel import DEFAULT_FETCHER_IMAGE, DEFAULT_GATES_IMAGE, DEFAULT_RANKOPS_IMAGE
    import yaml

    out = {"DEFAULT_FETCHER_IMAGE": DEFAULT_FETCHER_IMAGE, "DEFAULT_GATES_IMAGE": DEFAULT_GATES_IMAGE,
           "DEFAULT_RANKOPS_IMAGE": DEFAULT_RANKOPS_IMAGE, "DEFAULT_VALIDATOR_IMAGE": DEFAULT_VALIDATOR_IMAGE}
    chart = ROOT / "charts" / "rankops-operator"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    out["chart image"] = f"{values['image']['repository']}:{values['image']['tag'] or app_version}"

    def walk(node, where):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "default" and isinstance(v, str) and "/" in v and ":" in v:
                    out[where] = v
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            walk(doc, path.name)
    return out


def test_every_default_image_is_one_a_dockerfile_builds():
    """The API defaults, the CRDs' schema defaults and the chart's image all name
    <REGISTRY>/<title of a Dockerfile here>:<VERSION>: a default no Dockerfile builds fails here."""
    from rankops import images

    built = built_images()
    assert sorted(built) == sorted(images.REPOSITORIES.values())
    defaults = named_defaults()
    assert len(defaults) >= 7, defaults  # 4 constants, the chart, 2+ CRD defaults (the gpunodepool's + 2 in rankingmodels)
    for where, ref in defaults.items():
        if ref.startswith("nvcr.io/nvidia/tritonserver:"):
            continue  # NVIDIA's image, not ours
        repo, _, tag = ref.rpartition(":")
        registry, _, name = repo.rpartition("/")
        assert name in built, f"{where}: {ref} is built by no Dockerfile under images/ (they build {sorted(built)})"
        assert (registry, tag) == (images.REGISTRY, images.VERSION), f"{where}: {ref}"


def test_one_version_for_the_package_the_chart_and_the_images():
    import tomllib
    import yaml
    from rankops import images

    chart = yaml.safe_load((ROOT / "charts" / "rankops-operator" / "Chart.yaml").read_text())
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == images.VERSION
    assert chart["appVersion"] == images.VERSION
    for kind in IMAGES:
        args = dict(a.split("=", 1) for w, a in image_instructions(kind) if w == "ARG" and "=" in a)
        assert args["VERSION"] == images.VERSION, kind


def test_images_readme_names_the_built_images_and_settings_that_exist():
    """images/README.md: each image by its name, no image nobody builds, no chart value the schema refuses."""
    from rankops import images

    text = (ROOT / "images" / "README.md").read_text()
    for name in images.REPOSITORIES.values():
        assert f"`{name}`" in text
    for ref in re.findall(r"quay\.io/rankops/([a-z0-9-]+)", text):
        assert ref in images.REPOSITORIES.values(), f"images/README.md names quay.io/rankops/{ref}, built by no Dockerfile"
    assert not chart_settings_refused(text), "images/README.md: values.schema.json refuses these --set keys"


def chart_settings_refused(text: str) -> list[str]:
    """The `--set KEY=` keys in a document that the chart's values.schema.json has no property for."""
    schema = json.loads((ROOT / "charts" / "rankops-operator" / "values.schema.json").read_text())
    refused = []
    for key in re.findall(r"--set ([A-Za-z.]+)=", text):
        node = schema
        for part in key.split("."):
            if part in node.get("properties", {}):
                node = node["properties"][part]
            elif node.get("additionalProperties"):  # a free-form map (labels): any key
                break
            else:
                refused.append(key)
                break
    return refused


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "images" / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.lock: {line!r} is not pinned with =="
            pins[name] = version
    return pins


def test_the_lock_is_the_runtime_dependency_set_the_tests_run_with():
    """images/requirements.lock pins exactly what the package needs at run time, at the versions
    installed here (so the images carry what the tests ran), boto3 included (fetch-model's s3://)."""
    from rankops import images

    assert lock() == images.dependency_closure(), (
        "images/requirements.lock differs from the installed set: python -m rankops.images > images/requirements.lock")
    for needed in ("boto3", "botocore", "kopf", "kubernetes", "tritonclient", "pydantic", "grpcio", "geventhttpclient"):
        assert needed in lock(), needed


def test_the_lock_satisfies_the_package_requirements():
    import tomllib
    from packaging.requirements import Requirement

    pins = lock()
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(line)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins and req.specifier.contains(pins[name], prereleases=True), f"{line} vs lock {pins.get(name)}"


@pytest.mark.parametrize("image", IMAGES)
def test_every_image_installs_from_the_lock(image):
    final = final_stage(image_instructions(image))
    copies = [[p for p in a.split() if not p.startswith("--")] for w, a in final if w == "COPY"]
    assert ["images/requirements.lock", "/tmp/requirements.lock"] in copies
    installs = [part for w, a in final if w == "RUN" for part in a.split(";") if "pip install" in part]
    assert installs and all("-c /tmp/requirements.lock" in part for part in installs), installs


def test_the_gates_image_pins_the_torch_the_tests_ran():
    from importlib.metadata import version

    args = dict(a.split("=", 1) for w, a in image_instructions("gates") if w == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == version("torch").split("+")[0]
    assert '"torch==${TORCH_VERSION}"' in DOCKERFILE.read_text()


def test_the_build_context_carries_only_what_the_dockerfiles_copy():
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == "*", "exclude everything, then re-include what the images need"
    included = {l[1:] for l in lines if l.startswith("!")}
    copied = {src for kind in IMAGES for w, a in image_instructions(kind)
              if w == "COPY" and not a.startswith("--from") for src in
              [p for p in a.split() if not p.startswith("--")][:-1]}
    assert copied == included, f"COPY sources {sorted(copied)} vs .dockerignore's {sorted(included)}"


@pytest.mark.parametrize("command,modules", [
    (["run"], ["rankops.controller.handlers", "kopf", "kubernetes"]),
    (["validate-node"], ["rankops.validator.node", "rankops.validator.checks"]),
    (["gate", "warmup"], ["rankops.gates.warmup", "tritonclient.http", "tritonclient.grpc"]),
    (["gate", "equivalence"], ["rankops.gates.equivalence", "numpy"]),
    (["fetch-model"], ["rankops.commands.fetch", "rankops.fetcher.fetch", "boto3", "botocore.config"]),
], ids=["run", "validate-node", "gate-warmup", "gate-equivalence", "fetch-model"])
def test_each_entry_point_starts_in_a_clean_interpreter(command, modules):
    """What each image's entry point (and the fetch-model init container) imports is installed:
    the console script in a fresh process, isolated from the source tree and PYTHONPATH."""
    import os
    import subprocess
    import sys

    script = Path(sys.executable).with_name("rankops")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(script), *command, "--help"], capture_output=True, text=True, timeout=60,
                          cwd="/", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
    # --help parses only; the modules the command then runs import lazily, so import them too.
    done = subprocess.run([sys.executable, "-I", "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)",
                           *modules], capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("image", IMAGES)
def test_the_licence_is_in_licenses(image):
    """Red Hat's container certification checks for the licence terms under /licenses."""
    final = final_stage(image_instructions(image))
    assert ["LICENSE", "/licenses/LICENSE"] in [a.split() for w, a in final if w == "COPY"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
