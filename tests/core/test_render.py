"""Rendering: golden files per sample, Triton's own ModelConfig parses every config.pbtxt,
and the serving objects carry what Kubernetes and Triton need."""
from __future__ import annotations

import itertools
import os
import pathlib

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from rankops.api.rankingmodel import RankingModel
from rankops.commands.render import InputError, load_documents, render_documents
from rankops.render.desired import ServingState, desired_objects, resolve_shape
from rankops.render.tritonconfig import ServingShape, render_config_pbtxt
from rankops.yamlio import dump_all

HERE = pathlib.Path(__file__).parent
CASES = sorted(p for p in (HERE / "cases").glob("*.yaml") if p.name != "pools.yaml")
UPDATE = os.environ.get("RANKOPS_UPDATE_GOLDEN") == "1"


def parse_config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def base_doc(**spec_overrides) -> dict:
    doc = yaml.safe_load((HERE / "cases" / "onnx-fp16-pooled.yaml").read_text())
    doc["spec"].update(spec_overrides)
    return doc


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden(case):
    """`rankops render` output for each sample is exactly the checked-in golden file."""
    objects = render_documents(load_documents([str(case), str(HERE / "cases" / "pools.yaml")]))
    text = dump_all(objects)
    golden = HERE / "golden" / f"{case.stem}.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"no golden file; run with RANKOPS_UPDATE_GOLDEN=1 to create {golden}"
    assert text == golden.read_text(), f"render of {case.name} drifted from {golden.name}"


@pytest.mark.parametrize("fmt,precision", list(itertools.product(
    ["onnx", "tensorrt_plan", "torchscript"], ["fp32", "fp16", "int8"])))
def test_every_format_and_precision_parses_with_triton_modelconfig(fmt, precision):
    doc = base_doc(versions=[{"name": "3", "modelUri": "s3://m/3", "format": fmt, "precision": precision}])
    rm = RankingModel.model_validate(doc)
    shape = ServingShape.explicit(rm.spec.batching, 2)
    config = parse_config(render_config_pbtxt("ctr-ranker", "reco", rm.spec, rm.spec.versions[0], shape))
    assert config.name == "ctr-ranker"
    assert config.platform == {"onnx": "onnxruntime_onnx", "tensorrt_plan": "tensorrt_plan",
                               "torchscript": "pytorch_libtorch"}[fmt]
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert config.instance_group[0].count == 2
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert [i.name for i in config.input] == ["user_features", "item_features"]
    assert list(config.input[1].dims) == [-1, 32]
    assert config.input[0].data_type == mc.TYPE_FP32
    assert list(config.version_policy.specific.versions) == [3]
    # Warmup sizes beyond maxBatchSize are dropped; variable dims warm at their maximum.
    assert [w.batch_size for w in config.model_warmup] == [1, 8, 16]
    assert list(config.model_warmup[0].inputs["item_features"].dims) == [500, 32]
    assert config.model_warmup[0].inputs["item_features"].random_data
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    if fmt == "onnx" and precision != "fp32":
        assert accelerators[0].name == "tensorrt"
        assert accelerators[0].parameters["precision_mode"] == precision.upper()
    else:
        assert len(accelerators) == 0


def test_max_batch_one_gets_a_batcher_of_ones_for_its_priority_levels():
    # Without dynamic_batching Triton has no priority levels: a gate's replay would compete with
    # live traffic for the instance.
    doc = base_doc(batching={"maxBatchSize": 1, "maxQueueDelayMicroseconds": 500}, modelWarmup={"batchSizes": [1]})
    rm = RankingModel.model_validate(doc)
    config = parse_config(render_config_pbtxt("m", "ns", rm.spec, rm.spec.versions[0],
                                              ServingShape.explicit(rm.spec.batching, 1)))
    assert config.max_batch_size == 1
    assert config.dynamic_batching.priority_levels == 2 and config.dynamic_batching.default_priority_level == 1
    assert config.dynamic_batching.max_queue_delay_microseconds == 0   # nothing can join a batch of one


def test_response_cache_and_string_inputs():
    doc = base_doc(responseCache=True, inputs=[{"name": "query", "dataType": "STRING", "dims": [1]}])
    rm = RankingModel.model_validate(doc)
    config = parse_config(render_config_pbtxt("m", "ns", rm.spec, rm.spec.versions[0],
                                              ServingShape.explicit(rm.spec.batching, 1)))
    assert config.response_cache.enable
    assert config.model_warmup[0].inputs["query"].zero_data


