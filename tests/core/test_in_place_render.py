"""rollout.strategy inPlace (issue 41): the stable track's pod template names no version, so a
version switch changes only its ConfigMap (versions.json and config.pbtxt's version policy) and
restarts no pod; the pods stage their versions with `rankops stage-versions`."""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from rankops.api.rankingmodel import RankingModel, RolloutStrategy
from rankops.cli import build_parser
from rankops.render import names, serving
from rankops.render.desired import RenderError, ServingState, desired_objects, resolve_shape
from rankops.render.tritonconfig import version_free_config
from rankops.yamlio import dump_all

from test_latency_isolation import qos_class

HERE = pathlib.Path(__file__).parent
CASE = HERE / "cases" / "onnx-in-place.yaml"
DIGEST = "4" * 64


def _doc(**spec) -> dict:
    doc = yaml.safe_load(CASE.read_text())
    doc["spec"].update(spec)
    return doc


def _model(**spec) -> RankingModel:
    return RankingModel.model_validate(_doc(**spec))


def _objects(rm: RankingModel, state: ServingState) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in desired_objects(rm, state, resolve_shape(rm.spec))}


def _stable(rm: RankingModel, state: ServingState) -> tuple[dict, dict]:
    """(the stable Deployment, the stable ConfigMap)."""
    objects = _objects(rm, state)
    return objects[("Deployment", "ctr-switch-stable")], objects[("ConfigMap", "ctr-switch-stable-triton")]


