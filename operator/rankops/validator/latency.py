"""Latency checks: where a GPU ranking service's P99 jitter starts on a RHEL 8 node.

The field guide (seed 2, sections 5.2 and 6.5) names the causes of a low mean and a bad P99: CPU
frequency scaling and deep C-states, Triton away from its GPU's NUMA node, vm.overcommit_memory,
GPU clocks that move, and processes sharing a GPU. Each check reads the host tree (sysfs, procfs,
/etc, the kubelet's config file) or the GPU facts and, like the driver checks, never raises: what
it cannot read is `unknown`.

The pool's `requirements.latencyTuning` says how much they weigh: `off` skips them, `warn` reports
a node that is not tuned as a warning (advisory), `require` fails it (the node is not ready).
"""
from __future__ import annotations

import re
from typing import Callable

import yaml

from rankops.api.gpunodepool import LatencyTuning, NodeRequirements
from rankops.validator.checks import CheckResult, Status, _unknown
from rankops.validator.gpu import GpuFacts
from rankops.validator.host import HostView, Read

CPU_DIR = "/sys/devices/system/cpu"
# An idle state whose exit latency is above this (µs) is "deep": C1E and C6 on Intel servers (10
# and 85-290 µs in intel_idle's tables), C2 on AMD; POLL and C1 (1-2 µs) are not.
DEEP_EXIT_LATENCY_US = 5
# tuned profiles that keep CPUs at full frequency and out of deep C-states (force_latency, PM QoS);
# OpenShift's Node Tuning Operator names a PerformanceProfile's tuned profile
# openshift-node-performance-<profile name>.
LATENCY_PROFILES = ("latency-performance", "network-latency", "cpu-partitioning", "realtime",
                    "realtime-virtual-host", "realtime-virtual-guest")
PERFORMANCE_PROFILE_PREFIX = "openshift-node-performance-"
# kubeadm writes the first, OpenShift's machine-config operator the second; k3s/RKE2 pass flags.
KUBELET_CONFIGS = ("/var/lib/kubelet/config.yaml", "/etc/kubernetes/kubelet.conf",
                   "/etc/kubernetes/kubelet/config.yaml", "/etc/kubernetes/kubelet-config.yaml")
ALIGNING_TOPOLOGY_POLICIES = ("single-numa-node", "restricted")
MPS_CONTROL = "nvidia-cuda-mps-control"

# Which checks each node label summarises (validator.node).
LATENCY_TUNED_CHECKS = ("cpu-frequency", "cpu-idle", "tuned", "overcommit-memory", "gpu-persistence",
                        "gpu-clocks", "gpu-sharing")
TOPOLOGY_ALIGNED_CHECKS = ("topology",)


def _result(check_id: str, tuned: bool, observed: str, expected: str, remedy: str,
            req: NodeRequirements) -> CheckResult:
    """PASS when tuned; otherwise FAIL under `require`, WARN under `warn` (advisory)."""
    required = req.latency_tuning is LatencyTuning.require
    if tuned:
        return CheckResult(check_id, Status.PASS, observed, expected, "", required)
    return CheckResult(check_id, Status.FAIL if required else Status.WARN, observed, expected, remedy, required)


def _required(req: NodeRequirements) -> bool:
    return req.latency_tuning is LatencyTuning.require


def label_value(results: list[CheckResult] | tuple[CheckResult, ...], ids: tuple[str, ...]) -> str | None:
    """'true' when every one of `ids` passed, 'false' when one is not tuned (warn or fail),
    'unknown' when one could not be judged; None (no label) when none of them ran."""
    chosen = [r for r in results if r.id in ids]
    if not chosen:
        return None
    if any(r.status in (Status.FAIL, Status.WARN) for r in chosen):
        return "false"
    if any(r.status is Status.UNKNOWN for r in chosen):
        return "unknown"
    return "true"


