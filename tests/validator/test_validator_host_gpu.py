"""The host view never escapes its root nor raises; GPU facts parse the real nvidia-smi formats."""
from __future__ import annotations

import os

import pytest

from rankops.api.gpunodepool import NodeRequirements
from rankops.validator import gpu
from rankops.validator.checks import check_gpu_health, driver_max_cuda
from rankops.validator.result import Status
from rankops.validator.host import HostView, Read
from rankops_dev import sample_hosts as trees


def test_absolute_symlink_resolves_under_the_host_root(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_text('ID="rhel"\n')
    (tmp_path / "etc").mkdir()
    os.symlink("/usr/lib/os-release", tmp_path / "etc/os-release")
    assert HostView(tmp_path).read_text("/etc/os-release").value == 'ID="rhel"\n'


def test_dotdot_and_links_cannot_leave_the_root(tmp_path):
    (tmp_path / "etc").mkdir()
    os.symlink("../../../../../../etc/hostname", tmp_path / "etc/escape")
    host = HostView(tmp_path)
    assert host.local_path("/../../etc/passwd") == tmp_path / "etc/passwd"
    assert host.local_path("/etc/escape") == tmp_path / "etc/hostname"
    assert not host.read_text("/etc/escape").ok


def test_symlink_loop_is_a_reason(tmp_path):
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    read = HostView(tmp_path).read_text("/a")
    assert not read.ok and "symbolic links" in read.reason


@pytest.mark.parametrize("setup, reason", [
    (lambda p: (p / "f").mkdir(), "is a directory"),
    (lambda p: (p / "f").write_text(""), "empty"),
    (lambda p: (p / "f").write_bytes(b"\xff\xfe"), "not UTF-8"),
    (lambda p: None, "not found"),
])
def test_read_failures_are_reasons(tmp_path, setup, reason):
    setup(tmp_path)
    read = HostView(tmp_path).read_text("/f")
    assert read == Read(None, read.reason) and reason in read.reason


def test_permission_denied_is_a_reason(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("builtins.open", denied)
    assert HostView(tmp_path).read_text("/f").reason == "/f: permission denied"


def test_t4_nvidia_smi_xml():
    facts = gpu.parse_nvidia_smi_xml(trees.NVIDIA_SMI_T4.read_text()).value
    assert (facts.driver_version, facts.cuda_version) == ("535.104.05", "12.2")
    [t4] = facts.gpus
    assert (t4.product, t4.memory_mib, t4.temperature_c, t4.slowdown_temperature_c) == ("Tesla T4", 15360, 31, 93)
    assert t4.throttle_reasons == () and t4.ecc_uncorrectable == 0  # gpu_idle is not alarming


def _variant(old: str, new: str) -> gpu.GpuFacts:
    text = trees.NVIDIA_SMI_T4.read_text()
    assert old in text
    return gpu.parse_nvidia_smi_xml(text.replace(old, new))


def test_550_style_event_reasons_and_thermal_slowdown_warn():
    facts = _variant("<clocks_throttle_reason_hw_thermal_slowdown>Not Active</clocks_throttle_reason_hw_thermal_slowdown>",
                     "<clocks_throttle_reason_hw_thermal_slowdown>Active</clocks_throttle_reason_hw_thermal_slowdown>")
    assert facts.value.gpus[0].throttle_reasons == ("hw_thermal_slowdown",)
    renamed = trees.NVIDIA_SMI_T4.read_text().replace("clocks_throttle_reason", "clocks_event_reason").replace(
        "<clocks_event_reason_sw_thermal_slowdown>Not Active", "<clocks_event_reason_sw_thermal_slowdown>Active")
    facts550 = gpu.parse_nvidia_smi_xml(renamed)
    assert facts550.value.gpus[0].throttle_reasons == ("sw_thermal_slowdown",)
    health = check_gpu_health(NodeRequirements(), facts550)
    assert health.status is Status.WARN and not health.required


def test_uncorrectable_ecc_fails_health_and_hot_gpu_warns():
    ecc = _variant("<dram_uncorrectable>0</dram_uncorrectable>\n\t\t\t</volatile>",
                   "<dram_uncorrectable>3</dram_uncorrectable>\n\t\t\t</volatile>")
    health = check_gpu_health(NodeRequirements(), ecc)
    assert health.status is Status.FAIL and "3 uncorrectable ECC errors" in health.observed
    hot = check_gpu_health(NodeRequirements(), _variant("<gpu_temp>31 C</gpu_temp>", "<gpu_temp>90 C</gpu_temp>"))
    assert hot.status is Status.WARN and "90 C" in hot.observed


def test_pre_535_ecc_layout():
    old = ("<volatile><single_bit><device_memory>0</device_memory><total>0</total></single_bit>"
           "<double_bit><device_memory>2</device_memory><total>2</total></double_bit></volatile>")
    text = trees.NVIDIA_SMI_T4.read_text()
    start, end = text.index("<volatile>"), text.index("</volatile>") + len("</volatile>")
    facts = gpu.parse_nvidia_smi_xml(text[:start] + old + text[end:])
    assert facts.value.gpus[0].ecc_uncorrectable == 2


@pytest.mark.parametrize("text, reason", [
    ("<nvidia_smi_log><gpu>", "not well-formed"),
    ("<html/>", "expected <nvidia_smi_log>"),
    ("<nvidia_smi_log><driver_version>535</driver_version></nvidia_smi_log>", "no <gpu>"),
])
def test_bad_xml_is_a_reason(text, reason):
    read = gpu.parse_nvidia_smi_xml(text)
    assert not read.ok and reason in read.reason


def test_gather_prefers_xml_and_keeps_reasons_of_failed_sources(build_host, tmp_path):
    host = HostView(build_host())
    bad = tmp_path / "bad.xml"
    bad.write_text("not xml")
    facts = gpu.gather(host, str(bad), use_nvml=False)
    assert facts.value.source == "/proc/driver/nvidia/gpus" and "not well-formed" in facts.value.notes[0]


def test_nvml_source_with_a_fake_pynvml(monkeypatch):
    import types
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: b"NVIDIA L4",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=23034 * 1024 * 1024),
        nvmlDeviceGetTemperature=lambda h, kind: 40 + h, nvmlDeviceGetTemperatureThreshold=lambda h, kind: 90,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x1 | (0x40 if h else 0),
        nvmlDeviceGetTotalEccErrors=lambda h, a, b: 0,
        nvmlSystemGetDriverVersion=lambda: "550.54.15", nvmlSystemGetCudaDriverVersion=lambda: 12040,
        NVML_TEMPERATURE_GPU=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    facts = gpu.from_nvml().value
    assert (facts.cuda_version, facts.driver_version, len(facts.gpus)) == ("12.4", "550.54.15", 2)
    assert facts.gpus[1].throttle_reasons == ("hw_thermal_slowdown",) and facts.gpus[0].memory_mib == 23034


def test_nvml_mismatch_error_is_a_reason(monkeypatch):
    import types

    def fail():
        raise RuntimeError("Driver/library version mismatch")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", types.SimpleNamespace(nvmlInit=fail))
    assert "version mismatch" in gpu.from_nvml().reason


@pytest.mark.parametrize("driver, cuda", [
    ("535.104.05", "12.2"), ("535.54.03", "12.2"), ("530.30.02", "12.1"), ("525.147.05", "12.0"),
    ("550.54.14", "12.4"), ("470.82.01", "11.4"), ("570.26", "12.8"), ("418.39", "10.1"), ("390.1", None),
])
def test_driver_to_cuda_table(driver, cuda):
    assert driver_max_cuda(driver)[0] == cuda


def test_driver_beyond_the_table_is_flagged():
    assert driver_max_cuda("999.10.01")[1] is True and driver_max_cuda("535.104.05")[1] is False
