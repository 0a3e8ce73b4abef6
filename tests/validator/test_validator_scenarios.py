"""Each fixture host gives the verdict a person would expect, and says why."""
from __future__ import annotations

import pytest

from rankops.api.gpunodepool import NodeRequirements
from rankops.validator import gpu
from rankops.validator.result import Status
from rankops.validator.host import HostView
from rankops.validator.report import Report, render_text, validate_host
from rankops_dev import sample_hosts as trees


def _validate(root, requirements=None, xml=None):
    host = HostView(root)
    return validate_host(host, NodeRequirements.model_validate(requirements or {}),
                         gpu.gather(host, xml, use_nvml=False), node="gpu-1", pool="t4-pool")


@pytest.mark.parametrize("name", sorted(trees.SCENARIOS))
def test_scenario_verdict(build_host, name):
    scenario = trees.SCENARIOS[name]
    # Required latency checks judge the GPU's persistence, clocks and sharing, which only NVML or
    # nvidia-smi report; the other scenarios hold with the kernel module's /proc files alone.
    latency_required = scenario.requirements.get("latencyTuning") == "require"
    report = _validate(build_host(name), scenario.requirements,
                       str(trees.nvidia_smi_xml(name)) if latency_required else None)
    assert report.ready is scenario.ready, render_text(report)
    assert tuple(check.id for check in report.blocking) == scenario.blocking, render_text(report)
    for check in report.blocking:
        assert check.remedy, f"{check.id} blocks readiness but offers no remedy"


def test_healthy_host_with_nvidia_smi_xml_uses_its_facts(build_host):
    report = _validate(build_host(), trees.T4_REQUIREMENTS, str(trees.NVIDIA_SMI_T4))
    assert report.ready
    assert report.gpu_source == "nvidia-smi -q -x"
    assert report.check("gpu-memory").observed.startswith("smallest GPU 15360 MiB")
    assert report.check("gpu-health").status is Status.PASS
    assert (report.os, report.driver_version, report.cuda_version) == ("rhel-8.9", "535.104.05", "12.2")


def test_without_nvml_memory_comes_from_the_product_table_and_says_so(build_host):
    report = _validate(build_host(), trees.T4_REQUIREMENTS)
    assert report.check("gpu-product").observed == "1 x Tesla T4 (/proc/driver/nvidia/gpus)"
    assert "product table" in report.check("gpu-memory").observed
    assert report.check("gpu-health").status is Status.UNKNOWN and not report.check("gpu-health").required


def test_rocky_is_accepted_and_named(build_host):
    report = _validate(build_host("rocky8"))
    assert report.check("os").status is Status.PASS
    assert report.check("os").observed == "Rocky Linux 8.9 (Green Obsidian)"
    assert report.os == "rocky-8.9"


def test_alma_and_redhat_release_fallback(build_host):
    root = build_host(overrides={"etc/os-release": None,
                                 "etc/redhat-release": "AlmaLinux release 8.9 (Midnight Oncilla)\n"})
    report = _validate(root)
    assert report.check("os").status is Status.PASS and report.os == "almalinux-8.9"


def test_rhel9_fails_os_major(build_host):
    root = build_host(overrides={"etc/os-release": trees.RHEL_OS_RELEASE.replace("8.9", "9.3")})
    check = _validate(root).check("os")
    assert check.status is Status.FAIL and "9.3" in check.observed


def test_ubuntu_names_what_it_found(build_host):
    check = _validate(build_host("ubuntu")).check("os")
    assert check.status is Status.FAIL and check.observed == "Ubuntu 22.04.4 LTS"


def test_mismatch_names_both_versions(build_host):
    check = _validate(build_host("driver-mismatch")).check("nvml")
    assert "535.104.05" in check.observed and "535.129.03" in check.observed
    assert "reboot" in check.remedy.lower()


def test_nouveau_not_loaded_but_not_blacklisted_warns_without_blocking(build_host):
    root = build_host(overrides={"etc/modprobe.d/blacklist-nouveau.conf": None,
                                 "proc/cmdline": "BOOT_IMAGE=/vmlinuz ro quiet\n"})
    report = _validate(root)
    assert report.check("nouveau").status is Status.WARN and report.ready


def test_nouveau_blacklisted_on_cmdline_only_passes(build_host):
    root = build_host(overrides={"etc/modprobe.d/blacklist-nouveau.conf": None})
    check = _validate(root).check("nouveau")
    assert check.status is Status.PASS and "/proc/cmdline" in check.observed


def test_secure_boot_on_with_signed_module_passes(build_host):
    root = build_host("secureboot-unsigned", {"sys/module/nvidia/taint": "PO\n"})
    assert _validate(root).check("secure-boot").observed == "Secure Boot on; nvidia module signed"


def test_secure_boot_short_variable_is_unknown(build_host):
    name = f"sys/firmware/efi/efivars/SecureBoot-{trees.EFI_GUID}"
    check = _validate(build_host(overrides={name: trees.Bytes(b"\x06\x00")})).check("secure-boot")
    assert check.status is Status.UNKNOWN and "2 bytes" in check.observed


def test_legacy_bios_boot_has_no_secure_boot(build_host):
    root = build_host("secureboot-unsigned", {"sys/firmware/efi": None})
    assert _validate(root).check("secure-boot").observed == "Secure Boot off"


