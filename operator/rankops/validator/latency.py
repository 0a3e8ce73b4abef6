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
import struct
from typing import Callable

import yaml

from rankops.api.gpunodepool import LatencyTuning, NodeRequirements
from rankops.validator.gpu import GpuFacts
from rankops.validator.host import HostView, Read
from rankops.validator.result import CheckResult, Status, unknown_result

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
MPS_SERVER = "nvidia-cuda-mps-server"
TUNED_DAEMON = "tuned"
TUNED_PROFILE_FILE = "/etc/tuned/active_profile"
# The kernel keeps a task's name (/proc/PID/comm) in TASK_COMM_LEN = 16 bytes with the NUL: a longer
# program name is cut to 15 characters (nvidia-cuda-mps-control and -server are both nvidia-cuda-mps).
COMM_LEN = 15
# An interpreter's comm is its own name; the script it runs is the first argument that is no option.
INTERPRETERS = re.compile(r"(platform-)?python[0-9.]*")
# The PM QoS CPU latency request (/dev/cpu_dma_latency; kernel admin-guide/pm/cpuidle.rst, "Power
# Management Quality of Service for CPUs"): the cpuidle governor skips every state whose exit latency is
# above it. PM_QOS_CPU_LATENCY_DEFAULT_VALUE, 2000 s, means no process asks for anything.
CPU_DMA_LATENCY = "/dev/cpu_dma_latency"
PM_QOS_DEFAULT_US = 2_000_000_000
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"

# Which checks each node label summarises (validator.node). overcommit-memory and
# transparent-hugepages are advisory under every mode: they guard allocation and compaction, not
# the clocks and C-states a request waits on, and RHEL's defaults (0, always) serve models well.
LATENCY_TUNED_CHECKS = ("cpu-frequency", "cpu-idle", "tuned", "gpu-persistence", "gpu-clocks", "gpu-sharing")
TOPOLOGY_ALIGNED_CHECKS = ("topology",)
ADVISORY_CHECKS = ("overcommit-memory", "transparent-hugepages")


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


def _argv(host: HostView, proc: str) -> tuple[str, ...]:
    raw = host.read_bytes(f"{proc}/cmdline")
    if not raw.ok:
        return ()
    return tuple(arg.decode("utf-8", "replace") for arg in raw.value.split(b"\0") if arg)


def _programs(argv: tuple[str, ...]) -> set[str]:
    """The program a command line runs: argv[0]'s name, or the script an interpreter was given."""
    if not argv:
        return set()
    names = {argv[0].rsplit("/", 1)[-1]}
    if INTERPRETERS.fullmatch(next(iter(names))):
        script = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
        if script:
            names.add(script.rsplit("/", 1)[-1])
    return names


def running_processes(host: HostView, names: tuple[str, ...]) -> Read[dict[str, list[str]]]:
    """The pids running each of `names`, from /proc/PID/comm (cut to 15 characters by the kernel) and,
    where comm is ambiguous (a cut name, an interpreter), /proc/PID/cmdline. Missing when /proc lists
    no process: the host's /proc is not mounted under the host root, so nothing can be said."""
    procs = host.glob("/proc", "[0-9]*")
    if not procs:
        return Read.missing("/proc lists no process (is the host's /proc mounted under the host root?)")
    found: dict[str, list[str]] = {name: [] for name in names}
    for proc in sorted(procs, key=lambda path: int(path.rsplit("/", 1)[-1])):
        comm = host.read_text(f"{proc}/comm")
        if not comm.ok:
            continue  # exited while we looked
        comm_name = comm.value.rstrip("\n")
        cut = [name for name in names if comm_name == name[:COMM_LEN]]
        if not cut and not INTERPRETERS.fullmatch(comm_name):
            continue
        argv = _argv(host, proc)
        programs = _programs(argv)
        for name in names:
            # a comm that was cut matches a longer name only when the command line agrees (or is gone)
            if name in programs or (name in cut and (len(name) <= COMM_LEN or not argv)):
                found[name].append(proc.rsplit("/", 1)[-1])
    return Read(found)


