"""Latency-tuning checks on real host layouts (issue 37, items 6-10).

Each test builds a host tree the way a real node has it: the profile file that outlives its daemon,
comm cut by the kernel to 15 characters, /dev/cpu_dma_latency read back as a 4-byte int32, a GPU
whose firmware reports no NUMA node, a cpuidle state whose latency cannot be read.
"""
from __future__ import annotations

import struct

import pytest

from rankops.api.gpunodepool import NodeRequirements
from rankops.validator import gpu
from rankops.validator import latency as lat
from rankops.validator.result import Status
from rankops.validator.host import HostView, Read
from rankops.validator.node import LABEL_LATENCY_TUNED, LABEL_TOPOLOGY_ALIGNED, node_patch
from rankops.validator.report import render_text, validate_host
from rankops_dev import sample_hosts as trees

REQUIRE = NodeRequirements.model_validate({"latencyTuning": "require"})
CPUS = range(4)
NO_REQUEST = struct.pack("<i", 2_000_000_000)  # PM_QOS_CPU_LATENCY_DEFAULT_VALUE read back


def _proc(pid: int, comm: str, *argv: str) -> dict:
    """/proc/PID as the kernel shows it: comm cut to 15 characters, cmdline NUL-separated."""
    return {f"proc/{pid}/comm": f"{comm[:15]}\n",
            f"proc/{pid}/cmdline": trees.Bytes(b"".join(arg.encode() + b"\0" for arg in argv))}


def _host(build_host, scenario="latency-tuned", **overrides) -> HostView:
    return HostView(build_host(scenario, overrides))


def _facts(xml=trees.NVIDIA_SMI_T4_CLOCKS_LOCKED):
    return gpu.from_nvidia_smi_file(str(xml))


def _labels(host: HostView, xml=trees.NVIDIA_SMI_T4_CLOCKS_LOCKED, requirements=trees.LATENCY_REQUIRE):
    report = validate_host(host, NodeRequirements.model_validate(requirements), _facts(xml))
    labels = node_patch(report, "p", False, {"metadata": {}})["metadata"]["labels"]
    return report, labels


# ---------------------------------------------------------------- item 6: tuned must be running

# tuned stopped (systemctl stop tuned; or it crashed): /etc/tuned/active_profile still names the profile,
# and with the daemon gone its force_latency request went with it.
TUNED_STOPPED = {"proc/1187": None, "dev/cpu_dma_latency": trees.Bytes(NO_REQUEST)}


def test_a_profile_file_without_a_running_tuned_holds_nothing(build_host):
    host = _host(build_host, **TUNED_STOPPED, **_proc(1043, "sshd", "/usr/sbin/sshd", "-D"))
    tuned = lat.check_tuned(host, REQUIRE)
    assert tuned.status is Status.FAIL, tuned.observed
    assert "no tuned process runs" in tuned.observed and "latency-performance" in tuned.observed
    idle = lat.check_cpu_idle(host, REQUIRE)
    assert idle.status is Status.FAIL and "held off" not in idle.observed, idle.observed
    report, labels = _labels(host)
    assert not report.ready and labels[LABEL_LATENCY_TUNED] == "false", render_text(report)


def test_tuned_run_as_a_python_script_is_found_through_its_cmdline(build_host):
    """comm is the interpreter's when tuned is started as `python3 /usr/sbin/tuned`; tuned-adm is not tuned."""
    host = _host(build_host, **{"proc/1187": None},
                 **_proc(2201, "python3", "/usr/bin/python3", "-Es", "/usr/sbin/tuned", "-l", "-P"),
                 **_proc(2300, "tuned-adm", "/usr/bin/python3", "-Es", "/usr/sbin/tuned-adm", "active"))
    assert lat.tuned_daemon(host).value == ["2201"]
    result = lat.check_tuned(host, REQUIRE)
    assert result.status is Status.PASS and "pid 2201" in result.observed


def test_no_tuned_but_c_states_and_governor_held_otherwise_passes(build_host):
    """tuned not installed; intel_idle.max_cstate=1 on the command line and cpupower's performance governor."""
    host = _host(build_host, **{"etc/tuned": None, "proc/1187": None,
                                "proc/cmdline": "BOOT_IMAGE=/vmlinuz ro intel_idle.max_cstate=1\n"})
    result = lat.check_tuned(host, REQUIRE)
    assert result.status is Status.PASS and "other means" in result.observed, result.observed


def test_no_tuned_and_nothing_else_fails_rather_than_unknown(build_host):
    host = _host(build_host, "latency-untuned", **{"etc/tuned": None, "proc/1187": None})
    result = lat.check_tuned(host, REQUIRE)
    assert result.status is Status.FAIL and "tuned not running" in result.observed


def test_no_processes_under_the_host_root_is_unknown(build_host):
    host = _host(build_host, **{f"proc/{pid}": None for pid in (1, 2, 1043, 1187, 1502)})
    assert lat.check_tuned(host, REQUIRE).status is Status.UNKNOWN


