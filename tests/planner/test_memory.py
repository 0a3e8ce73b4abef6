import pytest

from rankops.planner import BatcherConfig, MemoryNeeds, PlanError, evaluate, plan
from rankops.planner.memory import max_instances, oom_problem

# the seeds: a model needing 3 GB per instance, 4 GB free, instance_group count: 2
SEEDS_3GB = MemoryNeeds(weights_mib=1024, gpu_embeddings_mib=2048)


def test_seeds_count_two_with_three_gb_each_in_four_gb_is_refused_with_the_arithmetic():
    problem = oom_problem(SEEDS_3GB, 4096, max_batch_size=8, instances=2)
    assert problem is not None
    assert "2 instance(s) x (weights 1024 + GPU embeddings 2048" in problem
    assert "= 6144 MiB > 4096 MiB" in problem
    assert "2048 MiB short" in problem
    assert "at most 1 instance(s) fit" in problem


def test_seeds_sixteen_gb_card_fits_weights_embeddings_and_batch_32_activations():
    needs = MemoryNeeds(weights_mib=1024, gpu_embeddings_mib=2048, activation_mib_per_item=16,
                        runtime_reserve_mib=1024)
    assert needs.per_gpu_mib(32, 1) == 1024 + 2048 + 512 + 1024
    assert oom_problem(needs, 16 * 1024, 32, 1) is None
    assert max_instances(needs, 16 * 1024, 32) == 4      # (16384 - 1024) // 3584


def test_unknown_gpu_size_checks_nothing():
    assert oom_problem(SEEDS_3GB, None, 8, 16) is None


def test_explicit_oom_config_is_a_problem_not_an_exception(make_inputs):
    inputs = make_inputs(batching=BatcherConfig(8, (), 1000, 2), memory=SEEDS_3GB, gpu_memory_mib=4096)
    result = evaluate(inputs)
    assert any("6144 MiB > 4096 MiB" in p for p in result.problems)
    assert result.memory_mib == 6144
    assert result.to_status()["problems"] == result.problems


def test_auto_plan_refuses_when_not_even_one_instance_fits(make_inputs):
    inputs = make_inputs(memory=MemoryNeeds(weights_mib=3000, gpu_embeddings_mib=2000), gpu_memory_mib=4096)
    with pytest.raises(PlanError, match=r"5000 MiB\) \+ runtime reserve 0 = 5000 MiB > 4096 MiB"):
        plan(inputs)


def test_auto_plan_keeps_instances_within_memory(make_inputs):
    needs = MemoryNeeds(weights_mib=1024, gpu_embeddings_mib=2048, runtime_reserve_mib=1024)
    result = plan(make_inputs(p99=20, memory=needs, gpu_memory_mib=8192))
    assert result.instances_per_gpu <= 2                 # (8192 - 1024) // 3072
    assert result.memory_mib <= 8192