def _pids(pids: list[str]) -> str:
    return f"pid{'s' if len(pids) > 1 else ''} {', '.join(pids[:3])}"


def tuned_daemon(host: HostView) -> Read[list[str]]:
    """The pids of the running tuned daemon ([] when none runs)."""
    found = running_processes(host, (TUNED_DAEMON,))
    return Read(found.value[TUNED_DAEMON]) if found.ok else found  # type: ignore[return-value]


def parse_cpu_dma_latency(data: bytes) -> int | None:
    """/dev/cpu_dma_latency's value in µs: the kernel returns a 4-byte little-endian int32; some
    kernels (and tools that copy it) give a decimal number as text."""
    text = data.decode("ascii", "replace")
    if re.fullmatch(r"\s*\d+\s*", text) and (len(data) != 4 or data.endswith(b"\n")):
        return int(text)
    if len(data) == 4:
        value = struct.unpack("<i", data)[0]
        return value if value >= 0 else None
    return None


def pm_qos_latency(host: HostView) -> Read[int]:
    """The CPU latency PM QoS limit now in force (µs)."""
    raw = host.read_bytes(CPU_DMA_LATENCY)
    if not raw.ok:
        return raw  # type: ignore[return-value]
    value = parse_cpu_dma_latency(raw.value)
    if value is None:
        return Read.missing(f"{CPU_DMA_LATENCY}: {raw.value[:16]!r} is neither a 4-byte int32 nor a number")
    return Read(value)


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
        return unknown_result("cpu-frequency", f"{CPU_DIR}: no cpuN entries", expected, _required(req))
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
        return unknown_result("cpu-frequency", f"{why} ({unreadable[0]})", expected, _required(req),
                        "Set the BIOS power profile to Performance; on a VM the host decides. "
                        "If the node should have cpufreq, check: cpupower frequency-info")
    where = f" ({', '.join(x for x in (driver, pstate) if x)})" if driver or pstate else ""
    observed = f"governor {_counted(governors)}{where}"
    if unreadable:
        observed += f"; {len(unreadable)} CPUs unreadable ({unreadable[0]})"
        return unknown_result("cpu-frequency", observed, expected, _required(req), remedy)
    return _result("cpu-frequency", set(governors) == {"performance"}, observed, expected, remedy, req)


def _max_cstate_limit(params: dict[str, str], driver: str | None) -> str | None:
    """The kernel command line's C-state limit for the cpuidle driver in use, if it keeps CPUs at C1
    or shallower (kernel-parameters.txt): intel_idle.max_cstate limits intel_idle, 0 turning it off
    (acpi_idle idles instead); processor.max_cstate limits acpi_idle and nothing else."""
    if params.get("idle") == "poll":
        return "idle=poll"
    values = {key: int(params[key]) for key in ("intel_idle.max_cstate", "processor.max_cstate")
              if params.get(key, "").isdigit()}
    intel, acpi = values.get("intel_idle.max_cstate"), values.get("processor.max_cstate")
    if intel == 1 and driver in ("intel_idle", None):
        return "intel_idle.max_cstate=1"
    if acpi is not None and acpi <= 1 and driver in ("acpi_idle", None):
        handed = " (intel_idle.max_cstate=0 leaves idle to acpi_idle)" if intel == 0 else ""
        return f"processor.max_cstate={acpi}{handed}"
    return None