# ---------------------------------------------------------------- item 7: /dev/cpu_dma_latency

@pytest.mark.parametrize("value", [struct.pack("<i", 0), b"0\n", struct.pack("<i", 2)],
                         ids=["int32-0", "text-0", "int32-2"])
def test_a_pm_qos_request_held_by_another_process_keeps_c_states_off(build_host, value):
    """tuned runs `balanced`; a latency daemon of the site's own holds /dev/cpu_dma_latency open."""
    host = _host(build_host, "latency-untuned", **{"dev/cpu_dma_latency": trees.Bytes(value)})
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is Status.PASS and "PM QoS request" in result.observed, result.observed
    assert "tuned" not in result.observed


def test_a_pm_qos_request_above_c1e_leaves_c1e_in_use(build_host):
    host = _host(build_host, "latency-untuned", **{"dev/cpu_dma_latency": trees.Bytes(struct.pack("<i", 20))})
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is Status.FAIL and "C1E (10 µs)" in result.observed and "C6" not in result.observed


@pytest.mark.parametrize("content", [None, trees.Dir(), trees.Bytes(b"\x01\x02")], ids=["missing", "unreadable",
                                                                                       "garbled"])
def test_an_unreadable_pm_qos_value_is_unknown_not_inferred(build_host, content):
    """tuned runs latency-performance, but what the governor obeys cannot be read: unknown, not 'held off'."""
    host = _host(build_host, **{"dev/cpu_dma_latency": content})
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is Status.UNKNOWN and result.blocks_readiness, result.observed
    assert "/dev/cpu_dma_latency" in result.observed


@pytest.mark.parametrize("data, value", [(struct.pack("<i", 2), 2), (struct.pack("<i", 2_000_000_000), 2_000_000_000),
                                         (b"2\n", 2), (b"2000000000\n", 2_000_000_000), (b"\xff\xff\xff\xff", None),
                                         (b"", None), (b"abc", None)])
def test_cpu_dma_latency_is_an_int32_or_a_number(data, value):
    assert lat.parse_cpu_dma_latency(data) == value


# ---------------------------------------------------------------- item 8: numa_node -1

def test_a_gpu_without_a_numa_node_on_two_nodes_is_unknown_not_aligned(build_host):
    host = _host(build_host, **{f"sys/devices/pci0000:00/{trees.GPU_PCI}/numa_node": "-1\n"})
    result = lat.check_topology(host, REQUIRE)
    assert result.status is Status.UNKNOWN and "NUMA node -1" not in result.observed, result.observed
    assert "numa_node -1" in result.observed and "BIOS" in result.remedy
    assert _labels(host)[1][LABEL_TOPOLOGY_ALIGNED] == "unknown"


def test_a_gpu_without_a_numa_node_on_one_node_is_aligned(build_host):
    host = _host(build_host, **{f"sys/devices/pci0000:00/{trees.GPU_PCI}/numa_node": "-1\n",
                                "sys/devices/system/node/node1": None})
    assert lat.check_topology(host, REQUIRE).status is Status.PASS


def test_a_gpu_without_a_numa_node_and_no_policies_still_fails(build_host):
    host = _host(build_host, **{f"sys/devices/pci0000:00/{trees.GPU_PCI}/numa_node": "-1\n",
                                "var/lib/kubelet/config.yaml": trees.kubelet_yaml(None, None)})
    assert lat.check_topology(host, REQUIRE).status is Status.FAIL


# ---------------------------------------------------------------- item 9: MPS on a real host

MPS_DAEMONS = {**_proc(48100, "nvidia-cuda-mps-control", "nvidia-cuda-mps-control", "-d"),
               **_proc(48102, "nvidia-cuda-mps-server", "nvidia-cuda-mps-server")}


def test_mps_control_is_found_though_comm_is_cut_to_15_characters(build_host):
    host = _host(build_host, **MPS_DAEMONS)
    assert host.read_text("/proc/48100/comm").value == "nvidia-cuda-mps\n"
    result = lat.check_gpu_sharing(host, REQUIRE, _facts(trees.NVIDIA_SMI_T4_SHARED))
    assert result.status is Status.PASS and "nvidia-cuda-mps-control running" in result.observed, result.observed


def test_mps_clients_on_the_gpu_prove_mps_runs(build_host):
    """The GPU lists its MPS server (M) and clients (M+C); the daemons' /proc is not seen: no advice to run MPS."""
    result = lat.check_gpu_sharing(_host(build_host), REQUIRE, _facts(trees.NVIDIA_SMI_T4_MPS))
    assert result.status is Status.PASS and "MPS clients on GPU 0" in result.observed, result.observed
    assert not result.remedy


