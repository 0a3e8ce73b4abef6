"""The release workflow pushes what the defaults name: every image the chart, the API models and
the CRDs hand out by default is a repository .github/workflows/release.yaml pushes, under the
tag it pushes (the tag's version, checked against pyproject.toml and the chart's appVersion).
The kind cluster config keeps the e2e fixtures' contract (as many real nodes as a module asks for, the
first with the local real node's CPU manager). No
network: the workflows are parsed, not run.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from test_images import chart_settings_refused, named_defaults

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / ".github" / "workflows" / "release.yaml"
E2E_KIND = ROOT / ".github" / "workflows" / "e2e-kind.yaml"
EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def workflow(path: Path) -> dict:
    loaded = yaml.safe_load(path.read_text())
    loaded["on"] = loaded.pop(True, loaded.get("on"))  # YAML 1.1 reads the key `on` as true
    return loaded


def release_version_module():
    spec = importlib.util.spec_from_file_location("release_version", ROOT / ".github" / "scripts" / "release_version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_step(flow: dict) -> dict:
    steps = [s for s in flow["jobs"]["images"]["steps"] if s.get("uses", "").startswith("docker/build-push-action@")]
    assert len(steps) == 1, steps
    return steps[0]


def pushed_references(flow: dict, version: str) -> list[str]:
    """The build step's `tags`, its expressions evaluated for each matrix target and `version`."""
    template = build_step(flow)["with"]["tags"]
    references = []
    for target in flow["jobs"]["images"]["strategy"]["matrix"]["target"]:
        known = {"env.REGISTRY": flow["env"]["REGISTRY"], "matrix.target": target,
                 "needs.version.outputs.version": version}
        references.append(EXPRESSION.sub(lambda m: known[m.group(1)], template))
    return references


def test_a_tag_pushes_the_product_images_for_amd64_with_their_version():
    flow = workflow(RELEASE)
    assert flow["on"] == {"push": {"tags": ["v*"]}}
    step = build_step(flow)["with"]
    assert (step["file"], step["target"], step["platforms"], step["push"]) == (
        "images/Dockerfile", "${{ matrix.target }}", "linux/amd64", True)
    assert step["build-args"] == "VERSION=${{ needs.version.outputs.version }}"


def test_every_default_image_is_one_the_release_pushes():
    """A default (API constant, CRD schema default, chart value) naming a repository or tag the
    release does not push fails here, as does a pushed image no default names."""
    from rankops import images

    pushed = set(pushed_references(workflow(RELEASE), images.VERSION))
    assert pushed == {images.image(kind) for kind in images.REPOSITORIES}
    ours = {where: ref for where, ref in named_defaults().items() if not ref.startswith("nvcr.io/")}
    assert len(ours) >= 7, ours
    for where, ref in ours.items():
        assert ref in pushed, f"{where} defaults to {ref}; a release of {images.VERSION} pushes {sorted(pushed)}"


def test_the_pushed_tag_is_the_checked_version_of_the_git_tag():
    jobs = workflow(RELEASE)["jobs"]
    assert "version" in jobs["images"]["needs"]
    assert jobs["version"]["outputs"]["version"] == "${{ steps.version.outputs.version }}"
    (check,) = [s for s in jobs["version"]["steps"] if s.get("id") == "version"]
    assert 'python .github/scripts/release_version.py "$GITHUB_REF_NAME"' in check["run"]
    assert 'echo "version=$version" >> "$GITHUB_OUTPUT"' in check["run"]


def test_the_current_version_releases_and_its_defaults_carry_it():
    from rankops import images

    module = release_version_module()
    pyproject, chart = (ROOT / "pyproject.toml").read_text(), (ROOT / module.CHART).read_text()
    assert module.release_version(f"v{images.VERSION}", pyproject, chart) == images.VERSION


@pytest.mark.parametrize("tag, names", [
    ("v9.9.9", ("pyproject.toml says 0.1.0", "appVersion says 0.1.0")),
    ("0.1.0", ("v<version>",)),
    ("v", ("v<version>",)),
])
def test_a_tag_the_repository_does_not_carry_is_refused(tag, names):
    module = release_version_module()
    pyproject = '[project]\nname = "rankops"\nversion = "0.1.0"\n'
    chart = 'apiVersion: v2\nname: rankops-operator\nversion: 0.1.0\nappVersion: "0.1.0"\n'
    with pytest.raises(module.VersionMismatch) as refused:
        module.release_version(tag, pyproject, chart)
    for name in names:
        assert name in str(refused.value)