def check_cpu_idle(host: HostView, req: NodeRequirements) -> CheckResult:
    """Deep idle states enabled (admin-guide/pm/cpuidle.rst: cpuN/cpuidle/stateM/{name,latency,disable}),
    and whether a PM QoS request (/dev/cpu_dma_latency, held by tuned's force_latency or any other
    process) keeps the governor out of them."""
    expected = f"no idle state deeper than C1 (exit latency > {DEEP_EXIT_LATENCY_US} µs) enabled or in use"
    remedy = ("tuned-adm profile latency-performance (force_latency keeps CPUs in C1 through PM QoS); or "
              "grubby --update-kernel=ALL --args='intel_idle.max_cstate=1 processor.max_cstate=1' && "
              "systemctl reboot; and disable C-states (C6, C1E) in the BIOS.")
    driver = host.read_text(f"{CPU_DIR}/cpuidle/current_driver")
    driver_name = driver.value.strip() if driver.ok else None
    limit = _max_cstate_limit(_cmdline(host), driver_name)
    deep: dict[str, list[str]] = {}
    latencies: dict[str, int] = {}
    unreadable: list[str] = []
    seen_states = False
    for cpu in cpu_ids(host):
        for state in host.glob(f"{CPU_DIR}/{cpu}/cpuidle", "state[0-9]*"):
            seen_states = True
            name, latency, disable = (host.read_text(f"{state}/{f}") for f in ("name", "latency", "disable"))
            if disable.ok and disable.value.strip() == "1":
                continue
            label = name.value.strip() if name.ok else state.rsplit("/", 1)[-1]
            if not (latency.ok and latency.value.strip().isdigit()):
                unreadable.append(f"{state}/latency: {latency.reason or repr(latency.value.strip())}"
                                  f" ({label})")
                continue
            if int(latency.value) > DEEP_EXIT_LATENCY_US:
                key = f"{label} ({latency.value.strip()} µs)"
                deep.setdefault(key, []).append(cpu)
                latencies[key] = int(latency.value)
    if limit and not deep:  # the driver registers no state past the limit, whatever sysfs could not say
        return _result("cpu-idle", True, f"limited by {limit} on the kernel command line", expected, remedy, req)
    where = f" ({driver_name})" if driver_name else ""
    if deep or unreadable:
        qos = pm_qos_latency(host)
        if qos.ok:
            free = {k: cpus for k, cpus in deep.items() if latencies[k] <= qos.value}
            holds_unreadable = qos.value <= DEEP_EXIT_LATENCY_US  # a deep state is above it, whatever its latency
            if not free and (not unreadable or holds_unreadable):
                return _result("cpu-idle", True, f"deep states {_counted(deep) or 'of unknown latency'} enabled, "
                               f"held off by a PM QoS request of {qos.value} µs ({CPU_DMA_LATENCY}"
                               f"{_qos_holder(host)})", expected, remedy, req)
            if free:
                request = ("no PM QoS request" if qos.value >= PM_QOS_DEFAULT_US else
                           f"the PM QoS request of {qos.value} µs does not hold them off")
                return _result("cpu-idle", False, f"deep states enabled: {_counted(free)}{where}; {request} "
                               f"({CPU_DMA_LATENCY})", expected, remedy, req)
        elif deep:
            return unknown_result("cpu-idle", f"deep states enabled: {_counted(deep)}{where}; whether a PM QoS request "
                            f"holds them off is unknown ({qos.reason})", expected, _required(req),
                            "The validator reads /dev/cpu_dma_latency through the host root; where it may not "
                            "(the device is root's), limit C-states where it can see: " + remedy)
        return unknown_result("cpu-idle", f"{len(unreadable)} idle state{'s' if len(unreadable) > 1 else ''} of "
                        f"unknown exit latency enabled ({unreadable[0]})", expected, _required(req),
                        "Check the cpuidle sysfs files on the host; or hold deep states off for certain: " + remedy)
    if seen_states:
        return _result("cpu-idle", True, f"no deep state enabled ({driver_name or 'cpuidle'})", expected, remedy, req)
    if driver_name == "none":
        return unknown_result("cpu-idle", "no cpuidle driver: the CPUs idle as the firmware decides", expected,
                        _required(req), "Disable C-states in the BIOS, or boot with intel_idle.max_cstate=1.")
    reason = driver.reason if not driver.ok else f"{CPU_DIR}/cpu*/cpuidle: no states"
    return unknown_result("cpu-idle", reason, expected, _required(req))


def _qos_holder(host: HostView) -> str:
    """Who holds the PM QoS request, where we can tell: tuned running a latency profile."""
    daemon = tuned_daemon(host)
    profile = active_tuned_profile(host)
    if daemon.ok and daemon.value and profile.ok and is_latency_profile(profile.value):
        return f"; tuned's {profile.value} (force_latency), {_pids(daemon.value)}"
    return ""


# ---------------------------------------------------------------- tuned, sysctl

