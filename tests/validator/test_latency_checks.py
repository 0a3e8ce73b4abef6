"""The latency checks (issue 28): each state of each check, from host trees and nvidia-smi XML."""
from __future__ import annotations

import pytest

from rankops.api.gpunodepool import NodeRequirements
from rankops.validator import gpu
from rankops.validator import latency as lat
from rankops.validator.result import CheckResult, Status
from rankops.validator.host import HostView, Read
from rankops.validator.node import LABEL_LATENCY_TUNED, LABEL_TOPOLOGY_ALIGNED, node_patch
from rankops.validator.report import render_text, validate_host
from rankops_dev import sample_hosts as trees

REQUIRE = NodeRequirements.model_validate({"latencyTuning": "require"})
WARN = NodeRequirements()


def _host(build_host, scenario="latency-tuned", **overrides) -> HostView:
    return HostView(build_host(scenario, overrides))


def _facts(xml=trees.NVIDIA_SMI_T4_CLOCKS_LOCKED):
    return gpu.from_nvidia_smi_file(str(xml))


# ---------------------------------------------------------------- CPU frequency

def test_performance_governor_on_every_cpu_passes(build_host):
    result = lat.check_cpu_frequency(_host(build_host), REQUIRE)
    assert result.status is Status.PASS and "performance on 4 CPUs" in result.observed
    assert "intel_pstate active" in result.observed


def test_one_cpu_in_powersave_is_not_tuned_and_require_fails_it(build_host):
    host = _host(build_host, **{"sys/devices/system/cpu/cpu3/cpufreq/scaling_governor": "powersave\n"})
    result = lat.check_cpu_frequency(host, REQUIRE)
    assert result.status is Status.FAIL and result.required
    assert "performance on 3 CPUs, powersave on 1 CPU" in result.observed and "tuned-adm" in result.remedy
    advisory = lat.check_cpu_frequency(host, WARN)
    assert advisory.status is Status.WARN and not advisory.required and not advisory.blocks_readiness


def test_no_cpufreq_driver_is_unknown(build_host):
    """A VM or firmware-owned P-states: nothing the OS can say about frequency."""
    result = lat.check_cpu_frequency(_host(build_host, "latency-unreadable"), REQUIRE)
    assert result.status is Status.UNKNOWN and result.blocks_readiness


def test_no_cpufreq_with_a_pstate_driver_says_so(build_host):
    host = _host(build_host, **{f"sys/devices/system/cpu/cpu{n}/cpufreq": None for n in range(4)})
    result = lat.check_cpu_frequency(host, REQUIRE)
    assert result.status is Status.UNKNOWN and "intel_pstate active" in result.observed


def test_unreadable_governor_is_unknown_not_a_crash(build_host):
    host = _host(build_host, **{"sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": trees.Dir()})
    assert lat.check_cpu_frequency(host, REQUIRE).status is Status.UNKNOWN


# ---------------------------------------------------------------- CPU idle

def test_deep_states_enabled_without_tuned_fail(build_host):
    result = lat.check_cpu_idle(_host(build_host, "latency-untuned"), REQUIRE)
    assert result.status is Status.FAIL and "C6 (170 µs) on 4 CPUs" in result.observed


def test_deep_states_held_off_by_a_latency_profile_pass(build_host):
    result = lat.check_cpu_idle(_host(build_host), REQUIRE)
    assert result.status is Status.PASS and "force_latency" in result.observed


def test_deep_states_disabled_in_sysfs_pass(build_host):
    disabled = {f"sys/devices/system/cpu/cpu{n}/cpuidle/state{s}/disable": "1\n" for n in range(4) for s in (2, 3)}
    host = _host(build_host, "latency-untuned", **disabled)
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is Status.PASS and "no deep state enabled (intel_idle)" == result.observed


@pytest.mark.parametrize("param", ["intel_idle.max_cstate=1", "processor.max_cstate=0", "idle=poll"])
def test_a_command_line_limit_passes_without_sysfs(build_host, param):
    host = _host(build_host, "latency-unreadable", **{"proc/cmdline": f"BOOT_IMAGE=/vmlinuz ro {param}\n"})
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is Status.PASS and param in result.observed


def test_no_cpuidle_sysfs_is_unknown(build_host):
    assert lat.check_cpu_idle(_host(build_host, "latency-unreadable"), REQUIRE).status is Status.UNKNOWN


# ---------------------------------------------------------------- tuned, overcommit

@pytest.mark.parametrize("profile, status", [
    ("latency-performance", Status.PASS), ("network-latency", Status.PASS), ("cpu-partitioning", Status.PASS),
    ("openshift-node-performance-rankops", Status.PASS), ("throughput-performance", Status.FAIL),
    ("virtual-guest", Status.FAIL), ("", Status.FAIL)])
def test_tuned_profiles(build_host, profile, status):
    host = _host(build_host, **{"etc/tuned/active_profile": f"{profile}\n" if profile else ""})
    result = lat.check_tuned(host, REQUIRE)
    assert result.status is status, result.observed
    if not profile:
        assert "tuned-adm off" in result.observed