def _by_kind(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_serving_objects_for_a_pooled_model():
    rm = RankingModel.model_validate({**base_doc(), "metadata": {"name": "ctr-ranker", "namespace": "reco",
                                                                  "uid": "u-1"}})
    objects = _by_kind(desired_objects(rm, ServingState("3"), resolve_shape(rm.spec)))
    dep = objects[("Deployment", "ctr-ranker-stable")]
    pod = dep["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {p["containerPort"] for p in triton["ports"]} == {8000, 8001, 8002}
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # ONNX + FP16 builds TensorRT engines at load: the startup probe allows 30 minutes.
    assert triton["startupProbe"]["failureThreshold"] * triton["startupProbe"]["periodSeconds"] == 1800
    assert pod["nodeSelector"] == {"rankops.io/pool": "t4-pool", "rankops.io/gpu-ready": "true"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["initContainers"][0]["command"][:2] == ["rankops", "fetch-model"]
    assert "--load-model=ctr-ranker" in triton["args"]
    for obj in objects.values():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["namespace"] == "reco"
    serving = objects[("Service", "ctr-ranker")]
    assert serving["spec"]["selector"] == {"rankops.io/model": "ctr-ranker", "rankops.io/traffic": "on"}
    assert dep["spec"]["template"]["metadata"]["labels"]["rankops.io/traffic"] == "on"


def test_canary_track_starts_out_of_traffic():
    rm = RankingModel.model_validate(base_doc(version="4", versions=[
        {"name": "3", "modelUri": "s3://m/3", "format": "onnx"},
        {"name": "4", "modelUri": "s3://m/4", "format": "onnx"}]))
    objects = _by_kind(desired_objects(rm, ServingState("3", "4", False, 1), resolve_shape(rm.spec)))
    canary = objects[("Deployment", "ctr-ranker-canary")]
    stable = objects[("Deployment", "ctr-ranker-stable")]
    assert canary["spec"]["template"]["metadata"]["labels"]["rankops.io/traffic"] == "off"
    assert canary["spec"]["template"]["metadata"]["labels"]["rankops.io/version"] == "4"
    assert stable["spec"]["template"]["metadata"]["labels"]["rankops.io/version"] == "3"
    assert canary["spec"]["replicas"] == 1
    assert ("Service", "ctr-ranker-canary") in objects


def test_config_change_rolls_pods_through_the_hash():
    rm1 = RankingModel.model_validate(base_doc())
    rm2 = RankingModel.model_validate(base_doc(batching={"maxBatchSize": 32, "preferredBatchSizes": [8, 16]}))
    h = [_by_kind(desired_objects(rm, ServingState("3"), resolve_shape(rm.spec)))[("Deployment", "ctr-ranker-stable")]
         ["spec"]["template"]["metadata"]["annotations"]["rankops.io/config-hash"] for rm in (rm1, rm2)]
    assert h[0] != h[1]


def test_a_versions_sha256_reaches_the_fetcher():
    digest = "ab" * 32
    rm = RankingModel.model_validate(base_doc(version="4", versions=[
        {"name": "3", "modelUri": "s3://m/3", "format": "onnx"},
        {"name": "4", "modelUri": "s3://m/4", "format": "onnx", "sha256": digest}]))
    objects = _by_kind(desired_objects(rm, ServingState("3", "4", False, 1), resolve_shape(rm.spec)))
    fetchers = {track: objects[("Deployment", f"ctr-ranker-{track}")]["spec"]["template"]["spec"]["initContainers"][0]
                for track in ("stable", "canary")}
    canary = fetchers["canary"]["command"]
    assert canary[canary.index("--sha256") + 1] == digest
    assert canary[canary.index("--expect") + 1] == "model.onnx"   # the file the digest covers
    assert "--sha256" not in fetchers["stable"]["command"]
    for bad in ("AB" * 32, "ab" * 31):
        with pytest.raises(ValueError, match="sha256"):
            RankingModel.model_validate(base_doc(versions=[{"name": "3", "modelUri": "s3://m/3", "format": "onnx",
                                                            "sha256": bad}]))
    with pytest.raises(ValueError, match="pvc:// artifact is mounted, not fetched"):
        RankingModel.model_validate(base_doc(versions=[{"name": "3", "modelUri": "pvc://claim/m/3", "format": "onnx",
                                                        "sha256": digest}]))


def test_first_byte_seconds_reaches_the_fetcher_only_when_set():
    def fetcher(**fetch):
        rm = RankingModel.model_validate(base_doc(**({"fetch": fetch} if fetch else {})))
        dep = _by_kind(desired_objects(rm, ServingState("3"), resolve_shape(rm.spec)))[("Deployment", "ctr-ranker-stable")]
        return dep["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert "--first-byte-s" not in fetcher()   # unset: the pods' template is what it was
    command = fetcher(firstByteSeconds=15)
    assert command[command.index("--first-byte-s") + 1] == "15"
    with pytest.raises(ValueError, match="firstByteSeconds must not exceed fetch.deadlineSeconds"):
        fetcher(firstByteSeconds=100, deadlineSeconds=60)


def test_pvc_artifacts_mount_without_copy(tmp_path):
    objects = render_documents(load_documents([str(HERE / "cases" / "torchscript-pvc.yaml")]))
    dep = _by_kind(objects)[("Deployment", "mmoe-ranker-stable")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["initContainers"] == []
    claim = next(v for v in pod["volumes"] if v["name"] == "artifact")
    assert claim["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "artifact")
    assert mount == {"name": "artifact", "mountPath": "/models/mmoe-ranker/7", "readOnly": True, "subPath": "mmoe/7"}


def test_render_reports_every_bad_field(tmp_path):
    bad = base_doc(version="9", batching={"maxBatchSize": 4, "preferredBatchSizes": [8]})
    bad["spec"]["inputs"][1].pop("maxDims")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError) as err:
        render_documents(load_documents([str(path)]))
    message = str(err.value)
    assert "spec.batching" in message and "preferredBatchSizes [8] exceed maxBatchSize 4" in message


def test_render_cli_exit_codes(tmp_path, capsys):
    from rankops.cli import main
    assert main(["render", "-f", str(HERE / "cases" / "onnx-fp16-pooled.yaml")]) == 0
    out = capsys.readouterr().out
    assert [d["kind"] for d in yaml.safe_load_all(out)] == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                                                            "Service"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RankingModel\nmetadata: {name: x}\nspec: {replicas: -1}\n")
    assert main(["render", "-f", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "spec.replicas" in err and "spec.version" in err


def test_render_refuses_a_tensorrt_plan_built_for_another_tensorrt(tmp_path):
    # Issue 16: the operator says TensorRTVersionMismatch before any pod; render refuses it too.
    doc = yaml.safe_load((HERE / "cases" / "tensorrt-int8.yaml").read_text())
    doc["spec"]["tritonImage"] = "nvcr.io/nvidia/tritonserver:24.05-py3"
    doc["spec"]["versions"][1]["tensorrtVersion"] = "8.6.1.6"
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"spec\.versions\[1\] \(v2-int8\).*TensorRT 8\.6\.1\.6.*TensorRT 10\.0\.1\.6"):
        render_documents(load_documents([str(path)]))
    doc["spec"]["versions"][1]["tensorrtVersion"] = "10.0.1.6"
    path.write_text(yaml.safe_dump(doc))
    assert render_documents(load_documents([str(path)]))


# --- slo.overload: Triton's queue policy and request priorities (issue 40) -------------------

def _config_of(doc: dict) -> mc.ModelConfig:
    rm = RankingModel.model_validate({**doc, "metadata": {"name": "m", "namespace": "ns"}})
    objects = desired_objects(rm, ServingState(rm.spec.version), resolve_shape(rm.spec))
    return parse_config(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.pbtxt"])


def _shed_doc(slo: dict | None = None, **spec) -> dict:
    return base_doc(slo={"p99LatencyMs": 10, "targetQps": 2000, "overload": "shed", **(slo or {})}, **spec)


def test_every_batching_config_has_two_priority_levels_and_the_lower_one_is_never_shed():
    config = _config_of(base_doc())
    batching = config.dynamic_batching
    assert (batching.priority_levels, batching.default_priority_level) == (2, 1), "live traffic at the highest"
    assert not batching.HasField("default_queue_policy"), "overload queue: Triton's defaults (no timeout)"
    background = batching.priority_queue_policy[2]
    assert background.timeout_action == mc.ModelQueuePolicy.DELAY
    assert (background.default_timeout_microseconds, background.max_queue_size) == (0, 0)
    assert not background.allow_timeout_override
    assert set(batching.priority_queue_policy) == {2}


def test_a_shed_policy_renders_as_tritons_default_queue_policy():
    config = _config_of(_shed_doc({"queuePolicy": {"timeoutMicroseconds": 7000, "maxQueueSize": 64}}))
    policy = config.dynamic_batching.default_queue_policy
    assert policy.timeout_action == mc.ModelQueuePolicy.REJECT
    assert (policy.default_timeout_microseconds, policy.max_queue_size, policy.allow_timeout_override) == \
        (7000, 64, True)
    assert config.dynamic_batching.priority_queue_policy[2].timeout_action == mc.ModelQueuePolicy.DELAY
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000


def test_shed_with_max_batch_one_renders_the_batcher_without_a_delay_so_the_policy_exists():
    doc = _shed_doc({"queuePolicy": {"timeoutMicroseconds": 5000, "allowTimeoutOverride": False}},
                    batching={"maxBatchSize": 1, "maxQueueDelayMicroseconds": 1000}, modelWarmup={"batchSizes": [1]})
    config = _config_of(doc)
    assert config.max_batch_size == 1 and config.HasField("dynamic_batching")
    assert config.dynamic_batching.max_queue_delay_microseconds == 0
    policy = config.dynamic_batching.default_queue_policy
    assert (policy.default_timeout_microseconds, policy.allow_timeout_override, policy.max_queue_size) == \
        (5000, False, 0), "no profile: no backstop to size, the timeout sheds"


def test_queue_with_a_given_policy_delays_rather_than_rejects():
    config = _config_of(base_doc(slo={"p99LatencyMs": 10, "targetQps": 2000,
                                      "queuePolicy": {"timeoutMicroseconds": 8000}}))
    assert config.dynamic_batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY


def test_a_shed_spec_without_timeout_or_profile_is_refused_and_leaves_serving_untouched():
    import datetime as dt

    from rankops import modelplan

    done = modelplan.as_new(_shed_doc(), now=dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc))
    assert done.not_applied == "PlanFailed" and done.applies == () and done.creates == ()
    degraded = next(c for c in done.status.conditions if c.type == "Degraded")
    assert "slo.queuePolicy.timeoutMicroseconds" in degraded.message and "planning.latencyProfile" in degraded.message


def test_a_planned_shed_policy_is_what_status_says_and_config_renders():
    doc = _shed_doc(batching="auto", candidates={"layout": "padded"},
                    inputs=[{"name": "items", "dataType": "FP32", "dims": [100, 16]}],
                    outputs=[{"name": "scores", "dataType": "FP32", "dims": [100]}], modelWarmup={"batchSizes": [1]},
                    planning={"overheadMs": 0.5, "latencyProfile": {1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}})
    rm = RankingModel.model_validate({**doc, "metadata": {"name": "m", "namespace": "ns"}})
    resolved = resolve_shape(rm.spec)
    status = resolved.plan.to_status()["queuePolicy"]
    config = parse_config(render_config_pbtxt("m", "ns", rm.spec, rm.spec.versions[0], resolved.shape))
    policy = config.dynamic_batching.default_queue_policy
    assert (policy.default_timeout_microseconds, policy.max_queue_size, policy.allow_timeout_override) == \
        (status["timeoutMicroseconds"], status["maxQueueSize"], status["allowTimeoutOverride"])
    # 10 ms - 0.5 ms overhead - compute of the planned maxBatchSize (x sharing) - 1 ms margin
    plan = resolved.plan
    compute = plan.inputs.profile.compute_ms(plan.max_batch_size) * (1 + 0.75 * (plan.instances_per_gpu - 1))
    assert status["timeoutMicroseconds"] == int((10 - 0.5 - compute - 1) * 1000 + 1e-6) > 0
    assert status["shed"] and status["explanation"][0].startswith(f"timeout {status['timeoutMicroseconds']} us = ")