def test_secure_boot_not_required_only_warns(build_host):
    report = _validate(build_host("secureboot-unsigned"), {"secureBootSignedModules": False})
    assert report.check("secure-boot").status is Status.WARN and report.ready


def test_selinux_permissive_or_disabled(build_host):
    permissive = _validate(build_host("selinux-boolean-off", {"sys/fs/selinux/enforce": "0"}))
    assert permissive.check("selinux").status is Status.WARN and permissive.ready
    disabled = _validate(build_host("selinux-boolean-off", {"sys/fs/selinux": None}))
    assert disabled.check("selinux").observed == "SELinux disabled"


def test_selinux_garbled_boolean_is_unknown(build_host):
    check = _validate(build_host(overrides={"sys/fs/selinux/booleans/container_use_devices": "on"})).check("selinux")
    assert check.status is Status.UNKNOWN and "'on'" in check.observed


def test_selinux_off_remedy_is_setsebool(build_host):
    assert _validate(build_host("selinux-boolean-off")).check("selinux").remedy == "setsebool -P container_use_devices on"


@pytest.mark.parametrize("overrides, evidence", [
    ({"etc/cdi/nvidia.yaml": None}, "CRI-O runtime"),
    ({"etc/crio/crio.conf.d/99-nvidia.toml": None}, "CDI spec"),
    ({"etc/crio/crio.conf.d/99-nvidia.toml": None, "etc/cdi/nvidia.yaml": None,
      "var/run/cdi/nvidia.json": '{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0"}]}'},
     "CDI spec /var/run/cdi/nvidia.json"),
    ({"etc/crio/crio.conf.d/99-nvidia.toml": None, "etc/cdi/nvidia.yaml": None,
      "etc/containerd/config.toml": 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                                    '  runtime_type = "io.containerd.runc.v2"\n'},
     "containerd runtime"),
    ({"etc/crio/crio.conf.d/99-nvidia.toml": None, "etc/cdi/nvidia.yaml": None,
      "usr/share/containers/oci/hooks.d/oci-nvidia-hook.json":
          '{"version": "1.0.0", "hook": {"path": "/usr/bin/nvidia-container-toolkit", "args": '
          '["nvidia-container-toolkit", "prestart"]}, "when": {"always": true}, "stages": ["prestart"]}'},
     "OCI hook"),
])
def test_container_toolkit_evidence(build_host, overrides, evidence):
    check = _validate(build_host(overrides=overrides)).check("container-toolkit")
    assert check.status is Status.PASS and evidence in check.observed


def test_container_toolkit_garbled_config_is_unknown_not_a_crash(build_host):
    root = build_host("no-toolkit", {"etc/crio/crio.conf.d/99-nvidia.toml": "[crio.runtime\nbroken"})
    check = _validate(root).check("container-toolkit")
    assert check.status is Status.UNKNOWN and "not valid TOML" in check.observed


def test_no_toolkit_remedy_configures_crio(build_host):
    check = _validate(build_host("no-toolkit")).check("container-toolkit")
    assert "nvidia-ctk runtime configure --runtime=crio" in check.remedy


def test_cuda_without_xml_uses_the_table(build_host):
    check = _validate(build_host("cuda-above-driver"), trees.SCENARIOS["cuda-above-driver"].requirements).check("cuda")
    assert check.status is Status.FAIL and "up to 12.2" in check.observed


def test_driver_below_minimum_fails(build_host):
    report = _validate(build_host(), {"minDriverVersion": "550.54.14"})
    assert report.check("driver-version").status is Status.FAIL
    assert "nvidia-driver:550-dkms" in report.check("driver-version").remedy


def test_product_and_memory_requirements(build_host):
    report = _validate(build_host(), {"gpuProducts": ["NVIDIA-L4", "A10"], "minGpuMemoryMiB": 20000})
    assert [c.id for c in report.blocking] == ["gpu-product", "gpu-memory"]
    assert _validate(build_host(), {"gpuProducts": ["tesla-t4"]}).ready


def test_open_kernel_module_banner(build_host):
    banner = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  "
              "(dvs-builder@U16-I3-B03-4-3)  Sat Aug 19 01:13:16 UTC 2023\nGCC version:  gcc version 8.5.0\n")
    report = _validate(build_host(overrides={"proc/driver/nvidia/version": banner}))
    assert report.driver_version == "535.104.05" and report.ready


def test_invalid_utf8_falls_back_then_is_unknown(build_host):
    garbage = trees.Bytes(b"\xff\xfe\x00garbage")
    fallback = _validate(build_host(overrides={"etc/os-release": garbage})).check("os")
    assert fallback.status is Status.PASS and "release 8.9" in fallback.observed
    both = _validate(build_host(overrides={"etc/os-release": garbage, "etc/redhat-release": garbage})).check("os")
    assert both.status is Status.UNKNOWN and "not UTF-8" in both.observed


def test_report_json_round_trips(build_host):
    report = _validate(build_host("selinux-boolean-off"))
    again = Report.from_dict(__import__("json").loads(report.to_json()))
    assert again.ready is False and [c.id for c in again.blocking] == ["selinux"]
    assert again.checks == report.checks


def test_text_rendering_shows_remedy_for_failures_only(build_host):
    text = render_text(_validate(build_host("selinux-boolean-off")))
    assert "NOT READY" in text and "fix: setsebool -P container_use_devices on" in text
    assert text.count("fix:") == 1