def test_tuned_missing_is_unknown(build_host):
    result = lat.check_tuned(_host(build_host, **{"etc/tuned": None}), REQUIRE)
    assert result.status is Status.UNKNOWN and "tuned-adm profile" in result.remedy


@pytest.mark.parametrize("value, status", [("1", Status.PASS), ("0", Status.WARN), ("2", Status.WARN),
                                           ("7", Status.UNKNOWN)])
def test_overcommit_memory(build_host, value, status):
    """Advisory under require too (issue 37 item 10): it never gates readiness."""
    host = _host(build_host, **{"proc/sys/vm/overcommit_memory": f"{value}\n"})
    result = lat.check_overcommit_memory(host, REQUIRE)
    assert result.status is status and not result.required and not result.blocks_readiness


def test_overcommit_unreadable_is_unknown(build_host):
    assert lat.check_overcommit_memory(_host(build_host, "latency-unreadable"), REQUIRE).status is Status.UNKNOWN


# ---------------------------------------------------------------- GPU

def test_nvidia_smi_xml_gives_the_latency_facts():
    [t4] = _facts(trees.NVIDIA_SMI_T4).value.gpus
    assert (t4.pci_bus_id, t4.persistence_mode, t4.compute_mode) == ("00000000:00:1E.0", True, "Default")
    assert (t4.graphics_clock_mhz, t4.applications_graphics_clock_mhz, t4.max_graphics_clock_mhz, t4.idle) == (
        300, 585, 1590, True)
    assert _facts(trees.NVIDIA_SMI_T4_SHARED).value.gpus[0].compute_processes == (
        "/opt/tritonserver/bin/tritonserver",) * 2
    # the MPS server (type M) is no client
    assert len(_facts(trees.NVIDIA_SMI_T4_MPS).value.gpus[0].compute_processes) == 2


@pytest.mark.parametrize("xml, status", [(trees.NVIDIA_SMI_T4, Status.PASS),
                                         (trees.NVIDIA_SMI_T4_PERSISTENCE_OFF, Status.FAIL)])
def test_gpu_persistence(xml, status):
    assert lat.check_gpu_persistence(REQUIRE, _facts(xml)).status is status


@pytest.mark.parametrize("xml, status, words", [
    (trees.NVIDIA_SMI_T4, Status.FAIL, "applications clock 585 of 1590 MHz, now 300 MHz"),
    (trees.NVIDIA_SMI_T4_CLOCKS_LOCKED, Status.PASS, "idle at 1590 MHz (locked"),
    (trees.NVIDIA_SMI_T4_APPLICATIONS_MAX, Status.PASS, "applications clock 1590 MHz = max")])
def test_gpu_clocks(xml, status, words):
    result = lat.check_gpu_clocks(REQUIRE, _facts(xml))
    assert result.status is status and words in result.observed
    if status is Status.FAIL:
        assert "nvidia-smi -lgc 1590,1590" in result.remedy


def test_gpu_clocks_not_reported_are_unknown():
    no_clocks = gpu.Gpu(product="Tesla T4", persistence_mode=True)
    facts = Read(gpu.GpuFacts(source="NVML", gpus=(no_clocks,)))
    assert lat.check_gpu_clocks(REQUIRE, facts).status is Status.UNKNOWN


def test_gpu_checks_without_nvml_or_xml_are_unknown(build_host):
    facts = gpu.from_proc(_host(build_host))
    for check in (lat.check_gpu_persistence, lat.check_gpu_clocks):
        assert check(REQUIRE, facts).status is Status.UNKNOWN
    assert lat.check_gpu_persistence(REQUIRE, Read.missing("NVML did not initialise")).status is Status.UNKNOWN


def test_time_sliced_gpu_fails_and_mps_passes(build_host):
    sliced = lat.check_gpu_sharing(_host(build_host), REQUIRE, _facts(trees.NVIDIA_SMI_T4_SHARED))
    assert sliced.status is Status.FAIL and "2 processes" in sliced.observed and "MPS" in sliced.remedy
    mps = lat.check_gpu_sharing(_host(build_host, "gpu-mps"), REQUIRE, _facts(trees.NVIDIA_SMI_T4_MPS))
    assert mps.status is Status.PASS and "nvidia-cuda-mps-control running" in mps.observed
    alone = lat.check_gpu_sharing(_host(build_host), REQUIRE, _facts())
    assert alone.status is Status.PASS


# ---------------------------------------------------------------- topology

def test_gpu_numa_node_through_the_pci_link(build_host):
    assert lat.gpu_numa_nodes(_host(build_host)).value == {"0000:00:1e.0": 0}
    moved = _host(build_host, **{f"sys/devices/pci0000:00/{trees.GPU_PCI}/numa_node": "1\n"})
    assert lat.gpu_numa_nodes(moved).value == {"0000:00:1e.0": 1}


@pytest.mark.parametrize("cpu, topology, status", [
    ("static", "single-numa-node", Status.PASS), ("static", "restricted", Status.PASS),
    ("static", "best-effort", Status.FAIL), ("static", None, Status.FAIL), (None, "single-numa-node", Status.FAIL),
    (None, None, Status.FAIL)])