def _container(deployment: dict, name: str) -> dict:
    pod = deployment["spec"]["template"]["spec"]
    return next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name)


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_stable_pod_template_is_the_same_whatever_version_it_serves_or_stages():
    rm = _model()
    # The pods were started for 3 (status.stablePodsVersion); 4 reached them in place.
    states = [ServingState("3", started_for="3"), ServingState("3", staged_versions=("4",), started_for="3"),
              ServingState("4", started_for="3"), ServingState("4", staged_versions=("3",), started_for="3")]
    rendered = [_stable(rm, state) for state in states]
    specs = {dump_all([deployment["spec"]]) for deployment, _ in rendered}
    assert len(specs) == 1, "a version switch must not change the pod template (it would restart every pod)"
    template = rendered[0][0]["spec"]["template"]
    assert names.LABEL_VERSION not in template["metadata"]["labels"]
    assert template["metadata"]["labels"][names.LABEL_TRAFFIC] == "on"
    # The version is the Deployment's own label, which rolls no pod.
    assert [d["metadata"]["labels"][names.LABEL_VERSION] for d, _ in rendered] == ["3", "3", "4", "4"]
    assert dump_all([rendered[0][0]]) == dump_all([rendered[1][0]])
    # Only the ConfigMaps tell the states apart.
    assert len({dump_all([config_map]) for _, config_map in rendered}) == len(states)
    # Started for another version (a rollout that fell back to pods promoted 4): the pods roll.
    rolled, _ = _stable(rm, ServingState("4", started_for="4"))
    assert rolled["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_STARTED_FOR] == "4"
    assert dump_all([rolled["spec"]]) not in specs


def test_versions_json_lists_the_serving_version_first_then_the_staged_ones():
    _, config_map = _stable(_model(), ServingState("4", staged_versions=("3",)))
    text = config_map["data"]["versions.json"]
    assert json.loads(text) == {"model": "ctr-switch", "versions": [
        {"name": "4", "dir": 4, "uri": "https://models.example.com/ctr-switch/4", "sha256": DIGEST},
        {"name": "3", "dir": 3, "uri": "s3://models/ctr-switch/3", "sha256": None}]}
    assert text == json.dumps(json.loads(text), sort_keys=True)
    from rankops.fetcher.stager import parse_versions
    assert [w.name for w in parse_versions(text, "ctr-switch")] == ["4", "3"], "the pod's stager accepts it"


def test_config_pbtxt_loads_exactly_the_serving_version_and_parses():
    rm = _model()
    for stable, staged in (("3", ("4",)), ("4", ("3",))):
        _, config_map = _stable(rm, ServingState(stable, staged_versions=staged))
        config = text_format.Parse(config_map["data"]["config.pbtxt"], mc.ModelConfig())
        assert list(config.version_policy.specific.versions) == [int(stable)]
    free = text_format.Parse(version_free_config("ctr-switch", "reco", rm.spec, rm.spec.versions[0],
                                                 resolve_shape(rm.spec).shape), mc.ModelConfig())
    assert not free.HasField("version_policy") and free.name == "ctr-switch"


def test_a_batching_change_still_rolls_the_pods_and_a_version_switch_does_not():
    def config_hash(rm: RankingModel, state: ServingState) -> str:
        deployment, _ = _stable(rm, state)
        return deployment["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]

    rm = _model()
    rebatched = _model(batching={"maxBatchSize": 32, "preferredBatchSizes": [8, 16]})
    assert config_hash(rm, ServingState("3")) == config_hash(rm, ServingState("4"))
    assert config_hash(rm, ServingState("3")) != config_hash(rebatched, ServingState("3"))


def test_the_pods_stage_their_versions_instead_of_fetching_one():
    rm = _model()
    deployment, _ = _stable(rm, ServingState("3", staged_versions=("4",)))
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["stage-versions"]
    assert [c["name"] for c in pod["containers"]] == ["triton", "warm", "stage"]
    init, sidecar = _container(deployment, "stage-versions"), _container(deployment, "stage")
    assert init["command"][:3] == ["rankops", "stage-versions", "--once"]
    assert "--once" not in sidecar["command"]
    for stage in (init, sidecar):
        assert _arg(stage["command"], "--versions-file") == f"{serving.VERSIONS_DIR}/versions.json"
        assert _arg(stage["command"], "--model-dir") == "/models/ctr-switch"
        assert _arg(stage["command"], "--expect") == "model.onnx"
        assert stage["envFrom"] == [{"secretRef": {"name": "s3-reader"}}]
        assert stage["image"] == rm.spec.fetcher_image
        assert stage["securityContext"]["readOnlyRootFilesystem"] and \
            stage["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        # A directory mount, never subPath: the kubelet brings the ConfigMap's changes into the running pod.
        config = next(m for m in stage["volumeMounts"] if m["name"] == "config")
        assert config == {"name": "config", "mountPath": serving.VERSIONS_DIR, "readOnly": True}
        assert {m["name"] for m in stage["volumeMounts"]} == {"model-repository", "config", "fetch-tmp"}
    assert init["resources"] == serving.fetcher_resources(rm.spec.storage.model_volume_size)
    assert sidecar["resources"]["requests"]["cpu"] == "100m" and "cpu" not in sidecar["resources"]["limits"]
    assert not any(v["name"] == "artifact" for v in pod["volumes"])


def test_the_stage_commands_take_the_same_fetch_limits_and_the_real_cli_accepts_them():
    rm = _model(fetch={"deadlineSeconds": 900, "stallSeconds": 30, "firstByteSeconds": 10})
    deployment, _ = _stable(rm, ServingState("3", staged_versions=("4",)))
    parser = build_parser()
    for name, once in (("stage-versions", True), ("stage", False)):
        command = _container(deployment, name)["command"]
        assert command[0] == "rankops"
        args = parser.parse_args(command[1:])
        assert (args.command, args.once, args.model, args.expect) == ("stage-versions", once, "ctr-switch",
                                                                       "model.onnx")
        assert (args.deadline_s, args.stall_s, args.first_byte_s) == (900, 30, 10)
        assert args.max_bytes == 10 * 2 ** 30   # the model volume's size, as fetch-model gets it
        assert command[command.index("--max-bytes"):] == ["--max-bytes", str(10 * 2 ** 30), *rm.spec.fetch.args()]


def test_in_place_pods_are_guaranteed_with_latency_isolation():
    rm = _model(latencyIsolation=True, resources={"cpu": "4", "memory": "8Gi"})
    deployment, _ = _stable(rm, ServingState("3", staged_versions=("4",)))
    pod = deployment["spec"]["template"]["spec"]
    assert qos_class(pod) == "Guaranteed"
    sidecar = _container(deployment, "stage")["resources"]
    assert sidecar["requests"] == sidecar["limits"] == {"cpu": "100m", "memory": "512Mi", "ephemeral-storage": "256Mi"}
    init = _container(deployment, "stage-versions")["resources"]
    assert init["requests"] == init["limits"] and float(init["limits"]["cpu"]).is_integer()
    # The template stays version-free with isolation too.
    assert dump_all([deployment["spec"]]) == dump_all([_stable(rm, ServingState("4", started_for="3"))[0]["spec"]])


def test_strategy_pods_renders_as_before_and_ignores_staged_versions():
    pods = _model(rollout={"strategy": "pods"})
    assert _objects(pods, ServingState("3", staged_versions=("4",))) == _objects(pods, ServingState("3"))
    deployment, config_map = _stable(pods, ServingState("3"))
    assert set(config_map["data"]) == {"config.pbtxt"}
    assert deployment["spec"]["template"]["metadata"]["labels"][names.LABEL_VERSION] == "3"
    assert names.LABEL_VERSION not in deployment["metadata"]["labels"]
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["initContainers"]] == ["fetch-model"]


def test_the_canary_track_is_its_own_pods_whatever_the_strategy():
    in_place, pods = _model(), _model(rollout={"strategy": "pods"})
    state = ServingState("3", "4", False, 1)
    canary = [_objects(rm, state) for rm in (in_place, pods)]
    for kind, name in (("Deployment", "ctr-switch-canary"), ("ConfigMap", "ctr-switch-canary-triton")):
        assert canary[0][(kind, name)] == canary[1][(kind, name)]


@pytest.mark.parametrize("staged, message", [
    (("9",), "staged version '9' is not in spec.versions"),
    (("3",), "staged version '3' is held already"),
    (("4", "4"), "staged version '4' is held already"),
])
def test_a_staged_version_one_pod_cannot_hold_is_refused_naming_it(staged, message):
    with pytest.raises(RenderError, match=message):
        _objects(_model(), ServingState("3", staged_versions=staged))


def test_a_staged_version_of_another_precision_or_directory_is_refused():
    other = _model(versions=[{"name": "3", "modelUri": "s3://m/3", "format": "onnx", "precision": "fp16"},
                             {"name": "4", "modelUri": "s3://m/4", "format": "onnx", "precision": "int8"}])
    with pytest.raises(RenderError, match="staged version '4' is onnx int8 and the serving version '3' onnx fp16"):
        _objects(other, ServingState("3", staged_versions=("4",)))
    named = _model(version="a", versions=[{"name": "a", "modelUri": "s3://m/a", "format": "onnx"},
                                          {"name": "b", "modelUri": "s3://m/b", "format": "onnx"}])
    with pytest.raises(RenderError, match=r"share a Triton version directory \(\[1, 1\]\)"):
        _objects(named, ServingState("a", staged_versions=("b",)))


def test_a_mounted_artifact_that_got_past_the_api_is_refused():
    with pytest.raises(ValueError, match="rollout.strategy inPlace: versions\\[0\\] \\(3\\) is pvc://"):
        _model(versions=[{"name": "3", "modelUri": "pvc://claim/m/3", "format": "onnx"}])
    pods = _model(rollout={"strategy": "pods"},
                  versions=[{"name": "3", "modelUri": "pvc://claim/m/3", "format": "onnx"}])
    rollout = pods.spec.rollout.model_copy(update={"strategy": RolloutStrategy.in_place})
    unchecked = pods.model_copy(update={"spec": pods.spec.model_copy(update={"rollout": rollout})})
    with pytest.raises(RenderError, match=r"spec.versions\[0\].modelUri: .* pvc:// is mounted, not fetched"):
        _objects(unchecked, ServingState("3"))
