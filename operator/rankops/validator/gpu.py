"""GPU facts (product, memory, temperature, throttling, ECC) from NVML, `nvidia-smi -q -x`, or /proc.

Sources, best first: NVML (when `pynvml` is importable and a device answers), the XML that
`nvidia-smi -q -x` prints (given to the validator as a file), and the kernel module's
/proc/driver/nvidia/gpus/*/information (product names only). Each returns a `Read`.
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from importlib import resources

from rankops.validator.host import HostView, Read

# Throttle reasons that mean the hardware is protecting itself (not idling or obeying a setting).
ALARMING_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


@dataclass(frozen=True)
class Gpu:
    product: str
    memory_mib: int | None = None
    memory_source: str | None = None
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_uncorrectable: int | None = None  # volatile (since the driver loaded)
    # What the latency checks read (validator.latency); None where the source does not say.
    pci_bus_id: str | None = None              # "00000000:00:1E.0" as NVML spells it
    persistence_mode: bool | None = None
    compute_mode: str | None = None            # Default, Exclusive_Process, Prohibited
    graphics_clock_mhz: int | None = None      # now
    applications_graphics_clock_mhz: int | None = None  # the target set by nvidia-smi -ac
    max_graphics_clock_mhz: int | None = None
    idle: bool | None = None                   # the gpu_idle clocks event reason is active
    compute_processes: tuple[str, ...] = ()    # names (or pids) of the processes using it
    mps_processes: int = 0                     # MPS server (type M) and clients (M+C) on it (XML only)


@dataclass(frozen=True)
class GpuFacts:
    source: str
    gpus: tuple[Gpu, ...]
    driver_version: str | None = None
    cuda_version: str | None = None
    notes: tuple[str, ...] = field(default=())


def _number(text: str | None) -> int | None:
    """'15360 MiB' -> 15360, '45 C' -> 45, 'N/A' -> None."""
    if text is None:
        return None
    match = re.match(r"\s*(-?\d+)", text)
    return int(match.group(1)) if match else None


def _ecc_uncorrectable(gpu: ET.Element) -> int | None:
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    total, seen = 0, False
    # Newer drivers: sram_uncorrectable*, dram_uncorrectable; older: double_bit/<...>/total.
    for element in volatile.iter():
        value = _number(element.text) if element is not volatile and len(element) == 0 else None
        if value is None:
            continue
        if "uncorrectable" in element.tag:
            total, seen = total + value, True
    for double_bit in volatile.iter("double_bit"):
        value = _number(double_bit.findtext("total"))
        if value is not None:
            total, seen = total + value, True
    return total if seen else None


def _throttle_reasons(gpu: ET.Element) -> tuple[str, ...]:
    # Drivers up to 535 say clocks_throttle_reasons; 550 and later renamed it clocks_event_reasons.
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return ()
    active = []
    for element in block:
        if (element.text or "").strip() == "Active":
            name = re.sub(r"^clocks_(event|throttle)_reason_", "", element.tag)
            if name in ALARMING_THROTTLE:
                active.append(name)
    return tuple(active)


def _event_reason_active(gpu: ET.Element, reason: str) -> bool | None:
    for block in ("clocks_event_reasons", "clocks_throttle_reasons"):
        for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
            value = gpu.findtext(f"{block}/{prefix}{reason}")
            if value is not None:
                return value.strip() == "Active"
    return None


def _enabled(text: str | None) -> bool | None:
    value = (text or "").strip()
    return True if value == "Enabled" else False if value == "Disabled" else None


def _mps_processes(gpu: ET.Element) -> int:
    return sum("M" in (process.findtext("type") or "") for process in gpu.findall("processes/process_info"))


def _processes(gpu: ET.Element) -> tuple[str, ...]:
    """Compute processes (type C, or M+C for an MPS client; M is the MPS server itself)."""
    names = []
    for process in gpu.findall("processes/process_info"):
        kind = (process.findtext("type") or "C").strip()
        if "C" in kind:
            names.append((process.findtext("process_name") or process.findtext("pid") or "?").strip())
    return tuple(names)


def parse_nvidia_smi_xml(text: str) -> Read[GpuFacts]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        return Read.missing(f"nvidia-smi XML is not well-formed: {exc}")
    if root.tag != "nvidia_smi_log":
        return Read.missing(f"nvidia-smi XML: root element is <{root.tag}>, expected <nvidia_smi_log> "
                            "(produce it with: nvidia-smi -q -x)")
    gpus = []
    for element in root.findall("gpu"):
        temperature = element.find("temperature")
        slowdown = None
        if temperature is not None:
            slowdown = _number(temperature.findtext("gpu_temp_slow_threshold"))
        gpus.append(Gpu(
            product=(element.findtext("product_name") or "").strip() or "unknown",
            memory_mib=_number(element.findtext("fb_memory_usage/total")),
            memory_source="nvidia-smi",
            temperature_c=_number(element.findtext("temperature/gpu_temp")),
            slowdown_temperature_c=slowdown,
            throttle_reasons=_throttle_reasons(element),
            ecc_uncorrectable=_ecc_uncorrectable(element),
            pci_bus_id=(element.findtext("pci/pci_bus_id") or element.get("id") or "").strip() or None,
            persistence_mode=_enabled(element.findtext("persistence_mode")),
            compute_mode=(element.findtext("compute_mode") or "").strip() or None,
            graphics_clock_mhz=_number(element.findtext("clocks/graphics_clock")),
            applications_graphics_clock_mhz=_number(element.findtext("applications_clocks/graphics_clock")),
            max_graphics_clock_mhz=_number(element.findtext("max_clocks/graphics_clock")),
            idle=_event_reason_active(element, "gpu_idle"),
            compute_processes=_processes(element),
            mps_processes=_mps_processes(element),
        ))
    if not gpus:
        return Read.missing("nvidia-smi XML lists no <gpu>")
    return Read(GpuFacts(
        source="nvidia-smi -q -x",
        gpus=tuple(gpus),
        driver_version=(root.findtext("driver_version") or "").strip() or None,
        cuda_version=(root.findtext("cuda_version") or "").strip() or None,
    ))


def from_nvidia_smi_file(path: str) -> Read[GpuFacts]:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_nvidia_smi_xml(handle.read())
    except (OSError, UnicodeDecodeError) as exc:
        return Read.missing(f"{path}: cannot read nvidia-smi XML ({exc})")


def from_nvml() -> Read[GpuFacts]:
    """Ask NVML directly; needs `pynvml` (nvidia-ml-py) and access to the GPU device nodes."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return Read.missing("NVML not used: the pynvml package is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError carries the driver's own words, e.g. the version mismatch
        return Read.missing(f"NVML did not initialise: {exc}")
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(Gpu(
                product=name, memory_mib=int(memory), memory_source="NVML",
                temperature_c=_nvml_optional(lambda: pynvml.nvmlDeviceGetTemperature(
                    handle, pynvml.NVML_TEMPERATURE_GPU)),
                slowdown_temperature_c=_nvml_optional(lambda: pynvml.nvmlDeviceGetTemperatureThreshold(
                    handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
                throttle_reasons=_nvml_throttle(pynvml, handle),
                ecc_uncorrectable=_nvml_optional(lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)),
                **_nvml_latency_facts(pynvml, handle),
            ))
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12020
    except Exception as exc:
        return Read.missing(f"NVML query failed: {exc}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    if not gpus:
        return Read.missing("NVML sees no GPU")
    return Read(GpuFacts(
        source="NVML", gpus=tuple(gpus),
        driver_version=driver.decode() if isinstance(driver, bytes) else driver,
        cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
    ))


def _nvml_optional(query) -> int | None:
    try:
        return int(query())
    except Exception:  # not supported on this board (e.g. ECC on consumer cards)
        return None


_NVML_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def _nvml_latency_facts(pynvml, handle) -> dict:
    """The same facts as the XML's persistence_mode, compute_mode, clocks and processes."""
    def text(query):
        try:
            value = query()
            return value.decode() if isinstance(value, bytes) else str(value)
        except Exception:
            return None
    persistence = _nvml_optional(lambda: pynvml.nvmlDeviceGetPersistenceMode(handle))
    mode = _nvml_optional(lambda: pynvml.nvmlDeviceGetComputeMode(handle))
    reasons = _nvml_optional(lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    try:
        processes = tuple(str(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:
        processes = ()
    graphics = getattr(pynvml, "NVML_CLOCK_GRAPHICS", 0)  # 0 in nvml.h
    return {
        "pci_bus_id": text(lambda: pynvml.nvmlDeviceGetPciInfo(handle).busId),
        "persistence_mode": None if persistence is None else persistence == 1,
        "compute_mode": _NVML_COMPUTE_MODES.get(mode) if mode is not None else None,
        "graphics_clock_mhz": _nvml_optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, graphics)),
        "applications_graphics_clock_mhz": _nvml_optional(lambda: pynvml.nvmlDeviceGetApplicationsClock(handle, graphics)),
        "max_graphics_clock_mhz": _nvml_optional(lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, graphics)),
        "idle": None if reasons is None else bool(reasons & 0x1),  # nvmlClocksThrottleReasonGpuIdle
        "compute_processes": processes,
    }


def _nvml_throttle(pynvml, handle) -> tuple[str, ...]:
    try:
        mask = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    except Exception:
        return ()
    bits = {"hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
            "hw_power_brake_slowdown": 0x80}
    return tuple(name for name, bit in bits.items() if mask & bit)


def from_proc(host: HostView) -> Read[GpuFacts]:
    """Product names from the kernel module's per-GPU information files (no memory, no health)."""
    base = "/proc/driver/nvidia/gpus"
    listing = host.list_dir(base)
    if not listing.ok:
        return Read.missing(f"no GPU information from the kernel module ({listing.reason})")
    gpus = []
    for bus in listing.value:
        info = host.read_text(f"{base}/{bus}/information")
        if not info.ok:
            return Read.missing(info.reason)
        match = re.search(r"^Model:\s*(.+?)\s*$", info.value, re.MULTILINE)
        if not match:
            return Read.missing(f"{base}/{bus}/information: no 'Model:' line")
        product = match.group(1)
        memory = known_memory_mib(product)
        gpus.append(Gpu(product=product, memory_mib=memory,
                        memory_source="product table" if memory is not None else None))
    if not gpus:
        return Read.missing(f"{base} lists no GPU")
    return Read(GpuFacts(source=base, gpus=tuple(gpus)))


def known_memory_mib(product: str) -> int | None:
    table = json.loads(resources.files("rankops.validator").joinpath("gpu_memory.json").read_text())
    return table["products"].get(product)


def gather(host: HostView, nvidia_smi_xml: str | None = None, use_nvml: bool = True) -> Read[GpuFacts]:
    """The best GPU facts available; the reasons of the sources that failed travel as notes."""
    notes = []
    sources = []
    if nvidia_smi_xml:
        sources.append(lambda: from_nvidia_smi_file(nvidia_smi_xml))
    if use_nvml:
        sources.append(from_nvml)
    sources.append(lambda: from_proc(host))
    for source in sources:
        facts = source()
        if facts.ok:
            return Read(GpuFacts(**{**facts.value.__dict__, "notes": tuple(notes)}))
        notes.append(facts.reason)
    return Read.missing("; ".join(notes))