def test_kubelet_policies(build_host, cpu, topology, status):
    host = _host(build_host, **{"var/lib/kubelet/config.yaml": trees.kubelet_yaml(cpu, topology)})
    result = lat.check_topology(host, REQUIRE)
    assert result.status is status, result.observed
    assert f"cpuManagerPolicy {cpu or 'none'}" in result.observed  # the kubelet's defaults when absent


def test_static_alone_is_aligned_on_one_numa_node(build_host):
    host = _host(build_host, **{"var/lib/kubelet/config.yaml": trees.kubelet_yaml("static", None),
                                "sys/devices/system/node/node1": None})
    result = lat.check_topology(host, REQUIRE)
    assert result.status is Status.PASS and "one NUMA node" in result.observed


def test_openshift_kubelet_conf_is_json(build_host):
    result = lat.check_topology(_host(build_host, "openshift-performance-profile"), REQUIRE)
    assert result.status is Status.PASS and "/etc/kubernetes/kubelet.conf" in result.observed


@pytest.mark.parametrize("content", [None, "{not: [valid", "kind: Pod\n"])
def test_missing_or_garbled_kubelet_config_is_unknown(build_host, content):
    host = _host(build_host, **{"var/lib/kubelet/config.yaml": content})
    assert lat.check_topology(host, REQUIRE).status is Status.UNKNOWN


# ---------------------------------------------------------------- modes and labels

def _result(status: Status, check_id="tuned") -> CheckResult:
    return CheckResult(check_id, status, "", "", "", False)


@pytest.mark.parametrize("statuses, label", [
    ((Status.PASS, Status.PASS), "true"), ((Status.PASS, Status.WARN), "false"),
    ((Status.FAIL, Status.UNKNOWN), "false"), ((Status.PASS, Status.UNKNOWN), "unknown")])
def test_label_value(statuses, label):
    results = [_result(statuses[0], "tuned"), _result(statuses[1], "cpu-idle")]
    assert lat.label_value(results, lat.LATENCY_TUNED_CHECKS) == label
    assert lat.label_value(results, lat.TOPOLOGY_ALIGNED_CHECKS) is None


def test_off_runs_no_latency_check_and_removes_the_labels(build_host):
    host = _host(build_host, "latency-untuned")
    report = validate_host(host, NodeRequirements.model_validate({"latencyTuning": "off"}), _facts())
    assert not {c.id for c in report.checks} & set(lat.LATENCY_TUNED_CHECKS + lat.TOPOLOGY_ALIGNED_CHECKS)
    labels = node_patch(report, "p", False, {"metadata": {}})["metadata"]["labels"]
    assert labels[LABEL_LATENCY_TUNED] is None and labels[LABEL_TOPOLOGY_ALIGNED] is None


@pytest.mark.parametrize("name", sorted(trees.SCENARIOS))
def test_every_scenario_labels_its_node(build_host, name):
    scenario = trees.SCENARIOS[name]
    host = HostView(build_host(name))
    xml = trees.nvidia_smi_xml(name)
    report = validate_host(host, NodeRequirements.model_validate(scenario.requirements),
                           gpu.gather(host, xml and str(xml), use_nvml=False))
    labels = node_patch(report, "p", False, {"metadata": {}})["metadata"]["labels"]
    assert (labels[LABEL_LATENCY_TUNED], labels[LABEL_TOPOLOGY_ALIGNED]) == (
        scenario.latency_tuned, scenario.topology_aligned), render_text(report)
    for check in report.checks:
        if check.id in lat.LATENCY_TUNED_CHECKS + lat.TOPOLOGY_ALIGNED_CHECKS and check.status is not Status.PASS:
            assert check.remedy and check.expected, f"{name}: {check.id} says not what to do"


def test_pool_status_counts_tuned_and_aligned_nodes(build_host):
    from rankops.api.gpunodepool import GpuNodePool
    from rankops.pool_status import aggregate_pool_status

    pool = GpuNodePool.model_validate({"metadata": {"name": "t4-pool"}, "spec": {
        "nodeSelector": {"pool": "t4"}, "requirements": trees.LATENCY_REQUIRE}})
    nodes = []
    for index, name in enumerate(("latency-tuned", "latency-untuned", "gpu-time-sliced")):
        host = HostView(build_host(name))
        report = validate_host(host, pool.spec.requirements, _facts(trees.nvidia_smi_xml(name)),
                               node=f"gpu-{index}", pool="t4-pool")
        node = {"metadata": {"name": f"gpu-{index}", "labels": {}, "annotations": {}}}
        patch = node_patch(report, "t4-pool", False, node)["metadata"]
        node["metadata"]["labels"] = {k: v for k, v in patch["labels"].items() if v is not None}
        node["metadata"]["annotations"] = patch["annotations"]
        nodes.append(node)
    summary = aggregate_pool_status(pool, nodes)
    assert (summary["ready"], summary["failing"], summary["latencyTuned"], summary["topologyAligned"]) == (1, 2, 1, 2)
    assert {entry["check"] for entry in summary["failingByCheck"]} >= {"gpu-sharing", "topology", "tuned"}
