"""Sample host-root trees for the node validator, built from one healthy base plus overrides.

The base is a RHEL 8.9 AWS g4dn node (Tesla T4) with the NVIDIA 535.104.05 driver from the CUDA
repo's DKMS module stream, CRI-O with nvidia-ctk's drop-in and a CDI spec. File contents follow
the real formats (os-release, /proc/modules, NVRM banner, efivars, selinuxfs, TOML, CDI YAML).
`NVIDIA_SMI_T4` is `nvidia-smi -q -x` of that node's GPU. The unit tests validate these trees;
`rankops dev demo` and the e2e suite run the validator on simulated nodes against them.

    python -m rankops_dev.sample_hosts SCENARIO DEST    # write one tree
"""
from __future__ import annotations

import os
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

KERNEL = "4.18.0-513.5.1.el8_9.x86_64"
DRIVER = "535.104.05"
NVIDIA_SMI_T4 = Path(__file__).resolve().parent / "nvidia-smi-t4-535.xml"  # package data
# The same GPU after `nvidia-smi -pm 0`; `-lgc 1590,1590` (idle, yet at 1590 MHz); `-ac 5001,1590`;
# two Triton processes time-slicing it; and the two as MPS clients (Exclusive_Process).
NVIDIA_SMI_T4_PERSISTENCE_OFF = NVIDIA_SMI_T4.with_name("nvidia-smi-t4-535-persistence-off.xml")
NVIDIA_SMI_T4_CLOCKS_LOCKED = NVIDIA_SMI_T4.with_name("nvidia-smi-t4-535-clocks-locked.xml")
NVIDIA_SMI_T4_APPLICATIONS_MAX = NVIDIA_SMI_T4.with_name("nvidia-smi-t4-535-applications-max.xml")
NVIDIA_SMI_T4_SHARED = NVIDIA_SMI_T4.with_name("nvidia-smi-t4-535-shared.xml")
NVIDIA_SMI_T4_MPS = NVIDIA_SMI_T4.with_name("nvidia-smi-t4-535-mps.xml")


class Dir:
    """A directory where the base may have a file (how a tree makes a file unreadable: the tests
    run as root, so chmod 000 would not stop the read)."""


@dataclass(frozen=True)
class Link:
    target: str


@dataclass(frozen=True)
class Bytes:
    data: bytes


EFI_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"

RHEL_OS_RELEASE = '''NAME="Red Hat Enterprise Linux"
VERSION="8.9 (Ootpa)"
ID="rhel"
ID_LIKE="fedora"
VERSION_ID="8.9"
PLATFORM_ID="platform:el8"
PRETTY_NAME="Red Hat Enterprise Linux 8.9 (Ootpa)"
ANSI_COLOR="0;31"
CPE_NAME="cpe:/o:redhat:enterprise_linux:8::baseos"
HOME_URL="https://www.redhat.com/"
DOCUMENTATION_URL="https://access.redhat.com/documentation/en-us/red_hat_enterprise_linux/8"
BUG_REPORT_URL="https://bugzilla.redhat.com/"

REDHAT_BUGZILLA_PRODUCT="Red Hat Enterprise Linux 8"
REDHAT_BUGZILLA_PRODUCT_VERSION=8.9
REDHAT_SUPPORT_PRODUCT="Red Hat Enterprise Linux"
REDHAT_SUPPORT_PRODUCT_VERSION="8.9"
'''

ROCKY_OS_RELEASE = '''NAME="Rocky Linux"
VERSION="8.9 (Green Obsidian)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="8.9"
PLATFORM_ID="platform:el8"
PRETTY_NAME="Rocky Linux 8.9 (Green Obsidian)"
ANSI_COLOR="0;32"
LOGO="fedora-logo-icon"
CPE_NAME="cpe:/o:rocky:rocky:8:GA"
HOME_URL="https://rockylinux.org/"
BUG_REPORT_URL="https://bugs.rockylinux.org/"
SUPPORT_END="2029-05-31"
ROCKY_SUPPORT_PRODUCT="Rocky-Linux-8"
ROCKY_SUPPORT_PRODUCT_VERSION="8.9"
REDHAT_SUPPORT_PRODUCT="Rocky Linux"
REDHAT_SUPPORT_PRODUCT_VERSION="8.9"
'''

