"""benchmarks/overload_bench.py's config splicing and policy arithmetic (pure; the bench itself runs Triton)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rankops.api.rankingmodel import RankingModelSpec
from rankops.render.tritonconfig import ServingShape, render_config_pbtxt

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "overload_bench.py"
_SPEC = importlib.util.spec_from_file_location("overload_bench", _PATH)
bench = sys.modules.setdefault("overload_bench", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(bench)


def _rendered(preferred: tuple[int, ...] = (4, 8)) -> str:
    spec = RankingModelSpec.model_validate(bench.spec_for(150.0, 100.0, "queue"))
    return render_config_pbtxt(bench.MODEL, "bench", spec, spec.versions[0], ServingShape(8, preferred, 500, 2))


def _parsed(block: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(block, model_config_pb2.ModelConfig())


def test_the_renderers_shed_policy_is_what_the_bench_runs_by_default():
    block = bench.render(bench.spec_for(150.0, 1.0, "shed")).block
    assert bench.has_queue_policy(block)
    assert not bench.has_queue_policy(bench.render(bench.spec_for(150.0, 1.0, "queue")).block)
    policy = _parsed(bench.checked_block(block)).dynamic_batching.default_queue_policy
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    assert 0 < policy.default_timeout_microseconds < 150_000


def test_an_approximated_policy_replaces_the_rendered_one_and_keeps_the_plan():
    block = bench.dynamic_batching_block(_rendered())
    assert block.startswith("dynamic_batching {") and block.endswith("}")
    fields, arithmetic = bench.approx_policy(150.0, 60.0, 2, 0.5)
    assert "= 45 ms" in arithmetic        # 150 - 60 x 1.5 - 0 - 15
    config = _parsed(bench.checked_block(bench.add_fields(bench.without_policy(block), fields)))
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8] and batching.max_queue_delay_microseconds == 500
    policy = batching.default_queue_policy
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    assert policy.default_timeout_microseconds == 45_000 and policy.allow_timeout_override
    assert policy.max_queue_size == bench.APPROX_MAX_QUEUE
    assert (batching.priority_levels, batching.default_priority_level) == (2, 1)


def test_a_hand_written_block_replaces_a_rendered_policy():
    """Once the renderer emits a policy, --policy-block replaces it rather than adding a second one."""
    rendered = bench.add_fields(bench.dynamic_batching_block(_rendered(())),
                                "priority_levels: 2 default_priority_level: 1 default_queue_policy { "
                                "timeout_action: REJECT default_timeout_microseconds: 9000 max_queue_size: 7 }")
    assert bench.has_queue_policy(rendered)
    stripped = bench.without_policy(rendered)
    assert not bench.has_queue_policy(stripped) and "priority" not in stripped
    replaced = _parsed(bench.add_fields(stripped, "default_queue_policy { default_timeout_microseconds: 1000 }"))
    assert replaced.dynamic_batching.default_queue_policy.default_timeout_microseconds == 1000
    assert replaced.dynamic_batching.max_queue_delay_microseconds == 500


def test_a_budget_without_room_to_queue_is_refused_with_the_arithmetic():
    with pytest.raises(SystemExit, match=r"budget 80 - compute 60 ms x \(1 \+ 0.5 x 1\) .* = -18 ms"):
        bench.approx_policy(80.0, 60.0, 2, 0.5)


def test_a_block_triton_cannot_parse_is_refused_before_the_server_starts():
    with pytest.raises(SystemExit, match="does not parse"):
        bench.checked_block("dynamic_batching { default_queue_policy { timeout_action: DROP } }")