def cpu_ids(host: HostView) -> list[str]:
    """cpu0, cpu1, ... as sysfs lists them (not cpufreq, cpuidle, ...)."""
    return sorted((p.rsplit("/", 1)[-1] for p in host.glob(CPU_DIR, "cpu[0-9]*")),
                  key=lambda name: int(name[3:]))


def _cmdline(host: HostView) -> dict[str, str]:
    text = host.read_text("/proc/cmdline")
    params: dict[str, str] = {}
    for word in (text.value or "").split() if text.ok else []:
        key, _, value = word.partition("=")
        params[key] = value
    return params


def _counted(values: dict[str, list[str]]) -> str:
    return ", ".join(f"{value} on {len(cpus)} CPU{'s' if len(cpus) > 1 else ''}" for value, cpus in
                     sorted(values.items(), key=lambda item: -len(item[1])))


# ---------------------------------------------------------------- CPU

def check_cpu_frequency(host: HostView, req: NodeRequirements) -> CheckResult:
    """The cpufreq governor of every CPU (kernel admin-guide/pm/cpufreq.rst: scaling_governor;
    intel_pstate.rst: its `status` active/passive/off)."""
    expected = "cpufreq governor performance on every CPU"
    remedy = ("tuned-adm profile latency-performance (its [cpu] plugin sets governor=performance and "
              "energy_perf_bias=performance); or cpupower frequency-set -g performance. In the BIOS choose the "
              "Performance power profile (or OS-controlled P-states).")
    cpus = cpu_ids(host)
    if not cpus:
        return _unknown("cpu-frequency", f"{CPU_DIR}: no cpuN entries", expected, _required(req))
    governors: dict[str, list[str]] = {}
    unreadable = []
    for cpu in cpus:
        governor = host.read_text(f"{CPU_DIR}/{cpu}/cpufreq/scaling_governor")
        if governor.ok:
            governors.setdefault(governor.value.strip(), []).append(cpu)
        else:
            unreadable.append(governor.reason)
    driver = next((d.value.strip() for d in (host.read_text(f"{CPU_DIR}/{cpus[0]}/cpufreq/scaling_driver"),)
                   if d.ok), None)
    pstate = next((f"{name} {s.value.strip()}" for name in ("intel_pstate", "amd_pstate")
                   for s in (host.read_text(f"{CPU_DIR}/{name}/status"),) if s.ok), None)
    if not governors:
        why = (f"{pstate}: the driver exposes no governor" if pstate else
               "no cpufreq driver: frequency is the firmware's or the hypervisor's (BIOS power profile, "
               "or the cloud instance)")
        return _unknown("cpu-frequency", f"{why} ({unreadable[0]})", expected, _required(req),
                        "Set the BIOS power profile to Performance; on a VM the host decides. "
                        "If the node should have cpufreq, check: cpupower frequency-info")
    where = f" ({', '.join(x for x in (driver, pstate) if x)})" if driver or pstate else ""
    observed = f"governor {_counted(governors)}{where}"
    if unreadable:
        observed += f"; {len(unreadable)} CPUs unreadable ({unreadable[0]})"
        return _unknown("cpu-frequency", observed, expected, _required(req), remedy)
    return _result("cpu-frequency", set(governors) == {"performance"}, observed, expected, remedy, req)


def _max_cstate_limit(params: dict[str, str]) -> str | None:
    """The kernel command line's C-state limit, if it keeps CPUs at C1 or shallower."""
    if params.get("idle") == "poll":
        return "idle=poll"
    for key in ("intel_idle.max_cstate", "processor.max_cstate"):
        value = params.get(key)
        if value is not None and value.isdigit() and int(value) <= 1:
            return f"{key}={value}"
    return None