UBUNTU_OS_RELEASE = '''PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=jammy
'''

COMMON_MODULES = """xt_conntrack 16384 4 - Live 0xffffffffc0d8e000
nf_nat 45056 3 xt_nat,nft_chain_nat,xt_MASQUERADE, Live 0xffffffffc0d3d000
overlay 135168 12 - Live 0xffffffffc0c9c000
xfs 1556480 2 - Live 0xffffffffc0a3c000
ena 147456 0 - Live 0xffffffffc0917000
nvme 45056 2 - Live 0xffffffffc08d9000
"""

NVIDIA_MODULES = """nvidia_drm 73728 0 - Live 0xffffffffc1224000 (POE)
nvidia_modeset 1306624 1 nvidia_drm, Live 0xffffffffc10e4000 (POE)
nvidia_uvm 1531904 0 - Live 0xffffffffc0f6b000 (POE)
nvidia 56807424 2 nvidia_modeset,nvidia_uvm, Live 0xffffffffbd200000 (POE)
drm_kms_helper 266240 1 nvidia_drm, Live 0xffffffffc0e9d000
"""

NOUVEAU_MODULES = """nouveau 2359296 0 - Live 0xffffffffc0e00000
mxm_wmi 16384 1 nouveau, Live 0xffffffffc0cf5000
video 49152 1 nouveau, Live 0xffffffffc0cd9000
ttm 114688 1 nouveau, Live 0xffffffffc0cba000
drm_kms_helper 266240 1 nouveau, Live 0xffffffffc0e9d000
"""


def nvrm_banner(version: str = DRIVER) -> str:
    return (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Sat Aug 19 01:15:15 UTC 2023\n"
            "GCC version:  gcc version 8.5.0 20210514 (Red Hat 8.5.0-20) (GCC) \n")


def driver_libraries(version: str, directory: str = "usr/lib64") -> dict:
    files: dict = {}
    for library in ("libnvidia-ml.so", "libcuda.so"):
        files[f"{directory}/{library}.{version}"] = Bytes(b"\x7fELF\x02\x01\x01")
        files[f"{directory}/{library}.1"] = Link(f"{library}.{version}")
    return files


def efi_var(value: int) -> Bytes:
    # efivarfs: 4 bytes of attributes (NV|BS|RT = 0x06 little-endian), then the variable's data.
    return Bytes(bytes([0x06, 0x00, 0x00, 0x00, value]))