def active_tuned_profile(host: HostView) -> Read[str]:
    """tuned's active profile(s), space-separated as tuned writes them; '' when tuned is off."""
    text = host.read_text(TUNED_PROFILE_FILE, allow_empty=True)
    return Read(text.value.strip()) if text.ok else text


def is_latency_profile(profiles: str) -> bool:
    return any(p in LATENCY_PROFILES or p.startswith(PERFORMANCE_PROFILE_PREFIX) for p in profiles.split())


def check_tuned(host: HostView, req: NodeRequirements) -> CheckResult:
    """The tuned daemon running a latency profile. /etc/tuned/active_profile alone proves nothing: it
    outlives the daemon, and only a running tuned holds force_latency's PM QoS request and keeps the
    governor where the profile put it. A host without tuned whose C-states and governor are held by
    other means (kernel arguments, a PM QoS request from another process, cpupower) passes."""
    expected = (f"tuned running profile {', '.join(LATENCY_PROFILES[:3])} or a PerformanceProfile's "
                f"{PERFORMANCE_PROFILE_PREFIX}<name> (or C-states and governor held by other means)")
    remedy = ("dnf install -y tuned && systemctl enable --now tuned && tuned-adm profile latency-performance "
              "(on OpenShift: a PerformanceProfile for the node's MachineConfigPool, applied by the Node Tuning "
              "Operator)")
    daemon = tuned_daemon(host)
    if not daemon.ok:
        return unknown_result("tuned", f"cannot tell whether tuned runs: {daemon.reason}", expected, _required(req),
                        "Mount the host's / (with its /proc) at the validator's host root.")
    profile = active_tuned_profile(host)
    if daemon.value:
        pids = _pids(daemon.value)
        if not profile.ok:
            return unknown_result("tuned", f"tuned runs ({pids}) but its profile is unknown: {profile.reason}", expected,
                            _required(req), remedy)
        if not profile.value:
            return _result("tuned", False, f"no active profile (tuned-adm off; tuned {pids})", expected, remedy, req)
        return _result("tuned", is_latency_profile(profile.value), f"active profile {profile.value} (tuned {pids})",
                       expected, remedy, req)
    said = (f"{TUNED_PROFILE_FILE} says {profile.value}, but no tuned process runs: the profile holds nothing"
            if profile.ok and profile.value else "tuned not running (not installed, or stopped)")
    idle, frequency = check_cpu_idle(host, req), check_cpu_frequency(host, req)
    if idle.status is Status.PASS and frequency.status is Status.PASS:
        return _result("tuned", True, f"{said}; held by other means: C-states {idle.observed}; {frequency.observed}",
                       expected, remedy, req)
    return _result("tuned", False, said, expected, remedy, req)


def _advisory(check_id: str, ok: bool | None, observed: str, expected: str, remedy: str) -> CheckResult:
    """PASS, WARN or unknown that never gates readiness, whatever latencyTuning says."""
    if ok is None:
        return unknown_result(check_id, observed, expected, False, remedy)
    return CheckResult(check_id, Status.PASS if ok else Status.WARN, observed, expected, "" if ok else remedy, False)


def check_overcommit_memory(host: HostView, req: NodeRequirements) -> CheckResult:
    """Advisory (ADVISORY_CHECKS): field guide 5.2 sets vm.overcommit_memory=1 so bursts of concurrent
    requests do not fail to allocate, but the kernel's heuristic default (0) refuses only allocations
    that could never be met, and no clock or C-state waits on it: a node tuned for latency is not held
    back for it."""
    expected = "vm.overcommit_memory = 1"
    remedy = ("echo 'vm.overcommit_memory = 1' > /etc/sysctl.d/90-rankops.conf && "
              "sysctl -p /etc/sysctl.d/90-rankops.conf")
    text = host.read_text("/proc/sys/vm/overcommit_memory")
    if not text.ok:
        return _advisory("overcommit-memory", None, text.reason, expected, "")
    value = text.value.strip()
    meaning = {"0": "heuristic", "1": "always", "2": "never (strict accounting)"}.get(value)
    if meaning is None:
        return _advisory("overcommit-memory", None, f"/proc/sys/vm/overcommit_memory: {value!r}", expected, "")
    return _advisory("overcommit-memory", value == "1", f"vm.overcommit_memory = {value} ({meaning})",
                     expected, remedy)