def test_only_the_chart_lagging_is_refused_too():
    module = release_version_module()
    pyproject = '[project]\nname = "rankops"\nversion = "0.2.0"\n'
    chart = 'appVersion: "0.1.0"\n'
    with pytest.raises(module.VersionMismatch, match="appVersion says 0.1.0") as refused:
        module.release_version("v0.2.0", pyproject, chart)
    assert "pyproject.toml" not in str(refused.value)


def kind_cluster() -> dict:
    return yaml.safe_load((ROOT / "e2e" / "kind" / "cluster.yaml").read_text())


def kind_patches(node: dict, kind: str) -> list[dict]:
    return [p for p in map(yaml.safe_load, node.get("kubeadmConfigPatches", [])) if p["kind"] == kind]


def test_the_kind_workflow_expects_the_release_its_nodes_run():
    cluster = kind_cluster()
    node_images = {node["image"] for node in cluster["nodes"]}
    assert len(node_images) == 1, f"every kind node runs one release: {node_images}"
    release = node_images.pop().split("@")[0].rsplit(":", 1)[1]
    flow = workflow(E2E_KIND)
    assert flow["jobs"]["e2e-kind"]["env"]["RANKOPS_E2E_EXPECT_VERSION"] == release


def test_the_kind_real_nodes_are_tainted_workers_the_first_with_the_local_real_nodes_cpu_manager():
    """The contract with the e2e fixtures: as many workers labelled and tainted
    rankops.io/real-node=true as an e2e module's REAL_NODES asks for (setup.sh finds them by the
    label), namespaces pinned to them by the admission plugins the local control plane enables,
    and the first one's kubelet CPU manager as the local real node's static one."""
    from rankops_dev.real_node_config import NodeLayout, kubelet_config

    asked = max([1, *(int(m.group(1)) for path in (ROOT / "e2e").glob("*.py")
                      for m in re.finditer(r"^REAL_NODES = (\d+)", path.read_text(), re.M))])
    nodes = kind_cluster()["nodes"]
    workers = [n for n in nodes if n["role"] == "worker"]
    real = [n for n in workers if n.get("labels", {}).get("rankops.io/real-node") == "true"]
    assert asked == 2 and len(real) == asked and len(workers) == asked + 1, \
        f"a worker for the chart, {asked} as real nodes: {workers}"
    joins = [kind_patches(node, "JoinConfiguration") for node in real]
    for [each] in joins:
        assert each["nodeRegistration"]["taints"] == [{"key": "rankops.io/real-node", "value": "true",
                                                        "effect": "NoSchedule"}]
    [join] = joins[0]
    [control_plane] = [n for n in nodes if n["role"] == "control-plane"]
    [cluster_config] = kind_patches(control_plane, "ClusterConfiguration")
    plugins = cluster_config["apiServer"]["extraArgs"]["enable-admission-plugins"].split(",")
    assert {"PodNodeSelector", "PodTolerationRestriction"} <= set(plugins)

    local = yaml.safe_load(kubelet_config(NodeLayout(Path("/n"), "n", "10.0.0.1", "10.1.0.0/24", "10.2.0.0/16",
                                                     cpu_manager_policy="static")))
    flags = join["nodeRegistration"]["kubeletExtraArgs"]
    assert flags["cpu-manager-policy"] == local["cpuManagerPolicy"]
    assert flags["kube-reserved"] == ",".join(f"{k}={v}" for k, v in local["kubeReserved"].items())
    assert flags["cpu-manager-reconcile-period"] == local["cpuManagerReconcilePeriod"]


@pytest.mark.parametrize("document", ["README.md", "docs/release.md", "docs/install.md", "images/README.md"])
def test_the_install_and_mirroring_docs_set_values_the_chart_has(document):
    text = (ROOT / document).read_text()
    assert "--set " in text
    assert chart_settings_refused(text) == []


def test_the_mirroring_docs_point_every_image_value_at_the_mirror():
    """The chart's four image values, each in the README's install section and docs/release.md:
    a mirror that misses one leaves pods pulling from quay.io."""
    image_values = ("image.repository", "fetcher.image.repository", "gates.image.repository",
                    "validator.image.repository")
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("## Install on a cluster"):readme.index("## A RankingModel, step by step")]
    for text in (install, (ROOT / "docs" / "release.md").read_text()):
        for value in image_values:
            assert f"--set {value}=$MIRROR/" in text, value


@pytest.mark.parametrize("script", ["e2e/kind/setup.sh", ".ci/run", "dev/rankops_dev/build.sh"])
def test_the_shell_scripts_parse(script):
    """The kind set-up runs only where kind does (not on this project's machines): bash at least parses it."""
    import subprocess

    done = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