BASE: dict = {
    "etc/os-release": RHEL_OS_RELEASE,
    "etc/redhat-release": "Red Hat Enterprise Linux release 8.9 (Ootpa)\n",
    "etc/modprobe.d/blacklist-nouveau.conf": "blacklist nouveau\noptions nouveau modeset=0\n",
    "etc/modprobe.d/firewalld-sysctls.conf": "install nf_conntrack /usr/sbin/modprobe --ignore-install nf_conntrack $CMDLINE_OPTS && /usr/sbin/sysctl --quiet --pattern 'net[.]netfilter[.]nf_conntrack.*' --system\n",
    "etc/ld.so.conf": "include ld.so.conf.d/*.conf\n",
    f"etc/ld.so.conf.d/kernel-{KERNEL}.conf": "# Placeholder file, no vDSO hwcap entries used in this kernel.\n",
    "etc/ld.so.conf.d/bind-export-x86_64.conf": "/usr/lib64/bind9-export/\n",
    "etc/nvidia-container-runtime/config.toml": (
        '#accept-nvidia-visible-devices-as-volume-mounts = false\n'
        'disable-require = false\n'
        'supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"\n\n'
        '[nvidia-container-cli]\nenvironment = []\nldconfig = "@/sbin/ldconfig"\nload-kmods = true\n\n'
        '[nvidia-container-runtime]\nlog-level = "info"\nmode = "auto"\nruntimes = ["docker-runc", "runc", "crun"]\n\n'
        '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["cdi.k8s.io/"]\n'
        'default-kind = "nvidia.com/gpu"\nspec-dirs = ["/etc/cdi", "/var/run/cdi"]\n'),
    "etc/crio/crio.conf": "[crio]\n\n[crio.runtime]\ndefault_runtime = \"runc\"\n",
    "etc/crio/crio.conf.d/99-nvidia.toml": (
        '\n[crio]\n\n  [crio.runtime]\n\n    [crio.runtime.runtimes]\n\n'
        '      [crio.runtime.runtimes.nvidia]\n        runtime_path = "/usr/bin/nvidia-container-runtime"\n'
        '        runtime_type = "oci"\n'),
    "etc/cdi/nvidia.yaml": (
        "---\ncdiVersion: 0.5.0\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n  - path: /dev/nvidia-uvm\n"
        "  hooks:\n  - args:\n    - nvidia-ctk\n    - hook\n    - update-ldcache\n    - --folder\n    - /usr/lib64\n"
        "    hookName: createContainer\n    path: /usr/bin/nvidia-ctk\n"
        "devices:\n- containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n  name: \"0\"\n"
        "- containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n  name: all\nkind: nvidia.com/gpu\n"),
    "proc/cmdline": (f"BOOT_IMAGE=(hd0,gpt2)/boot/vmlinuz-{KERNEL} root=UUID=d35fe619-1d06-4ace-9fe3-169baad3e421 "
                     "ro console=ttyS0,115200n8 console=tty0 net.ifnames=0 rd.blacklist=nouveau nvme_core.io_timeout=4294967295 "
                     "crashkernel=auto rd.driver.blacklist=nouveau nouveau.modeset=0\n"),
    "proc/modules": NVIDIA_MODULES + COMMON_MODULES,
    "proc/driver/nvidia/version": nvrm_banner(),
    "proc/driver/nvidia/gpus/0000:00:1e.0/information": (
        "Model: \t\t Tesla T4\nIRQ:   \t\t 35\nGPU UUID: \t GPU-9a7d6a2a-9d05-4a2f-5e3c-0f4e4c6d5b21\n"
        "Video BIOS: \t 90.04.96.00.02\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n"
        "Bus Location: \t 0000:00:1e.0\nDevice Minor: \t 0\nGPU Firmware: \t N/A\nGPU Excluded:\t No\n"),
    "proc/sys/kernel/osrelease": f"{KERNEL}\n",
    "lib": Link("usr/lib"),
    "lib64": Link("usr/lib64"),
    "var/run": Link("../run"),
    f"usr/lib/modules/{KERNEL}/extra/nvidia.ko.xz": Bytes(b"\xfd7zXZ\x00"),
    f"usr/lib/modules/{KERNEL}/kernel/fs/xfs/xfs.ko.xz": Bytes(b"\xfd7zXZ\x00"),
    f"usr/lib/modules/{KERNEL}/build": Link(f"/usr/src/kernels/{KERNEL}"),
    f"usr/src/kernels/{KERNEL}/Makefile": "VERSION = 4\n",
    f"var/lib/dkms/nvidia/{DRIVER}/{KERNEL}/x86_64/module/nvidia.ko.xz": Bytes(b"\xfd7zXZ\x00"),
    f"var/lib/dkms/nvidia/{DRIVER}/{KERNEL}/x86_64/log/make.log": "DKMS make.log for nvidia-535.104.05\n",
    f"var/lib/dkms/nvidia/{DRIVER}/source": Link(f"/usr/src/nvidia-{DRIVER}"),
    f"var/lib/dkms/nvidia/kernel-{KERNEL}-x86_64": Link(f"{DRIVER}/{KERNEL}/x86_64"),
    **driver_libraries(DRIVER),
    "usr/bin/nvidia-container-runtime": Bytes(b"\x7fELF"),
    f"sys/firmware/efi/efivars/SecureBoot-{EFI_GUID}": efi_var(0),
    f"sys/firmware/efi/efivars/BootCurrent-{EFI_GUID}": Bytes(bytes([0x06, 0, 0, 0, 0x01, 0x00])),
    "sys/module/nvidia/taint": "PO\n",
    "sys/fs/selinux/enforce": "1",
    "sys/fs/selinux/booleans/container_use_devices": "1 1",
    "sys/fs/selinux/booleans/virt_use_nfs": "0 0",
    "run/cdi/.keep": "",
}