def check_transparent_hugepages(host: HostView, req: NodeRequirements) -> CheckResult:
    """Advisory: THP `always` lets a page fault stop to compact memory and khugepaged collapse pages
    under a running process (admin-guide/mm/transhuge.rst); tuned's network-latency profile sets never."""
    expected = "transparent hugepages madvise or never"
    remedy = ("tuned-adm profile network-latency (its [vm] sets transparent_hugepages=never); or "
              "grubby --update-kernel=ALL --args='transparent_hugepage=madvise' && systemctl reboot")
    text = host.read_text(THP_ENABLED)
    if not text.ok:
        return _advisory("transparent-hugepages", None, text.reason, expected, "")
    chosen = re.search(r"\[(\w+)\]", text.value)
    if not chosen:
        return _advisory("transparent-hugepages", None, f"{THP_ENABLED}: {text.value.strip()!r}", expected, "")
    mode = chosen.group(1)
    return _advisory("transparent-hugepages", mode in ("madvise", "never"), f"transparent hugepages {mode}",
                     expected, remedy)


# ---------------------------------------------------------------- GPU

def _gpu_unknown(check_id: str, gpu: Read[GpuFacts], expected: str, req: NodeRequirements) -> CheckResult | None:
    if not gpu.ok:
        return unknown_result(check_id, gpu.reason, expected, _required(req),
                        "Run the validator where NVML works, or pass --nvidia-smi-xml with `nvidia-smi -q -x` output.")
    if gpu.value.source.startswith("/proc"):
        why = f": {'; '.join(gpu.value.notes)}" if gpu.value.notes else ""
        return unknown_result(check_id, "needs NVML or nvidia-smi XML (the kernel module's /proc files do not say)" + why,
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
        return unknown_result("gpu-persistence", f"persistence mode not reported ({gpu.value.source})", expected,
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
            return unknown_result("gpu-clocks", f"GPU {index}: applications or max clocks not reported "
                            f"({gpu.value.source})", expected, _required(req))
        app, top, now = g.applications_graphics_clock_mhz, g.max_graphics_clock_mhz, g.graphics_clock_mhz
        if app >= top:
            fixed.append(f"GPU {index}: applications clock {app} MHz = max")
        elif g.idle and now is not None and now >= app:
            fixed.append(f"GPU {index}: idle at {now} MHz (locked; max {top} MHz)")
        else:
            moving.append(f"GPU {index}: applications clock {app} of {top} MHz, now "
                          f"{'unknown' if now is None else f'{now} MHz'}")
    top = gpu.value.gpus[0].max_graphics_clock_mhz
    remedy = (f"nvidia-smi -pm 1 && nvidia-smi -lgc {top},{top} (or a high value the cooling sustains; "
              "it lasts until reboot: run it from a systemd unit after nvidia-persistenced). Watch "
              "nvidia-smi -q -d TEMPERATURE,PERFORMANCE for thermal slowdown afterwards.")
    return _result("gpu-clocks", not moving, "; ".join(moving or fixed), expected, remedy, req)


def mps_daemons(host: HostView) -> Read[dict[str, list[str]]]:
    """The pids of MPS's control daemon and servers. Both are `nvidia-cuda-mps` in comm (cut at 15
    characters): their command lines tell them apart."""
    return running_processes(host, (MPS_CONTROL, MPS_SERVER))


def check_gpu_sharing(host: HostView, req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    """Several processes on one GPU time-slice it unless MPS serves them (field guide 6.5: MPS, or
    Triton alone on the card). One Triton process with several instances is one client. MPS runs
    when its daemons do, or when the GPU itself lists MPS clients (type M+C) or its server (M)."""
    expected = "each GPU used by one process, or shared through MPS, or Exclusive_Process"
    unknown = _gpu_unknown("gpu-sharing", gpu, expected, req)
    if unknown:
        return unknown
    daemons = mps_daemons(host)
    running = [name for name in (MPS_CONTROL, MPS_SERVER) if daemons.ok and daemons.value[name]]
    on_gpu = [index for index, g in enumerate(gpu.value.gpus) if g.mps_processes]
    mps = (", ".join(f"{name} running" for name in running) if running else
           f"MPS clients on GPU {', '.join(map(str, on_gpu))}" if on_gpu else "")
    shared = []
    for index, g in enumerate(gpu.value.gpus):
        if len(g.compute_processes) > 1:  # Exclusive_Process admits several only as MPS clients
            shared.append(f"GPU {index}: {len(g.compute_processes)} processes "
                          f"({', '.join(sorted(set(g.compute_processes))[:4])})")
    modes = ", ".join(sorted({g.compute_mode or "?" for g in gpu.value.gpus}))
    if not shared:
        return _result("gpu-sharing", True, f"no GPU shared by processes (compute mode {modes}"
                       f"{'; MPS: ' + mps if mps else ''})", expected, "", req)
    if mps:
        return _result("gpu-sharing", True, "; ".join(shared) + f" through MPS ({mps})", expected, "", req)
    if not daemons.ok:
        return unknown_result("gpu-sharing", "; ".join(shared) + f"; whether MPS serves them is unknown ({daemons.reason})",
                        expected, _required(req), "Mount the host's / (with its /proc) at the validator's host root.")
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
            # The validator DaemonSet mounts /var/lib/kubelet/config.yaml with FileOrCreate: an empty
            # file there is one the kubelet does not have.
            reasons.append(f"{path}: not found" if text.reason == f"{path}: empty" else text.reason)
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
        return unknown_result("topology", config.reason, expected, _required(req),
                        "Check where this node's kubelet reads its config (its --config flag); on OpenShift "
                        "the machine-config operator writes /etc/kubernetes/kubelet.conf.")
    path, data = config.value
    cpu_policy = str(data.get("cpuManagerPolicy") or "none")
    topology_policy = str(data.get("topologyManagerPolicy") or "none")
    # numa_node -1: the firmware (ACPI _PXM) did not say; on one NUMA node there is only one answer
    unplaced = [a for a, n in sorted(numa.value.items()) if n < 0] if numa.ok else []
    gpus = (", ".join(f"GPU {a} on NUMA node {n}" if n >= 0 else f"GPU {a} on no reported NUMA node (numa_node -1)"
                      for a, n in sorted(numa.value.items())) if numa.ok else numa.reason)
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
        return unknown_result("topology", observed, expected, _required(req))
    if aligned and unplaced and host_nodes != 1:
        return unknown_result("topology", observed, expected, _required(req),
                        "The kubelet cannot align a GPU whose NUMA node the firmware does not report: enable NUMA "
                        "(SRAT/_PXM) reporting in the BIOS, or check: cat /sys/bus/pci/devices/<address>/numa_node")
    return _result("topology", aligned, observed, expected, remedy, req)


LatencyCheck = Callable[[HostView, NodeRequirements, Read[GpuFacts]], CheckResult]

LATENCY_CHECKS: tuple[tuple[str, LatencyCheck], ...] = (
    ("cpu-frequency", lambda h, r, g: check_cpu_frequency(h, r)),
    ("cpu-idle", lambda h, r, g: check_cpu_idle(h, r)),
    ("tuned", lambda h, r, g: check_tuned(h, r)),
    ("overcommit-memory", lambda h, r, g: check_overcommit_memory(h, r)),
    ("transparent-hugepages", lambda h, r, g: check_transparent_hugepages(h, r)),
    ("gpu-persistence", lambda h, r, g: check_gpu_persistence(r, g)),
    ("gpu-clocks", lambda h, r, g: check_gpu_clocks(r, g)),
    ("gpu-sharing", check_gpu_sharing),
    ("topology", lambda h, r, g: check_topology(h, r)),
)


def checks_for(requirements: NodeRequirements) -> tuple[tuple[str, LatencyCheck], ...]:
    return () if requirements.latency_tuning is LatencyTuning.off else LATENCY_CHECKS
