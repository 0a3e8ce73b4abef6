"""The warm container of every Triton pod: rendered from the spec, runnable by `rankops warm`."""
from __future__ import annotations

import pathlib

import pytest
import yaml

from rankops.api.rankingmodel import RankingModel
from rankops.cli import build_parser
from rankops.render import gate_requests
from rankops.render.desired import ServingState, desired_objects, resolve_shape
from rankops.rollout import jobs

HERE = pathlib.Path(__file__).parent
EXAMPLE = HERE.parents[1] / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml"


def _doc(**spec) -> dict:
    doc = yaml.safe_load((HERE / "cases" / "onnx-fp16-pooled.yaml").read_text())
    doc["spec"].update(spec)
    return doc


def _pods(doc: dict, state: ServingState | None = None) -> dict[str, dict]:
    rm = RankingModel.model_validate(doc)
    state = state or ServingState(rm.spec.version, rm.spec.version, False, 1)
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"]
            for o in desired_objects(rm, state, resolve_shape(rm.spec)) if o["kind"] == "Deployment"}


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_every_track_warms_its_own_triton_before_it_is_ready():
    doc = _doc()
    rm = RankingModel.model_validate(doc)
    pods = _pods(doc)
    assert set(pods) == {"ctr-ranker-stable", "ctr-ranker-canary"}
    for pod in pods.values():
        triton, warm = pod["containers"]
        assert triton["name"] == "triton" and warm["name"] == "warm"
        assert warm["image"] == rm.spec.fetcher_image  # the rankops image every pod already pulls
        command = warm["command"]
        assert command[:2] == ["rankops", "warm"] and _arg(command, "--model") == "ctr-ranker"
        # Triton on the pod's own address (its HTTP and metrics ports), from the downward API.
        assert _arg(command, "--host") == "$(POD_IP)"
        assert warm["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        assert (_arg(command, "--http-port"), _arg(command, "--metrics-port")) == ("8000", "8002")
        assert _arg(command, "--max-p99-ms") == str(rm.spec.rollout.warmup.max_p99_ms)
        # The pod is Ready when both are: Triton's probe is unchanged, the warm one is added.
        assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
        assert warm["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "warm"}
        assert {"name": "warm", "containerPort": int(_arg(command, "--port"))} in warm["ports"]
        # requests == limits in every container: the pod keeps Guaranteed QoS (Triton's pinned CPUs).
        for container in pod["containers"]:
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert {k: requests[k] for k in ("cpu", "memory")} == {k: limits[k] for k in ("cpu", "memory")}
        assert warm["securityContext"]["runAsNonRoot"] and warm["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_warm_command_is_what_rankops_warm_accepts_and_sends_the_gates_shapes():
    doc = yaml.safe_load(EXAMPLE.read_text())
    rm = RankingModel.model_validate(doc)
    warm = _pods(doc)["ctr-ranker-stable"]["containers"][1]
    args = build_parser().parse_args(warm["command"][1:])
    assert args.func.__module__ == "rankops.commands.warm"
    assert (args.requests, args.concurrency, args.deadline_s) == (200, 2, 300.0)
    # The same generated requests as the warmup gate's Job: the shapes production sends.
    gate, *_ = jobs.gate_command(rm, "warmup", rm.spec.version, False)
    for flag in ("--generate-samples", "--inputs-spec", "--batch-sizes"):
        assert _arg(warm["command"], flag) == _arg(gate, flag), flag
    assert _arg(warm["command"], "--batch-sizes") == ",".join(map(str, gate_requests.batch_sizes(rm.spec)))


def test_its_settings_come_from_spec_warm_replicas():
    pods = _pods(_doc(warmReplicas={"requests": 50, "concurrency": 4, "maxP99Ms": 40, "deadlineSeconds": 60},
                      responseCache=True))
    command = pods["ctr-ranker-stable"]["containers"][1]["command"]
    assert [_arg(command, f) for f in ("--requests", "--concurrency", "--max-p99-ms", "--deadline-s")] == \
        ["50", "4", "40.0", "60"]
    assert "--unique-requests" in command  # the model is warmed, not the response cache


def test_recorded_samples_are_mounted_optionally_with_generation_to_fall_back_on():
    doc = _doc(rollout={"warmup": {"samples": {"configMap": "recorded", "key": "requests.jsonl"}}})
    pod = _pods(doc)["ctr-ranker-stable"]
    warm = pod["containers"][1]
    assert _arg(warm["command"], "--samples") == "/samples/requests.jsonl" and "--generate-samples" in warm["command"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "samples"]
    # A deleted ConfigMap must not keep the pod from starting: warm sends the generated requests.
    assert volume["configMap"] == {"name": "recorded", "optional": True}
    assert {"name": "samples", "mountPath": "/samples", "readOnly": True} in warm["volumeMounts"]
    assert all(m["name"] != "samples" for m in pod["containers"][0]["volumeMounts"])


def test_it_can_be_turned_off():
    for pod in _pods(_doc(warmReplicas={"enabled": False})).values():
        assert [c["name"] for c in pod["containers"]] == ["triton"]
        assert all(v["name"] != "samples" for v in pod["volumes"])


@pytest.mark.parametrize("field,value", [("requests", 0), ("concurrency", 65), ("maxP99Ms", 0),
                                         ("deadlineSeconds", 5), ("enabled", "sometimes")])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field[:6].lower() if field != "maxP99Ms" else "max_p99_ms|maxP99Ms"):
        RankingModel.model_validate(_doc(warmReplicas={field: value}))



def test_its_memory_grows_with_the_requests_it_holds():
    small = _pods(_doc())["ctr-ranker-stable"]["containers"][1]["resources"]["limits"]["memory"]
    wide = _doc()
    wide["spec"]["inputs"][0]["dims"] = [200_000]
    big = _pods(wide)["ctr-ranker-stable"]["containers"][1]["resources"]["limits"]["memory"]
    assert int(small.removesuffix("Mi")) < 256 < int(big.removesuffix("Mi")) <= 4096, (small, big)