# ---------------------------------------------------------------- latency layouts (validator.latency)
# A two-socket server cut down to 4 CPUs: cpu0-1 on NUMA node 0 (with the GPU), cpu2-3 on node 1.
# sysfs as the kernel documents it: admin-guide/pm/cpufreq.rst (cpuN/cpufreq/scaling_governor,
# scaling_driver), intel_pstate.rst (intel_pstate/status), cpuidle.rst (cpuN/cpuidle/stateM/name,
# desc, latency, residency, disable); /sys/bus/pci/devices/<address> is a link into /sys/devices.
INTEL_IDLE_STATES = (("POLL", "CPUIDLE CORE POLL IDLE", 0, 0), ("C1", "MWAIT 0x00", 2, 2),
                     ("C1E", "MWAIT 0x01", 10, 20), ("C6", "MWAIT 0x20", 170, 600))
ACPI_IDLE_STATES = (("POLL", "CPUIDLE CORE POLL IDLE", 0, 0), ("C1", "ACPI FFH MWAIT 0x0", 1, 2))
NUMA_CPUS = {0: (0, 1), 1: (2, 3)}
GPU_PCI = "0000:00:1e.0"


def cpu_tree(governor: str | None, driver: str = "intel_pstate", pstate_status: str | None = "active",
             idle_driver: str = "intel_idle", idle_states=INTEL_IDLE_STATES, disabled: tuple[str, ...] = (),
             gpu_numa_node: int = 0) -> dict:
    files: dict = {"sys/devices/system/cpu/cpuidle/current_driver": f"{idle_driver}\n",
                   "sys/devices/system/cpu/online": "0-3\n"}
    if pstate_status:
        files["sys/devices/system/cpu/intel_pstate/status"] = f"{pstate_status}\n"
    for node, cpus in NUMA_CPUS.items():
        files[f"sys/devices/system/node/node{node}/cpulist"] = f"{cpus[0]}-{cpus[-1]}\n"
        for cpu in cpus:
            base = f"sys/devices/system/cpu/cpu{cpu}"
            files[f"{base}/topology/physical_package_id"] = f"{node}\n"
            if governor:
                files[f"{base}/cpufreq/scaling_governor"] = f"{governor}\n"
                files[f"{base}/cpufreq/scaling_driver"] = f"{driver}\n"
            for index, (name, desc, latency, residency) in enumerate(idle_states):
                state = f"{base}/cpuidle/state{index}"
                files.update({f"{state}/name": f"{name}\n", f"{state}/desc": f"{desc}\n",
                              f"{state}/latency": f"{latency}\n", f"{state}/residency": f"{residency}\n",
                              f"{state}/disable": "1\n" if name in disabled else "0\n"})
    device = f"sys/devices/pci0000:00/{GPU_PCI}"
    files[f"{device}/numa_node"] = f"{gpu_numa_node}\n"
    files[f"{device}/vendor"] = "0x10de\n"
    files[f"sys/bus/pci/devices/{GPU_PCI}"] = Link(f"../../../devices/pci0000:00/{GPU_PCI}")
    return files


def kubelet_yaml(cpu_policy: str | None, topology_policy: str | None) -> str:
    """/var/lib/kubelet/config.yaml as kubeadm writes it (KubeletConfiguration v1beta1)."""
    lines = ["apiVersion: kubelet.config.k8s.io/v1beta1", "kind: KubeletConfiguration",
             "authentication:", "  anonymous:", "    enabled: false", "  webhook:", "    enabled: true",
             "  x509:", "    clientCAFile: /etc/kubernetes/pki/ca.crt", "authorization:", "  mode: Webhook",
             "cgroupDriver: systemd", "clusterDNS:", "- 10.96.0.10", "clusterDomain: cluster.local",
             "containerRuntimeEndpoint: unix:///var/run/crio/crio.sock"]
    if cpu_policy:
        lines += [f"cpuManagerPolicy: {cpu_policy}", "reservedSystemCPUs: \"0\""]
    if topology_policy:
        lines += [f"topologyManagerPolicy: {topology_policy}", "topologyManagerScope: container"]
    return "\n".join(lines + ["rotateCertificates: true", "staticPodPath: /etc/kubernetes/manifests", ""])


