"""The command line as a platform engineer meets it: --version, help on every flag, -o yaml|json
wherever a command prints an object or a report, and progress that only a terminal sees."""
from __future__ import annotations

import argparse
import io
import json
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from rankops.cli import build_parser, main
from rankops.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml"
PLANNED = ROOT / "manifests" / "examples" / "rankingmodel-planned-rollout.yaml"  # has a latency profile
POOL = ROOT / "manifests" / "examples" / "gpunodepool-t4.yaml"


def _flags(parser: argparse.ArgumentParser, path: str):
    """(command path, action) for every option of every (sub-)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, f"{path} {name}")
        elif action.option_strings:
            yield path, action


def test_every_flag_of_every_subcommand_has_help():
    found = list(_flags(build_parser(), "rankops"))
    assert len({path for path, _ in found}) > 10  # the walk reached the sub-commands
    missing = [f"{path} {'/'.join(a.option_strings)}" for path, a in found
               if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, f"flags without help: {missing}"


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"rankops {version('rankops')}"


def test_render_prints_yaml_or_a_json_list(capsys):
    assert main(["render", "-f", str(POOL), "-f", str(MODEL)]) == 0
    as_yaml = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert main(["render", "-f", str(POOL), "-f", str(MODEL), "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["kind"] == "List" and as_json["items"] == as_yaml
    assert {"Deployment", "DaemonSet"} <= {o["kind"] for o in as_json["items"]}


def test_render_prints_the_gate_jobs_only_when_asked(capsys):
    """A model as new runs no gate: its Jobs come with --gate-jobs, after the objects the plan applies."""
    assert main(["render", "-f", str(POOL), "-f", str(MODEL), "--image-pull-secret", "regcred"]) == 0
    plain = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert "Job" not in {o["kind"] for o in plain}
    assert main(["render", "-f", str(POOL), "-f", str(MODEL), "--image-pull-secret", "regcred", "--gate-jobs"]) == 0
    with_jobs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert with_jobs[:len(plain)] == plain
    jobs = with_jobs[len(plain):]
    assert [j["metadata"]["labels"]["rankops.io/gate"] for j in jobs] == ["warmup", "equivalence"]
    assert all(j["kind"] == "Job" and j["metadata"]["name"].startswith("ctr-ranker-") for j in jobs)
    assert all(j["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}] for j in jobs)


def test_crds_print_as_json_too(capsys):
    assert main(["crds"]) == 0
    as_yaml = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert main(["crds", "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert items == as_yaml
    assert sum(o["kind"] == "CustomResourceDefinition" for o in items) == 3


def test_plan_prints_its_report_as_json_or_yaml(capsys):
    code = main(["plan", "-f", str(PLANNED), "-o", "json"])
    as_json = json.loads(capsys.readouterr().out)
    assert main(["plan", "-f", str(PLANNED), "-o", "yaml"]) == code
    assert yaml.safe_load(capsys.readouterr().out) == as_json
    assert as_json["maxBatchSize"] >= 1


def test_validate_node_prints_its_report_as_json_or_yaml(capsys):
    """The host checks of this very machine (not a RHEL GPU node: some fail), in both formats."""
    args = ["validate-node", "--no-nvml", "--pool-name", "t4"]
    code = main([*args, "-o", "json"])
    as_json = json.loads(capsys.readouterr().out)
    assert main([*args, "-o", "yaml"]) == code
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    as_json.pop("generatedAt"), as_yaml.pop("generatedAt")
    assert as_yaml == as_json and as_json["checks"]


@pytest.mark.parametrize("argv", [["render", "-f", str(MODEL)], ["crds"], ["plan", "-f", str(MODEL)],
                                  ["validate-node"]])
def test_unknown_output_formats_are_refused_naming_the_formats(capsys, argv):
    with pytest.raises(SystemExit) as done:
        main([*argv, "-o", "xml"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'xml'" in err and "json" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_goes_to_a_terminal_only():
    tty, pipe = _Terminal(), io.StringIO()
    Progress("warmup", tty).step("replaying 10 warm requests")
    Progress("warmup", pipe).step("replaying 10 warm requests")
    assert "warmup: replaying 10 warm requests" in tty.getvalue()
    assert pipe.getvalue() == ""


def test_dev_demo_says_what_it_waits_for_on_a_terminal(monkeypatch):
    import sys
    from types import SimpleNamespace

    from rankops_dev.commands import dev

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    demo = dev._Demo(SimpleNamespace(kubeconfig="/nonexistent"), timeout=5)
    monkeypatch.setattr(demo, "kubectl", lambda *a, **k: "")
    states = iter([({"status": {"nodes": 0}}, None), ({"status": {"nodes": 3}}, None)])
    monkeypatch.setattr(dev.time, "sleep", lambda s: None)
    demo.wait("the operator sees the pool's nodes", lambda: next(states),
              lambda pool, _: pool["status"]["nodes"] > 0)
    assert "rankops dev demo: waiting until the operator sees the pool's nodes (at most 5s)" in terminal.getvalue()


SHARED = """
apiVersion: rankops.io/v1alpha1
kind: SharedServer
metadata: {name: ranking, namespace: reco}
spec: {gpuMemoryMiB: 15360, modelCredentialsSecret: model-store, resources: {cpu: "4", memory: 16Gi}}
"""
MEMBER = """
apiVersion: rankops.io/v1alpha1
kind: RankingModel
metadata: {name: NAME, namespace: reco}
spec:
  server: ranking
  replicas: 2
  gpusPerReplica: GPUS
  version: "1"
  versions: [{name: "1", modelUri: "s3://models/NAME/1", format: onnx}]
  inputs: [{name: x, dataType: FP32, dims: [16]}]
  outputs: [{name: scores, dataType: FP32, dims: [1]}]
  batching: {maxBatchSize: 64}
  warmReplicas: {enabled: false}
  slo: {p99LatencyMs: 25, targetQps: 100}
  planning: {memory: {weightsMiB: 500, activationMiBPerItem: 1, runtimeReserveMiB: 1024}, latencyProfile: {1: 1.0, 64: 4.0}}
"""


def test_render_prints_a_shared_server_s_objects_with_its_members_and_says_a_refused_one(tmp_path, capsys):
    path = tmp_path / "shared.yaml"
    path.write_text("---".join([SHARED, MEMBER.replace("NAME", "coarse").replace("GPUS", "1"),
                                MEMBER.replace("NAME", "fine").replace("GPUS", "1")]))
    assert main(["render", "-f", str(path)]) == 0
    objects = [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert ("Deployment", "ranking-shared") in objects and ("Service", "coarse") in objects
    assert ("EndpointSlice", "fine-shared") in objects
    assert not any(kind == "Deployment" and name != "ranking-shared" for kind, name in objects), "members run no pods"
    path.write_text("---".join([SHARED, MEMBER.replace("NAME", "wide").replace("GPUS", "2")]))
    assert main(["render", "-f", str(path)]) != 0
    assert "member wide: NotShareable" in capsys.readouterr().err