def test_a_cut_comm_of_another_program_is_no_mps(build_host):
    host = _host(build_host, **_proc(48100, "nvidia-cuda-mps-probe", "/usr/local/bin/nvidia-cuda-mps-probe"))
    result = lat.check_gpu_sharing(host, REQUIRE, _facts(trees.NVIDIA_SMI_T4_SHARED))
    assert result.status is Status.FAIL and "MPS" in result.remedy


@pytest.mark.parametrize("name", sorted(trees.SCENARIOS))
def test_sample_hosts_write_comm_as_the_kernel_does(build_host, name):
    host = HostView(build_host(name))
    for proc in host.glob("/proc", "[0-9]*"):
        comm = host.read_text(f"{proc}/comm").value
        assert comm.endswith("\n") and len(comm.rstrip("\n")) <= 15, (proc, comm)  # TASK_COMM_LEN - 1


# ---------------------------------------------------------------- item 10

@pytest.mark.parametrize("latency", [None, "N/A\n", trees.Dir()], ids=["missing", "not-a-number", "unreadable"])
def test_an_enabled_state_of_unknown_latency_makes_idle_unknown(build_host, latency):
    """C1E disabled; C6 enabled but its latency cannot be read: 'no deep state enabled' would be a guess."""
    overrides = {f"sys/devices/system/cpu/cpu{n}/cpuidle/state2/disable": "1\n" for n in CPUS}
    overrides |= {f"sys/devices/system/cpu/cpu{n}/cpuidle/state3/latency": latency for n in CPUS}
    host = _host(build_host, "latency-untuned", **overrides)
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is Status.UNKNOWN and "C6" in result.observed, result.observed


def test_a_state_of_unknown_latency_under_a_c1_request_is_held_off(build_host):
    overrides = {f"sys/devices/system/cpu/cpu{n}/cpuidle/state{s}/latency": None for n in CPUS for s in (2, 3)}
    host = _host(build_host, "latency-untuned", **overrides, **{"dev/cpu_dma_latency": trees.Bytes(b"0\n")})
    assert lat.check_cpu_idle(host, REQUIRE).status is Status.PASS


def test_a_tuned_host_with_overcommit_0_is_ready_and_labelled_tuned(build_host):
    host = _host(build_host, **{"proc/sys/vm/overcommit_memory": "0\n"})
    report, labels = _labels(host)
    assert report.ready and labels[LABEL_LATENCY_TUNED] == "true", render_text(report)
    assert report.check("overcommit-memory").status is Status.WARN


def test_an_nvidia_smi_parse_error_is_in_the_checks_message(build_host, tmp_path):
    garbled = tmp_path / "nvidia-smi.xml"
    garbled.write_text("<nvidia_smi_log><gpu>")
    host = _host(build_host)
    facts = gpu.gather(host, str(garbled), use_nvml=False)
    for check in (lat.check_gpu_persistence, lat.check_gpu_clocks):
        result = check(REQUIRE, facts)
        assert result.status is Status.UNKNOWN and "not well-formed" in result.observed, result.observed


def test_no_current_clock_is_unknown_not_none():
    t4 = gpu.Gpu(product="Tesla T4", applications_graphics_clock_mhz=585, max_graphics_clock_mhz=1590, idle=False)
    result = lat.check_gpu_clocks(REQUIRE, Read(gpu.GpuFacts(source="nvidia-smi -q -x", gpus=(t4,))))
    assert "None" not in result.observed and "now unknown" in result.observed


def test_the_limit_named_is_the_one_the_idle_driver_obeys(build_host):
    """OpenShift's processor.max_cstate=1 intel_idle.max_cstate=0: the second only hands idle to acpi_idle."""
    result = lat.check_cpu_idle(_host(build_host, "openshift-performance-profile"), REQUIRE)
    assert result.status is Status.PASS and result.observed.startswith("limited by processor.max_cstate=1")


def test_processor_max_cstate_does_not_limit_intel_idle(build_host):
    overrides = {f"sys/devices/system/cpu/cpu{n}/cpuidle": None for n in CPUS}
    host = _host(build_host, "latency-untuned", **overrides,
                 **{"proc/cmdline": "BOOT_IMAGE=/vmlinuz ro processor.max_cstate=1\n"})
    result = lat.check_cpu_idle(host, REQUIRE)
    assert result.status is not Status.PASS and "processor.max_cstate" not in result.observed


@pytest.mark.parametrize("enabled, status", [("[always] madvise never\n", Status.WARN),
                                             ("always [madvise] never\n", Status.PASS),
                                             ("always madvise [never]\n", Status.PASS), (None, Status.UNKNOWN)])
def test_transparent_hugepages_are_reported_advisory(build_host, enabled, status):
    host = _host(build_host, **{"sys/kernel/mm/transparent_hugepage/enabled": enabled})
    report, _ = _labels(host)
    result = report.check("transparent-hugepages")
    assert result.status is status and not result.required and report.ready, render_text(report)
    if status is Status.WARN:
        assert "always" in result.observed and "transparent_hugepage" in result.remedy