# OpenShift's machine-config operator writes the kubelet's config as JSON; a PerformanceProfile's
# KubeletConfig sets the CPU, topology and memory managers.
OPENSHIFT_KUBELET_CONF = (
    '{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","staticPodPath":'
    '"/etc/kubernetes/manifests","syncFrequency":"0s","authentication":{"x509":{"clientCAFile":'
    '"/etc/kubernetes/kubelet-ca.crt"},"webhook":{"cacheTTL":"0s"},"anonymous":{"enabled":false}},'
    '"cgroupDriver":"systemd","cpuManagerPolicy":"static","cpuManagerReconcilePeriod":"5s",'
    '"memoryManagerPolicy":"Static","topologyManagerPolicy":"single-numa-node","reservedSystemCPUs":"0",'
    '"reservedMemory":[{"numaNode":0,"limits":{"memory":"1100Mi"}}],"systemReserved":{"memory":"500Mi"},'
    '"kubeReserved":{"memory":"500Mi"},"containerRuntimeEndpoint":"/var/run/crio/crio.sock"}\n')

def process(pid: int, argv: tuple[str, ...], comm: str | None = None) -> dict:
    """/proc/PID/comm as the kernel keeps it (the program's name cut to 15 characters; an interpreter's
    own name for a script it runs) and /proc/PID/cmdline (NUL-separated, NUL-terminated)."""
    name = comm or argv[0].rsplit("/", 1)[-1]
    return {f"proc/{pid}/comm": f"{name[:15]}\n", f"proc/{pid}/cmdline": Bytes("\0".join(argv).encode() + b"\0")}


def cpu_dma_latency(microseconds: int) -> Bytes:
    """/dev/cpu_dma_latency read back: the PM QoS limit now in force, a little-endian int32 in µs."""
    return Bytes(struct.pack("<i", microseconds))


PM_QOS_NO_REQUEST = 2_000_000_000  # PM_QOS_CPU_LATENCY_DEFAULT_VALUE
# What runs on every node: systemd, a kernel thread (empty cmdline), sshd, the kubelet.
HOST_PROCESSES = {
    **process(1, ("/usr/lib/systemd/systemd", "--switched-root", "--system", "--deserialize", "17")),
    "proc/2/comm": "kthreadd\n", "proc/2/cmdline": Bytes(b""),
    **process(1043, ("/usr/sbin/sshd", "-D")),
    **process(1502, ("/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml",
                     "--container-runtime-endpoint=unix:///var/run/crio/crio.sock")),
}
# RHEL 8's tuned.service: ExecStart=/usr/sbin/tuned -l -P, a Python script, so comm is the script's name.
TUNED_PROCESS = process(1187, ("/usr/libexec/platform-python", "-Es", "/usr/sbin/tuned", "-l", "-P"), comm="tuned")
THP_ALWAYS = "[always] madvise never\n"  # RHEL 8's default

TUNED_LATENCY = {
    **cpu_tree("performance"),
    **HOST_PROCESSES,
    **TUNED_PROCESS,
    # latency-performance's force_latency=cstate.id_no_zero:1|3: C1's exit latency, 2 µs
    "dev/cpu_dma_latency": cpu_dma_latency(2),
    "sys/kernel/mm/transparent_hugepage/enabled": THP_ALWAYS,
    "etc/tuned/active_profile": "latency-performance\n",
    "etc/tuned/profile_mode": "manual\n",
    "proc/sys/vm/overcommit_memory": "1\n",
    "var/lib/kubelet/config.yaml": kubelet_yaml("static", "single-numa-node"),
}
# RHEL 8's defaults on a server nobody tuned: intel_pstate's powersave, every C-state, balanced.
UNTUNED = {
    **cpu_tree("powersave"),
    **HOST_PROCESSES,
    **TUNED_PROCESS,
    "dev/cpu_dma_latency": cpu_dma_latency(PM_QOS_NO_REQUEST),
    "sys/kernel/mm/transparent_hugepage/enabled": THP_ALWAYS,
    "etc/tuned/active_profile": "balanced\n",
    "etc/tuned/profile_mode": "auto\n",
    "proc/sys/vm/overcommit_memory": "0\n",
    "var/lib/kubelet/config.yaml": kubelet_yaml(None, None),
}
# A PerformanceProfile (Node Tuning Operator): workloadHints.highPowerConsumption puts
# processor.max_cstate=1 intel_idle.max_cstate=0 on the command line; intel_pstate=disable leaves
# acpi-cpufreq, whose governor tuned sets to performance.
OPENSHIFT_CMDLINE = (f"BOOT_IMAGE=(hd0,gpt3)/ostree/rhcos-4.14/vmlinuz-{KERNEL} ignition.platform.id=metal "
                     "ostree=/ostree/boot.1/rhcos/0 root=UUID=4d3c1b35 rw rootflags=prjquota boot=UUID=8b2c5d1a "
                     "skew_tick=1 tsc=reliable rcupdate.rcu_normal_after_boot=1 nohz=on rcu_nocbs=2-3 "
                     "tuned.non_isolcpus=00000003 systemd.cpu_affinity=0,1 intel_iommu=on iommu=pt isolcpus=managed_irq,2-3 "
                     "intel_pstate=disable nosoftlockup processor.max_cstate=1 intel_idle.max_cstate=0 "
                     "rd.driver.blacklist=nouveau\n")
