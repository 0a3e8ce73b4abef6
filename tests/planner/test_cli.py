"""`rankops plan` end to end through the real command line entry point."""
import json
from pathlib import Path

import pytest
import yaml

from rankops.cli import main

VALID_EXTRA = """
  version: "1"
  versions: [{name: "1", modelUri: "s3://models/ctr/1", format: onnx}]
  inputs: [{name: user, dataType: FP32, dims: [64]}]
  outputs: [{name: score, dataType: FP32, dims: [1]}]
"""


def _write(tmp_path, text, name="rm.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_json_output_for_the_issue_example(fixtures, capsys):
    assert main(["plan", "-f", str(fixtures / "rankingmodel.yaml"), "-o", "json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["gpus"] == 2 and data["maxBatchSize"] >= 8
    assert data["predictedP99Ms"] < 10 and data["qpsPerGpu"] > 1000
    assert "not a complete RankingModel" in out.err       # a sketch: planned from slo/planning


def test_complete_rankingmodel_plans_without_a_note(tmp_path, fixtures, capsys):
    text = (fixtures / "rankingmodel.yaml").read_text() + VALID_EXTRA
    assert main(["plan", "-f", _write(tmp_path, text), "-o", "json"]) == 0
    out = capsys.readouterr()
    assert "not a complete" not in out.err
    assert json.loads(out.out)["gpus"] == 2


def test_text_output_explains(fixtures, capsys):
    assert main(["plan", "-f", str(fixtures / "rankingmodel.yaml")]) == 0
    text = capsys.readouterr().out
    assert "max_queue_delay_microseconds" in text and "Why:" in text and "ceil(2000 req/s" in text


def test_profile_from_perf_analyzer_csv(tmp_path, fixtures, capsys):
    spec = _write(tmp_path, "kind: RankingModel\nspec:\n  slo: {p99LatencyMs: 10, targetQps: 2000}\n  batching: auto\n")
    code = main(["plan", "-f", spec, "--profile", f"{fixtures / 'perf_b1.csv'}:1",
                 "--profile", f"{fixtures / 'perf_b8.csv'}:8", "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["inputs"]["profile"] == {"1": 2.0, "8": 3.005}
    assert data["gpus"] == 2


def test_profile_from_model_analyzer_csv(tmp_path, fixtures, capsys):
    spec = _write(tmp_path, "kind: RankingModel\nspec:\n  slo: {p99LatencyMs: 10, targetQps: 2000}\n")
    assert main(["plan", "-f", spec, "--profile", str(fixtures / "metrics-model-inference-server.csv"),
                 "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["profile"]["16"] == pytest.approx(4.6)


def test_oom_exits_nonzero_with_the_arithmetic(tmp_path, capsys):
    spec = _write(tmp_path, """
kind: RankingModel
spec:
  slo: {p99LatencyMs: 10, targetQps: 2000}
  instancesPerGpu: 2
  batching: {maxBatchSize: 8, maxQueueDelayMicroseconds: 1000}
  planning:
    gpuMemoryMiB: 4096
    latencyProfile: {1: 2.0, 8: 3.0}
    memory: {weightsMiB: 1024, gpuEmbeddingsMiB: 2048}
""")
    assert main(["plan", "-f", spec]) == 1
    out = capsys.readouterr().out
    assert "6144 MiB > 4096 MiB" in out and "Problems:" in out


def test_no_config_meets_the_slo_exits_one(tmp_path, capsys):
    spec = _write(tmp_path, "spec:\n  slo: {p99LatencyMs: 1.5, targetQps: 100}\n"
                            "  planning: {latencyProfile: {1: 2.0, 8: 3.0}}\n")
    assert main(["plan", "-f", spec]) == 1
    assert "one request alone takes 2 ms" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("spec: [", "not YAML"),
    ("spec:\n  slo: {p99LatencyMs: -1, targetQps: 10}\n", "spec.slo.p99LatencyMs"),
    ("spec:\n  slo: {p99LatencyMs: 10, targetQps: 10}\n", "no latency profile"),
    ("spec:\n  slo: {p99LatencyMs: 10, targetQps: 10}\n  planning: {latencyProfile: {x: 1}}\n",
     "spec.planning.latencyProfile"),
    ("kind: Service\n", "expected a RankingModel"),
])
def test_bad_input_exits_two_with_a_message(tmp_path, capsys, text, message):
    assert main(["plan", "-f", _write(tmp_path, text)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_file(capsys):
    assert main(["plan", "-f", "/nonexistent.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path, fixtures, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert main(["plan", "-f", str(fixtures / "rankingmodel.yaml"), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_shed_prints_the_queue_policy_and_its_arithmetic(tmp_path, fixtures, capsys):
    text = (fixtures / "rankingmodel.yaml").read_text().replace(
        "slo: {p99LatencyMs: 10, targetQps: 2000}", "slo: {p99LatencyMs: 10, targetQps: 2000, overload: shed}")
    path = _write(tmp_path, text)
    assert main(["plan", "-f", path]) == 0
    out = capsys.readouterr().out
    assert "Queue policy (slo.overload shed):" in out and "timeout_action               REJECT" in out
    assert "P99 budget 10 ms - overhead 0 ms (planning.overheadMs) - compute" in out
    assert main(["plan", "-f", path, "-o", "json"]) == 0
    policy = json.loads(capsys.readouterr().out)["queuePolicy"]
    assert policy["shed"] and policy["timeoutMicroseconds"] > 0 and policy["maxQueueSize"] >= 16
    assert f"default_timeout_microseconds {policy['timeoutMicroseconds']}" in out


def test_shed_that_leaves_no_time_to_queue_is_no_plan(tmp_path, fixtures, capsys):
    text = (fixtures / "rankingmodel.yaml").read_text().replace(
        "slo: {p99LatencyMs: 10, targetQps: 2000}", "slo: {p99LatencyMs: 10, targetQps: 2000, overload: shed}").replace(
        "headroom: 0.5", "headroom: 0.5\n    overheadMs: 4.5")
    assert main(["plan", "-f", _write(tmp_path, text)]) == 1
    err = capsys.readouterr().err
    assert "no plan: slo.overload shed: the P99 budget leaves no time to queue" in err and "overhead 4.5 ms" in err


def test_a_slowdown_plans_with_slower_compute_and_says_what_it_changed(fixtures, capsys):
    assert main(["plan", "-f", str(fixtures / "rankingmodel.yaml"), "-o", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    main(["plan", "-f", str(fixtures / "rankingmodel.yaml"), "--slowdown", "1.3", "-o", "json"])
    slow = json.loads(capsys.readouterr().out)
    assert slow["qpsPerGpu"] < plain["qpsPerGpu"] and slow["gpus"] >= plain["gpus"]
    assert slow["explanation"][0].startswith("corrected for a slowdown of 1.3 (compute x 1.3): capacity")


def test_from_status_takes_the_applied_factor_back_not_the_last_raw_slowdown(tmp_path, fixtures, capsys):
    recorded = _write(tmp_path, "kind: RankingModel\nstatus:\n  autoscaling:\n    capacityCorrection:\n"
                                "      factor: 0.8\n      slowdown: 1.65\n      readings: 4\n      raiseStreak: 1\n",
                                "status.yaml")
    main(["plan", "-f", str(fixtures / "rankingmodel.yaml"), "--from-status", recorded])
    captured = capsys.readouterr()
    assert "corrected for a slowdown of 1.25" in captured.out, "K = 1 / factor, what the autoscaler applies"
    assert "1 reading(s) in a row say raise" in captured.err
    bare = _write(tmp_path, '{"kind": "RankingModel", "status": {}}', "bare.json")
    assert main(["plan", "-f", str(fixtures / "rankingmodel.yaml"), "--from-status", bare]) == 2
    assert "no status.autoscaling.capacityCorrection with readings" in capsys.readouterr().err


def test_from_status_reads_a_pipe_and_a_kubectl_list(tmp_path, fixtures, capsys):
    """`--from-status <(kubectl get rm x -o yaml)` is a pipe, read once; `kubectl get rm -o yaml` is a List."""
    import os
    import threading

    model = yaml.safe_load((fixtures / "rankingmodel.yaml").read_text())
    model["status"] = {"autoscaling": {"capacityCorrection": {"factor": 0.5, "readings": 2}}}
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [model]})
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, text.encode()), os.close(write)))
    writer.start()
    try:
        assert main(["plan", "--from-status", f"/dev/fd/{read}"]) == 0
    finally:
        writer.join()
        os.close(read)
    assert "corrected for a slowdown of 2" in capsys.readouterr().out


def _model_doc(name, qps, weights=512):
    return f"""kind: RankingModel
metadata: {{name: {name}}}
spec:
  slo: {{p99LatencyMs: 10, targetQps: {qps}}}
  planning:
    gpuMemoryMiB: 15360
    latencyProfile: {{1: 2.0, 4: 2.3, 8: 3.0, 16: 4.6}}
    memory: {{weightsMiB: {weights}, activationMiBPerItem: 8, runtimeReserveMiB: 1024}}
"""


def test_several_models_are_packed(tmp_path, capsys):
    files = [_write(tmp_path, _model_doc(n, q), f"{n}.yaml") for n, q in (("coarse", 300), ("fine", 400), ("rerank", 200))]
    assert main(["plan", *(a for f in files for a in ("-f", f)), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] < data["gpusOnePerCard"]
    assert sorted(m["name"] for s in data["servers"] for m in s["models"]) == ["coarse", "fine", "rerank"]
    # one multi-document file is the same pack
    both = _write(tmp_path, "---\n".join(_model_doc(n, q) for n, q in (("coarse", 300), ("fine", 400), ("rerank", 200))))
    assert main(["plan", "-f", both, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == data


def test_several_models_text_and_plot(tmp_path, capsys):
    both = _write(tmp_path, _model_doc("coarse", 300) + "---\n" + _model_doc("fine", 400))
    png = tmp_path / "pack.png"
    assert main(["plan", "-f", both, "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "Server 1:" in text and "P99 shared" in text and "runtime reserve" in text and "one model per card" in text
    assert png.stat().st_size > 1000


def test_a_pack_that_cannot_hold_exits_one_naming_the_model(tmp_path, capsys):
    both = _write(tmp_path, _model_doc("coarse", 300, weights=9000) + "---\n" + _model_doc("fine", 300, weights=8000))
    assert main(["plan", "-f", both, "--max-cards", "2"]) == 1
    err = capsys.readouterr().err
    assert "no pack: fine does not fit in 2 GPU(s)" in err and "MiB short" in err


def test_several_models_refuse_one_model_flags_and_mixed_cards(tmp_path, capsys):
    both = _write(tmp_path, _model_doc("coarse", 300) + "---\n" + _model_doc("fine", 400))
    assert main(["plan", "-f", both, "--slowdown", "1.2"]) == 2
    assert "for one model" in capsys.readouterr().err
    other = _write(tmp_path, _model_doc("rerank", 200).replace("15360", "24576"), "a10.yaml")
    assert main(["plan", "-f", both, "-f", other]) == 2
    assert "give --gpu-memory-mib" in capsys.readouterr().err


def test_one_server_admits_in_the_order_given_and_says_who_waits(tmp_path, capsys):
    docs = [_model_doc("coarse", 300, weights=7000), _model_doc("fine", 300, weights=7000), _model_doc("rerank", 200)]
    files = [_write(tmp_path, d, f"m{i}.yaml") for i, d in enumerate(docs)]
    assert main(["plan", "--one-server", *(a for f in files for a in ("-f", f))]) == 1
    text = capsys.readouterr().out
    assert "2 member(s) admitted" in text and "coarse, rerank" in text and "P99 burst" in text
    assert "waits: fine: fine does not fit on one GPU beside coarse:" in text and "MiB short" in text
    assert main(["plan", "--one-server", "-o", "json", "-f", files[0], "-f", files[2]]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["admitted"] == ["coarse", "rerank"] and not data["waiting"]
    assert {m["name"] for m in data["server"]["models"]} == {"coarse", "rerank"}


def test_a_shared_server_in_the_files_admits_its_members_on_its_own_cards(capsys):
    """The example server: its gpuMemoryMiB and maxReplicas are the card and the most cards, as the
    operator admits (serverplan); a flag overrides one of them."""
    example = str(Path(__file__).resolve().parents[2] / "manifests" / "examples" / "sharedserver-ranking.yaml")
    assert main(["plan", "-f", example]) == 0
    text = capsys.readouterr().out
    assert "SharedServer ranking: 3 member(s) admitted on 3 card(s): coarse, fine, rerank" in text
    assert "of 15360 MiB per GPU: fits" in text and "3 shared vs" in text
    assert main(["plan", "-f", example, "--max-cards", "2"]) == 1
    assert "waits: rerank: rerank does not hold beside coarse, fine on 2 GPU(s)" in capsys.readouterr().out


def test_a_member_the_operator_would_refuse_is_refused_by_plan_too(tmp_path, capsys):
    example = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "sharedserver-ranking.yaml"
    docs = list(yaml.safe_load_all(example.read_text()))
    docs[1]["spec"]["warmReplicas"] = {"enabled": True}
    changed = tmp_path / "server.yaml"
    changed.write_text(yaml.safe_dump_all(docs))
    assert main(["plan", "-f", str(changed)]) == 1
    text = capsys.readouterr().out
    assert "2 member(s) admitted on" in text and "refused: coarse: coarse: spec.warmReplicas.enabled is true" in text


def test_burst_proof_is_a_flag_of_the_pack(tmp_path, capsys):
    both = _write(tmp_path, _model_doc("coarse", 300) + "---\n" + _model_doc("fine", 400))
    assert main(["plan", "-f", both, "-o", "json", "--burst-proof"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(m["p99BurstMs"] <= m["p99BudgetMs"] for s in data["servers"] for m in s["models"])