def check_cpu_idle(host: HostView, req: NodeRequirements) -> CheckResult:
    """Deep idle states enabled (admin-guide/pm/cpuidle.rst: cpuN/cpuidle/stateM/{name,latency,disable})."""
    expected = f"no idle state deeper than C1 (exit latency > {DEEP_EXIT_LATENCY_US} µs) enabled"
    remedy = ("tuned-adm profile latency-performance (force_latency keeps CPUs in C1 through PM QoS); or "
              "grubby --update-kernel=ALL --args='intel_idle.max_cstate=1 processor.max_cstate=1' && "
              "systemctl reboot; and disable C-states (C6, C1E) in the BIOS.")
    params = _cmdline(host)
    limit = _max_cstate_limit(params)
    cpus = cpu_ids(host)
    deep: dict[str, list[str]] = {}
    seen_states = False
    for cpu in cpus:
        for state in host.glob(f"{CPU_DIR}/{cpu}/cpuidle", "state[0-9]*"):
            name, latency, disable = (host.read_text(f"{state}/{f}") for f in ("name", "latency", "disable"))
            if not (name.ok and latency.ok and latency.value.strip().isdigit()):
                continue
            seen_states = True
            if int(latency.value) > DEEP_EXIT_LATENCY_US and not (disable.ok and disable.value.strip() == "1"):
                deep.setdefault(f"{name.value.strip()} ({latency.value.strip()} µs)", []).append(cpu)
    driver = host.read_text(f"{CPU_DIR}/cpuidle/current_driver")
    driver_name = driver.value.strip() if driver.ok else None
    if limit and not deep:
        return _result("cpu-idle", True, f"limited by {limit} on the kernel command line", expected, remedy, req)
    if seen_states and not deep:
        return _result("cpu-idle", True, f"no deep state enabled ({driver_name or 'cpuidle'})", expected, remedy, req)
    if deep:
        profile = active_tuned_profile(host)
        if profile.ok and is_latency_profile(profile.value):
            # tuned's force_latency holds a PM QoS request: the governor skips states slower than it,
            # though sysfs still lists them enabled.
            return _result("cpu-idle", True, f"deep states {_counted(deep)} enabled, held off by tuned's "
                           f"{profile.value} (force_latency)", expected, remedy, req)
        return _result("cpu-idle", False, f"deep states enabled: {_counted(deep)}" +
                       (f" ({driver_name})" if driver_name else ""), expected, remedy, req)
    if driver_name == "none":
        return _unknown("cpu-idle", "no cpuidle driver: the CPUs idle as the firmware decides", expected,
                        _required(req), "Disable C-states in the BIOS, or boot with intel_idle.max_cstate=1.")
    reason = driver.reason if not driver.ok else f"{CPU_DIR}/cpu*/cpuidle: no states"
    return _unknown("cpu-idle", reason, expected, _required(req))


# ---------------------------------------------------------------- tuned, sysctl

def active_tuned_profile(host: HostView) -> Read[str]:
    """tuned's active profile(s), space-separated as tuned writes them; '' when tuned is off."""
    text = host.read_text("/etc/tuned/active_profile", allow_empty=True)
    return Read(text.value.strip()) if text.ok else text


def is_latency_profile(profiles: str) -> bool:
    return any(p in LATENCY_PROFILES or p.startswith(PERFORMANCE_PROFILE_PREFIX) for p in profiles.split())