OPENSHIFT_TUNED = {
    **cpu_tree("performance", driver="acpi-cpufreq", pstate_status=None, idle_driver="acpi_idle",
               idle_states=ACPI_IDLE_STATES),
    **HOST_PROCESSES,
    # the Node Tuning Operator's TuneD runs in its pod (host PID namespace) as tuned --no-dbus
    **process(3310, ("/usr/libexec/platform-python", "-I", "/usr/sbin/tuned", "--no-dbus"), comm="tuned"),
    "dev/cpu_dma_latency": cpu_dma_latency(1),  # C1's exit latency on acpi_idle
    "sys/kernel/mm/transparent_hugepage/enabled": "always madvise [never]\n",
    "etc/tuned/active_profile": "openshift-node-performance-rankops-t4\n",
    "etc/tuned/profile_mode": "manual\n",
    "proc/sys/vm/overcommit_memory": "1\n",
    "proc/cmdline": OPENSHIFT_CMDLINE,
    "etc/kubernetes/kubelet.conf": OPENSHIFT_KUBELET_CONF,
}


@dataclass(frozen=True)
class Scenario:
    description: str
    overrides: dict = field(default_factory=dict)
    requirements: dict = field(default_factory=dict)
    ready: bool = True
    blocking: tuple[str, ...] = ()  # the required checks expected to fail or be unknown
    nvidia_smi: bool = True  # False where nvidia-smi fails: no nvidia module loaded, or NVML mismatch
    gpu_xml: Path = NVIDIA_SMI_T4  # what `nvidia-smi -q -x` says there
    # The node labels rankops.io/latency-tuned and rankops.io/topology-aligned the report makes
    latency_tuned: str | None = "false"
    topology_aligned: str | None = "unknown"


T4_REQUIREMENTS = {"minDriverVersion": "535.104.05", "cudaVersion": "12.2", "gpuProducts": ["Tesla-T4"],
                   "minGpuMemoryMiB": 15000}
LATENCY_REQUIRE = {**T4_REQUIREMENTS, "latencyTuning": "require"}
# Each latency check that fails on UNTUNED, in the order the report lists them.
UNTUNED_BLOCKING = ("cpu-frequency", "cpu-idle", "tuned", "gpu-persistence", "gpu-clocks", "topology")

SCENARIOS: dict[str, Scenario] = {
    "healthy-rhel89": Scenario("RHEL 8.9, driver 535.104.05, T4, CRI-O + CDI", requirements=T4_REQUIREMENTS),
    "rocky8": Scenario("Rocky Linux 8.9, otherwise healthy", {
        "etc/os-release": ROCKY_OS_RELEASE,
        "etc/redhat-release": "Rocky Linux release 8.9 (Green Obsidian)\n",
    }, requirements=T4_REQUIREMENTS),
    "nouveau-loaded": Scenario("fresh install: nouveau bound to the GPU, no nvidia driver", {
        "proc/modules": NOUVEAU_MODULES + COMMON_MODULES,
        "proc/driver/nvidia": None,
        "sys/module/nvidia": None,
        "etc/modprobe.d/blacklist-nouveau.conf": None,
        "proc/cmdline": f"BOOT_IMAGE=(hd0,gpt2)/boot/vmlinuz-{KERNEL} root=UUID=d35fe619 ro console=ttyS0,115200n8\n",
    }, ready=False, blocking=("nouveau", "nvidia-module", "nvml"), nvidia_smi=False,
        latency_tuned="unknown"),
    "driver-mismatch": Scenario("dnf update replaced the libraries with 535.129.03; the old module is still loaded", {
        **{path: None for path in driver_libraries(DRIVER)},
        **driver_libraries("535.129.03"),
    }, ready=False, blocking=("nvml",), nvidia_smi=False,
        latency_tuned="unknown"),
    "secureboot-unsigned": Scenario("Secure Boot on, DKMS-built module unsigned (taint E)", {
        f"sys/firmware/efi/efivars/SecureBoot-{EFI_GUID}": efi_var(1),
        "sys/module/nvidia/taint": "POE\n",
    }, ready=False, blocking=("secure-boot",)),
    "selinux-boolean-off": Scenario("SELinux enforcing, container_use_devices off", {
        "sys/fs/selinux/booleans/container_use_devices": "0 0",
    }, ready=False, blocking=("selinux",)),
    "no-toolkit": Scenario("no NVIDIA container toolkit, no CDI spec", {
        "etc/nvidia-container-runtime": None,
        "etc/crio/crio.conf.d/99-nvidia.toml": None,
        "etc/cdi/nvidia.yaml": None,
        "usr/bin/nvidia-container-runtime": None,
    }, ready=False, blocking=("container-toolkit",)),
    "cuda-above-driver": Scenario("models need CUDA 12.4; driver 535 supports 12.2",
                                  requirements={**T4_REQUIREMENTS, "cudaVersion": "12.4"},
                                  ready=False, blocking=("cuda",)),
    "kernel-updated": Scenario("rebooted into 8.10's kernel; DKMS built nvidia only for the old one", {
        "proc/sys/kernel/osrelease": "4.18.0-553.el8_10.x86_64\n",
        "proc/modules": COMMON_MODULES,
        "proc/driver/nvidia": None,
        "sys/module/nvidia": None,
        "usr/lib/modules/4.18.0-553.el8_10.x86_64/kernel/fs/xfs/xfs.ko.xz": Bytes(b"\xfd7zXZ\x00"),
    }, ready=False, blocking=("nvidia-module", "nvml", "dkms"), nvidia_smi=False,
        latency_tuned="unknown"),
    "libraries-unlisted": Scenario("driver libraries in /usr/lib64/nvidia, which ld.so.conf does not list", {
        **{path: None for path in driver_libraries(DRIVER)},
        **driver_libraries(DRIVER, "usr/lib64/nvidia"),
    }, ready=False, blocking=("libraries",)),
    "ubuntu": Scenario("Ubuntu 22.04 node selected by mistake", {
        "etc/os-release": UBUNTU_OS_RELEASE,
        "etc/redhat-release": None,
    }, ready=False, blocking=("os",)),
    "unreadable": Scenario("files the checks need are directories, so reading them fails", {
        "etc/os-release": Dir(),
        "etc/redhat-release": Dir(),
        "proc/modules": Dir(),
        "proc/driver/nvidia/version": Dir(),
        "sys/fs/selinux/enforce": Dir(),
    }, ready=False, blocking=("os", "nouveau", "nvidia-module", "nvml", "selinux")),
    "empty": Scenario("files present but empty", {
        "etc/os-release": "",
        "etc/redhat-release": "",
        "proc/modules": "",
        "proc/driver/nvidia/version": "",
        "proc/sys/kernel/osrelease": "",
        "sys/fs/selinux/enforce": "",
    }, ready=False, blocking=("os", "nouveau", "nvidia-module", "nvml", "dkms", "selinux")),
    # latency layouts: requirements.latencyTuning require (warn where named so)
    "latency-tuned": Scenario("tuned latency-performance (deep C-states held off by force_latency), governor "
                              "performance, overcommit 1, GPU clocks locked (-lgc), kubelet static + single-numa-node",
                              TUNED_LATENCY, LATENCY_REQUIRE, gpu_xml=NVIDIA_SMI_T4_CLOCKS_LOCKED,
                              latency_tuned="true", topology_aligned="true"),
    "latency-untuned": Scenario("RHEL 8 defaults: powersave, every C-state, tuned balanced, overcommit 0, persistence "
                                "off, default clocks, kubelet without CPU or topology manager",
                                UNTUNED, LATENCY_REQUIRE, ready=False, blocking=UNTUNED_BLOCKING,
                                gpu_xml=NVIDIA_SMI_T4_PERSISTENCE_OFF, topology_aligned="false"),
    "latency-untuned-warn": Scenario("the untuned node in a pool with latencyTuning: warn (advisory: still ready)",
                                     UNTUNED, {**T4_REQUIREMENTS, "latencyTuning": "warn"},
                                     gpu_xml=NVIDIA_SMI_T4_PERSISTENCE_OFF, topology_aligned="false"),
    "latency-off": Scenario("the untuned node in a pool with latencyTuning: off (no latency checks, no labels)",
                            UNTUNED, {**T4_REQUIREMENTS, "latencyTuning": "off"},
                            gpu_xml=NVIDIA_SMI_T4_PERSISTENCE_OFF, latency_tuned=None, topology_aligned=None),
    "openshift-performance-profile": Scenario(
        "OpenShift node tuned by a PerformanceProfile: openshift-node-performance-*, max_cstate on the command "
        "line, acpi-cpufreq at performance, kubelet.conf (JSON) static + single-numa-node, -ac at the max",
        OPENSHIFT_TUNED, LATENCY_REQUIRE, gpu_xml=NVIDIA_SMI_T4_APPLICATIONS_MAX,
        latency_tuned="true", topology_aligned="true"),
    "gpu-time-sliced": Scenario("tuned node whose GPU two Triton processes time-slice, no MPS", TUNED_LATENCY,
                                LATENCY_REQUIRE, ready=False, blocking=("gpu-sharing",),
                                gpu_xml=NVIDIA_SMI_T4_SHARED, topology_aligned="true"),
    "gpu-mps": Scenario("tuned node whose GPU two Triton processes share through MPS (control daemon running)", {
        **TUNED_LATENCY,
        **process(48100, ("nvidia-cuda-mps-control", "-d")),  # comm: nvidia-cuda-mps (cut at 15)
        **process(48102, ("nvidia-cuda-mps-server",)),
    }, LATENCY_REQUIRE, gpu_xml=NVIDIA_SMI_T4_MPS, latency_tuned="true", topology_aligned="true"),
    "latency-unreadable": Scenario("tuned GPU, but no tuned, no /proc processes, no cpufreq/cpuidle sysfs, no "
                                   "kubelet config, and overcommit_memory unreadable: unknown, which require does "
                                   "not accept (overcommit is advisory)", {
        "proc/sys/vm/overcommit_memory": Dir(),
    }, LATENCY_REQUIRE, ready=False, blocking=("cpu-frequency", "cpu-idle", "tuned", "topology"),
        gpu_xml=NVIDIA_SMI_T4_CLOCKS_LOCKED, latency_tuned="unknown"),
}