def check_tuned(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = (f"tuned profile {', '.join(LATENCY_PROFILES[:3])} or a PerformanceProfile's "
                f"{PERFORMANCE_PROFILE_PREFIX}<name>")
    remedy = ("dnf install -y tuned && systemctl enable --now tuned && tuned-adm profile latency-performance "
              "(on OpenShift: a PerformanceProfile for the node's MachineConfigPool, applied by the Node Tuning "
              "Operator)")
    profile = active_tuned_profile(host)
    if not profile.ok:
        return _unknown("tuned", f"{profile.reason} (tuned not installed, or never started)", expected,
                        _required(req), remedy)
    if not profile.value:
        return _result("tuned", False, "no active profile (tuned-adm off)", expected, remedy, req)
    return _result("tuned", is_latency_profile(profile.value), f"active profile {profile.value}",
                   expected, remedy, req)


def check_overcommit_memory(host: HostView, req: NodeRequirements) -> CheckResult:
    # Field guide 5.2: vm.overcommit_memory=1 so bursts of concurrent requests do not fail to allocate.
    expected = "vm.overcommit_memory = 1"
    remedy = ("echo 'vm.overcommit_memory = 1' > /etc/sysctl.d/90-rankops.conf && "
              "sysctl -p /etc/sysctl.d/90-rankops.conf")
    text = host.read_text("/proc/sys/vm/overcommit_memory")
    if not text.ok:
        return _unknown("overcommit-memory", text.reason, expected, _required(req))
    value = text.value.strip()
    meaning = {"0": "heuristic", "1": "always", "2": "never (strict accounting)"}.get(value)
    if meaning is None:
        return _unknown("overcommit-memory", f"/proc/sys/vm/overcommit_memory: {value!r}", expected, _required(req))
    return _result("overcommit-memory", value == "1", f"vm.overcommit_memory = {value} ({meaning})",
                   expected, remedy, req)


# ---------------------------------------------------------------- GPU

def _gpu_unknown(check_id: str, gpu: Read[GpuFacts], expected: str, req: NodeRequirements) -> CheckResult | None:
    if not gpu.ok:
        return _unknown(check_id, gpu.reason, expected, _required(req),
                        "Run the validator where NVML works, or pass --nvidia-smi-xml with `nvidia-smi -q -x` output.")
    if gpu.value.source.startswith("/proc"):
        return _unknown(check_id, "needs NVML or nvidia-smi XML (the kernel module's /proc files do not say)",
                        expected, _required(req), "Run the validator where NVML works, or pass --nvidia-smi-xml.")
    return None


def check_gpu_persistence(req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    """<persistence_mode>: without it the driver tears the GPU down when the last client exits, and
    the next one (a restarted Triton) pays for initialisation."""
    expected = "persistence mode Enabled on every GPU"
    unknown = _gpu_unknown("gpu-persistence", gpu, expected, req)
    if unknown:
        return unknown
    modes = [g.persistence_mode for g in gpu.value.gpus]
    if any(m is None for m in modes):
        return _unknown("gpu-persistence", f"persistence mode not reported ({gpu.value.source})", expected,
                        _required(req))
    off = [str(i) for i, m in enumerate(modes) if not m]
    compute = sorted({g.compute_mode or "?" for g in gpu.value.gpus})
    observed = (f"Disabled on GPU {', '.join(off)}" if off else "Enabled on every GPU") + \
        f"; compute mode {', '.join(compute)}"
    return _result("gpu-persistence", not off, observed, expected,
                   "systemctl enable --now nvidia-persistenced (from the driver's packages; the GPU Operator's "
                   "driver container runs it itself)", req)


def check_gpu_clocks(req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    """<applications_clocks> against <max_clocks>; a locked minimum (nvidia-smi -lgc) shows as an idle
    GPU whose clock stays at or above its applications clock (the XML has no element for the lock)."""
    expected = "graphics clock fixed: applications clocks at the maximum (-ac) or locked (-lgc)"
    unknown = _gpu_unknown("gpu-clocks", gpu, expected, req)
    if unknown:
        return unknown
    moving, fixed = [], []
    for index, g in enumerate(gpu.value.gpus):
        if g.max_graphics_clock_mhz is None or g.applications_graphics_clock_mhz is None:
            return _unknown("gpu-clocks", f"GPU {index}: applications or max clocks not reported "
                            f"({gpu.value.source})", expected, _required(req))
        app, top, now = g.applications_graphics_clock_mhz, g.max_graphics_clock_mhz, g.graphics_clock_mhz
        if app >= top:
            fixed.append(f"GPU {index}: applications clock {app} MHz = max")
        elif g.idle and now is not None and now >= app:
            fixed.append(f"GPU {index}: idle at {now} MHz (locked; max {top} MHz)")
        else:
            moving.append(f"GPU {index}: applications clock {app} of {top} MHz, now {now} MHz")
    top = gpu.value.gpus[0].max_graphics_clock_mhz
    remedy = (f"nvidia-smi -pm 1 && nvidia-smi -lgc {top},{top} (or a high value the cooling sustains; "
              "it lasts until reboot: run it from a systemd unit after nvidia-persistenced). Watch "
              "nvidia-smi -q -d TEMPERATURE,PERFORMANCE for thermal slowdown afterwards.")
    return _result("gpu-clocks", not moving, "; ".join(moving or fixed), expected, remedy, req)


def mps_control_running(host: HostView) -> bool:
    for path in host.glob("/proc", "[0-9]*"):
        comm = host.read_text(f"{path}/comm")
        if comm.ok and comm.value.strip() == MPS_CONTROL:
            return True
    return False


def check_gpu_sharing(host: HostView, req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    """Several processes on one GPU time-slice it unless MPS serves them (field guide 6.5: MPS, or
    Triton alone on the card). One Triton process with several instances is one client."""
    expected = "each GPU used by one process, or shared through MPS, or Exclusive_Process"
    unknown = _gpu_unknown("gpu-sharing", gpu, expected, req)
    if unknown:
        return unknown
    mps = mps_control_running(host)
    shared = []
    for index, g in enumerate(gpu.value.gpus):
        if len(g.compute_processes) > 1:  # Exclusive_Process admits several only as MPS clients
            shared.append(f"GPU {index}: {len(g.compute_processes)} processes "
                          f"({', '.join(sorted(set(g.compute_processes))[:4])})")
    modes = ", ".join(sorted({g.compute_mode or "?" for g in gpu.value.gpus}))
    if not shared:
        return _result("gpu-sharing", True, f"no GPU shared by processes (compute mode {modes}"
                       f"{'; MPS control daemon running' if mps else ''})", expected, "", req)
    if mps:
        return _result("gpu-sharing", True, "; ".join(shared) + f" through MPS ({MPS_CONTROL} running)",
                       expected, "", req)
    return _result("gpu-sharing", False, "; ".join(shared) + ", time-sliced (no MPS control daemon)", expected,
                   "Give Triton the GPU alone (no time-slicing replicas in the device plugin's config for this "
                   "pool's nodes), or run MPS: nvidia-smi -c EXCLUSIVE_PROCESS && nvidia-cuda-mps-control -d "
                   "(the GPU Operator: sharing.mps in the device plugin config)", req)


# ---------------------------------------------------------------- NUMA and the kubelet

def gpu_numa_nodes(host: HostView) -> Read[dict[str, int]]:
    """PCI address -> NUMA node of each NVIDIA GPU the kernel module knows (-1: not reported)."""
    listing = host.list_dir("/proc/driver/nvidia/gpus")
    if not listing.ok:
        return listing  # type: ignore[return-value]
    nodes = {}
    for address in listing.value:
        text = host.read_text(f"/sys/bus/pci/devices/{address.lower()}/numa_node")
        if not text.ok or not re.fullmatch(r"-?\d+", text.value.strip()):
            return Read.missing(text.reason or f"/sys/bus/pci/devices/{address}/numa_node: {text.value!r}")
        nodes[address] = int(text.value.strip())
    if not nodes:
        return Read.missing("/proc/driver/nvidia/gpus lists no GPU")
    return Read(nodes)


def kubelet_config(host: HostView) -> Read[tuple[str, dict]]:
    """(path, KubeletConfiguration) from the first config file present."""
    reasons = []
    for path in KUBELET_CONFIGS:
        text = host.read_text(path)
        if not text.ok:
            reasons.append(text.reason)
            continue
        try:
            data = yaml.safe_load(text.value)  # JSON (OpenShift) is YAML too
        except yaml.YAMLError as exc:
            return Read.missing(f"{path}: not valid YAML/JSON ({exc.__class__.__name__})")
        if not isinstance(data, dict) or data.get("kind") != "KubeletConfiguration":
            reasons.append(f"{path}: not a KubeletConfiguration")
            continue
        return Read((path, data))
    return Read.missing("; ".join(reasons))


def check_topology(host: HostView, req: NodeRequirements) -> CheckResult:
    """Can the kubelet pin a Guaranteed pod's CPUs on its GPU's NUMA node? The static CPU manager
    gives whole CPUs; the topology manager (single-numa-node or restricted) makes them and the GPU
    share a NUMA node (Kubernetes' cpuManagerPolicy and topologyManagerPolicy)."""
    expected = "cpuManagerPolicy static and topologyManagerPolicy single-numa-node or restricted"
    numa = gpu_numa_nodes(host)
    host_nodes = len(host.glob("/sys/devices/system/node", "node[0-9]*"))
    config = kubelet_config(host)
    if not config.ok:
        return _unknown("topology", config.reason, expected, _required(req),
                        "Check where this node's kubelet reads its config (its --config flag); on OpenShift "
                        "the machine-config operator writes /etc/kubernetes/kubelet.conf.")
    path, data = config.value
    cpu_policy = str(data.get("cpuManagerPolicy") or "none")
    topology_policy = str(data.get("topologyManagerPolicy") or "none")
    gpus = (", ".join(f"GPU {a} on NUMA node {n}" for a, n in sorted(numa.value.items())) if numa.ok
            else numa.reason)
    observed = (f"cpuManagerPolicy {cpu_policy}, topologyManagerPolicy {topology_policy} ({path}); "
                f"{host_nodes or '?'} NUMA node{'s' if host_nodes != 1 else ''}; {gpus}")
    remedy = (f"In {path} set cpuManagerPolicy: static, topologyManagerPolicy: single-numa-node and reserve "
              "CPUs for the system (reservedSystemCPUs), then rm -f /var/lib/kubelet/cpu_manager_state && "
              "systemctl restart kubelet (drain the node first). OpenShift: a PerformanceProfile "
              "(numa.topologyPolicy: single-numa-node) or a KubeletConfig.")
    single_node = host_nodes == 1
    aligned = cpu_policy == "static" and (topology_policy in ALIGNING_TOPOLOGY_POLICIES or single_node)
    if aligned and single_node and topology_policy not in ALIGNING_TOPOLOGY_POLICIES:
        observed += " (one NUMA node: nothing to align)"
    if aligned and not numa.ok:
        return _unknown("topology", observed, expected, _required(req))
    return _result("topology", aligned, observed, expected, remedy, req)


LatencyCheck = Callable[[HostView, NodeRequirements, Read[GpuFacts]], CheckResult]

LATENCY_CHECKS: tuple[tuple[str, LatencyCheck], ...] = (
    ("cpu-frequency", lambda h, r, g: check_cpu_frequency(h, r)),
    ("cpu-idle", lambda h, r, g: check_cpu_idle(h, r)),
    ("tuned", lambda h, r, g: check_tuned(h, r)),
    ("overcommit-memory", lambda h, r, g: check_overcommit_memory(h, r)),
    ("gpu-persistence", lambda h, r, g: check_gpu_persistence(r, g)),
    ("gpu-clocks", lambda h, r, g: check_gpu_clocks(r, g)),
    ("gpu-sharing", check_gpu_sharing),
    ("topology", lambda h, r, g: check_topology(h, r)),
)


def checks_for(requirements: NodeRequirements) -> tuple[tuple[str, LatencyCheck], ...]:
    return () if requirements.latency_tuning is LatencyTuning.off else LATENCY_CHECKS