def nvidia_smi_xml(scenario: str) -> Path | None:
    """The `nvidia-smi -q -x` output of the scenario's GPU, or None where nvidia-smi would fail."""
    return SCENARIOS[scenario].gpu_xml if SCENARIOS[scenario].nvidia_smi else None


def write_entry(root: Path, relative: str, content) -> None:
    """Put `content` (text, Bytes, Link, Dir; None removes) at `relative`, replacing what is there."""
    path = root / relative
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if content is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Dir):
        path.mkdir()
    elif isinstance(content, Link):
        os.symlink(content.target, path)
    elif isinstance(content, Bytes):
        path.write_bytes(content.data)
    else:
        path.write_text(content)


def build(scenario: str, dest: str | os.PathLike[str]) -> Path:
    """Write the base tree with `scenario`'s overrides under `dest`; returns the root. An unknown
    scenario is a KeyError naming the known ones."""
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown host scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    for relative, content in BASE.items():
        write_entry(root, relative, content)
    for relative, content in SCENARIOS[scenario].overrides.items():
        write_entry(root, relative, content)
    return root


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SCENARIOS:
        print(f"usage: python -m rankops_dev.sample_hosts SCENARIO DEST\nscenarios: {', '.join(SCENARIOS)}", file=sys.stderr)
        sys.exit(2)
    print(build(sys.argv[1], sys.argv[2]))
