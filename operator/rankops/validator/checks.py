"""The node checks: one small function per check, each reading the host and returning a verdict.

A check never raises: a file it cannot read or parse makes it `unknown`, with the reason as the
observation. `required` says whether the verdict gates the node's readiness (it follows the
pool's requirements); the remedy is the RHEL 8 command a person would run.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

import yaml

from rankops.api.gpunodepool import NodeRequirements
from rankops.validator.gpu import GpuFacts
from rankops.validator.host import HostView, Read
from rankops.validator.result import CheckResult, Status, unknown_result

# os-release IDs of RHEL and its rebuilds (Oracle Linux 8 says ID="ol", PLATFORM_ID="platform:el8").
RHEL_FAMILY_IDS = {"rhel": "Red Hat Enterprise Linux", "rocky": "Rocky Linux", "almalinux": "AlmaLinux",
                   "ol": "Oracle Linux"}
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# Where the dynamic loader looks without configuration on x86_64 RHEL, then where driver
# packages put libraries on other layouts.
DEFAULT_LIB_DIRS = ("/usr/lib64", "/lib64")
EXTRA_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/usr/lib64/nvidia", "/usr/local/nvidia/lib64",
                  "/opt/nvidia/lib64")
HOT_GPU_C = 85  # when the board does not say its slowdown threshold


# ---------------------------------------------------------------- parsing helpers (pure)

def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def parse_os_release(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key.strip()] = value
    return fields


def parse_proc_modules(text: str) -> dict[str, str]:
    """Module name -> taint flags ('' when none), from /proc/modules lines like
    'nvidia 56594432 2 nvidia_uvm,nvidia_modeset, Live 0xffffffffc0a00000 (POE)'."""
    modules = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        flags = fields[-1][1:-1] if fields[-1].startswith("(") and fields[-1].endswith(")") else ""
        modules[fields[0]] = flags
    return modules


def parse_kernel_module_version(text: str) -> str | None:
    """'NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ...' -> '535.104.05'
    (the open modules say 'NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build ...')."""
    match = re.search(r"^NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\b", text, re.MULTILINE)
    return match.group(1) if match else None


def kernel_module_version(host: HostView) -> Read[str]:
    text = host.read_text("/proc/driver/nvidia/version")
    if not text.ok:
        return text
    version = parse_kernel_module_version(text.value)
    if version is None:
        return Read.missing("/proc/driver/nvidia/version: no 'NVRM version: ... Kernel Module <version>' line")
    return Read(version)


def driver_branch(requirements: NodeRequirements) -> str:
    if requirements.min_driver_version:
        return requirements.min_driver_version.split(".")[0]
    return "latest"


def _library_version(name: str, prefix: str) -> str | None:
    match = re.fullmatch(re.escape(prefix) + r"\.(\d+\.\d+(?:\.\d+)?)", name)
    return match.group(1) if match else None


def user_space_library_versions(host: HostView, library: str, dirs: tuple[str, ...]) -> dict[str, list[str]]:
    """Directory -> versions of `library` (e.g. libnvidia-ml.so) present there. The version the
    .so.1 link points at comes first, because that is the one programs load."""
    found: dict[str, list[str]] = {}
    for directory in dirs:
        versions = []
        link = host.link_target(f"{directory}/{library}.1")
        if link.ok:
            linked = _library_version(link.value.rsplit("/", 1)[-1], library)
            if linked:
                versions.append(linked)
        for path in host.glob(directory, f"{library}.*.*"):
            version = _library_version(path.rsplit("/", 1)[-1], library)
            if version and version not in versions:
                versions.append(version)
        if versions:
            found[directory] = versions
    return found


def driver_max_cuda(driver_version: str) -> tuple[str | None, bool]:
    """The newest CUDA the driver fully supports, and whether the driver is newer than the table."""
    table = json.loads(resources.files("rankops.validator").joinpath("driver_cuda.json").read_text())
    driver = version_tuple(driver_version)
    best: str | None = None
    newest_min = max(version_tuple(entry["minDriverLinux"]) for entry in table["entries"])
    for entry in table["entries"]:
        if version_tuple(entry["minDriverLinux"]) <= driver:
            if best is None or version_tuple(entry["cuda"]) > version_tuple(best):
                best = entry["cuda"]
    return best, driver > newest_min and driver[0] > newest_min[0]


def normalise_product(name: str) -> str:
    """'Tesla T4' -> 'tesla-t4' (the GPU feature discovery label spelling, case-folded)."""
    return re.sub(r"\s+", "-", name.strip()).lower()


# ---------------------------------------------------------------- the checks

def check_os(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = f"RHEL, Rocky Linux, AlmaLinux or Oracle Linux {req.os.major}.x"
    remedy = (f"This node does not run RHEL {req.os.major} or a rebuild; take it out of the pool "
              f"(change the labels the pool selects) or reinstall it with RHEL {req.os.major}.")
    facts = os_facts(host)
    if not facts.ok:
        return unknown_result("os", facts.reason, expected, True)
    os_id, version, pretty = facts.value
    if os_id in RHEL_FAMILY_IDS and version.split(".")[0] == str(req.os.major):
        return CheckResult("os", Status.PASS, pretty, expected, "", True)
    return CheckResult("os", Status.FAIL, pretty, expected, remedy, True)


def os_facts(host: HostView) -> Read[tuple[str, str, str]]:
    """(ID, VERSION_ID, pretty name) from /etc/os-release, falling back to /etc/redhat-release."""
    reasons = []
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = host.read_text(path)
        if not text.ok:
            reasons.append(text.reason)
            continue
        fields = parse_os_release(text.value)
        if "ID" in fields and "VERSION_ID" in fields:
            pretty = fields.get("PRETTY_NAME") or f"{fields.get('NAME', fields['ID'])} {fields['VERSION_ID']}"
            return Read((fields["ID"].lower(), fields["VERSION_ID"], pretty))
        reasons.append(f"{path}: no ID or VERSION_ID (garbled?)")
    release = host.read_text("/etc/redhat-release")
    if release.ok:
        match = re.match(r"(.+?) release (\d+(?:\.\d+)*)", release.value.strip())
        if match:
            name = match.group(1).lower()
            os_id = ("rhel" if name.startswith("red hat enterprise linux") else
                     "rocky" if name.startswith("rocky") else "almalinux" if name.startswith("alma") else
                     "ol" if name.startswith("oracle linux") else name)
            return Read((os_id, match.group(2), release.value.strip()))
        reasons.append("/etc/redhat-release: no 'release <version>'")
    else:
        reasons.append(release.reason)
    return Read.missing("; ".join(reasons))


def nouveau_blacklisted(host: HostView) -> tuple[bool, list[str]]:
    where = []
    for directory in ("/etc/modprobe.d", "/usr/lib/modprobe.d", "/run/modprobe.d"):
        for path in host.glob(directory, "*.conf"):
            text = host.read_text(path, allow_empty=True)
            if text.ok and re.search(r"^\s*blacklist\s+nouveau\s*$", text.value, re.MULTILINE):
                where.append(path)
    cmdline = host.read_text("/proc/cmdline")
    if cmdline.ok and re.search(r"(^|\s)(rd\.driver\.blacklist|modprobe\.blacklist)=(\S*,)?nouveau(,|\s|$)",
                                cmdline.value):
        where.append("/proc/cmdline")
    return bool(where), where


def check_nouveau(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = "nouveau not loaded and blacklisted"
    # Only the blacklist file and rd.driver.blacklist: NVIDIA's nvidia-kmod-common strips
    # nouveau.modeset=0 from the kernel command line on EL8 (its %post --remove-args).
    remedy = ("printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > /etc/modprobe.d/blacklist-nouveau.conf && "
              "grubby --update-kernel=ALL --args=rd.driver.blacklist=nouveau && "
              "dracut --force && systemctl reboot")
    modules = host.read_text("/proc/modules")
    if not modules.ok:
        return unknown_result("nouveau", modules.reason, expected, True)
    loaded = "nouveau" in parse_proc_modules(modules.value)
    blacklisted, where = nouveau_blacklisted(host)
    if loaded:
        observed = "nouveau is loaded (/proc/modules)" + ("" if blacklisted else " and not blacklisted")
        return CheckResult("nouveau", Status.FAIL, observed, expected, remedy, True)
    if not blacklisted:
        return CheckResult("nouveau", Status.WARN, "nouveau not loaded, but not blacklisted either: it may take "
                           "the GPU on a boot where nvidia loads late", expected, remedy, True)
    return CheckResult("nouveau", Status.PASS, f"not loaded; blacklisted in {', '.join(where)}", expected, "", True)


def secure_boot_remedy(req: NodeRequirements) -> str:
    # dkms >= 3 signs what it builds with /var/lib/dkms/mok.key; NVIDIA's precompiled kmods are
    # signed with NVIDIA's key (NVIDIA/yum-packaging-precompiled-kmod, UEFI.md).
    return ("Under Secure Boot RHEL loads only modules signed by an enrolled key. DKMS module: "
            "mokutil --import /var/lib/dkms/mok.pub (choose a one-time password), systemctl reboot, "
            "enroll the key in MokManager at the console, then modprobe nvidia. "
            "Or use NVIDIA's precompiled kmod, signed by NVIDIA, after enrolling NVIDIA's key: "
            "curl -fLO https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/NVIDIA2019-public_key.der && "
            "mokutil --import NVIDIA2019-public_key.der && dnf module reset -y nvidia-driver && "
            f"dnf module install -y nvidia-driver:{driver_branch(req)} && systemctl reboot (enroll the key in MokManager)")


def installed_module(host: HostView) -> str | None:
    """The nvidia module modprobe would load for the running kernel (precompiled kmod or DKMS-installed)."""
    running = running_kernel(host)
    return _find_module_file(host, f"/lib/modules/{running.value[0]}") if running.ok else None


def check_nvidia_module(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = "nvidia kernel module loaded"
    branch = driver_branch(req)
    remedy = (f"dnf config-manager --add-repo https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo && "
              f"dnf module install -y nvidia-driver:{branch}-dkms && modprobe nvidia")
    version = kernel_module_version(host)
    if version.ok:
        return CheckResult("nvidia-module", Status.PASS, f"nvidia {version.value} loaded", expected, "", True)
    if host.exists("/proc/driver/nvidia/version"):
        return unknown_result("nvidia-module", version.reason, expected, True)
    modules = host.read_text("/proc/modules")
    if not modules.ok:
        return unknown_result("nvidia-module", f"{version.reason}; {modules.reason}", expected, True)
    if "nvidia" in parse_proc_modules(modules.value):
        return unknown_result("nvidia-module", f"nvidia is in /proc/modules but {version.reason}", expected, True)
    observed = "nvidia not loaded (/proc/driver/nvidia/version absent)"
    present = installed_module(host)
    secure_boot = secure_boot_state(host)
    if present and secure_boot.ok and secure_boot.value:
        return CheckResult("nvidia-module", Status.FAIL, f"{observed}; Secure Boot is on and {present} is installed: "
                           "the module is probably unsigned, or its signing key is not enrolled (RHEL refuses to "
                           "load it: 'Key was rejected by service')", expected, secure_boot_remedy(req), True)
    if present:
        return CheckResult("nvidia-module", Status.FAIL, f"{observed}, though {present} is installed", expected,
                           "modprobe nvidia; if that fails, its reason is in: journalctl -k -b | grep -iE 'nvidia|nvrm'",
                           True)
    running = running_kernel(host)
    if running.ok:
        kernel, arch = running.value
        built = [b for b in dkms_builds(host, kernel, arch)[0] if b.built and not b.installed]
        if built:
            return CheckResult("nvidia-module", Status.FAIL, f"{observed}; DKMS built {built[0].package} "
                               f"{built[0].version} for {kernel} but never installed it", expected,
                               f"dkms install {built[0].package}/{built[0].version} -k $(uname -r) && modprobe nvidia",
                               True)
    return CheckResult("nvidia-module", Status.FAIL, observed, expected, remedy, True)


def check_driver_version(host: HostView, req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    required = req.min_driver_version is not None
    expected = f">= {req.min_driver_version}" if required else "any"
    remedy = (f"dnf module reset -y nvidia-driver && dnf module install -y nvidia-driver:{driver_branch(req)}-dkms "
              "&& systemctl reboot")
    version = kernel_module_version(host)
    observed = version.value if version.ok else (gpu.value.driver_version if gpu.ok else None)
    if observed is None:
        return unknown_result("driver-version", version.reason, expected, required)
    if not required or version_tuple(observed) >= version_tuple(req.min_driver_version):
        return CheckResult("driver-version", Status.PASS, observed, expected, "", required)
    return CheckResult("driver-version", Status.FAIL, observed, expected, remedy, required)


def check_nvml(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = "user-space libnvidia-ml version == kernel module version"
    remedy = ("Reboot the node (systemctl reboot), or reload the modules in order: systemctl stop nvidia-persistenced; "
              "rmmod nvidia_drm nvidia_modeset nvidia_uvm nvidia; modprobe nvidia; systemctl start nvidia-persistenced")
    kernel = kernel_module_version(host)
    if not kernel.ok:
        return unknown_result("nvml", f"kernel module version unknown: {kernel.reason}", expected, True)
    libraries = user_space_library_versions(host, "libnvidia-ml.so", DEFAULT_LIB_DIRS + EXTRA_LIB_DIRS)
    if not libraries:
        if not any(host.is_dir(d) for d in DEFAULT_LIB_DIRS):
            return unknown_result("nvml", "/usr/lib64 not visible", expected, True)
        return CheckResult("nvml", Status.FAIL, f"kernel module {kernel.value}; no libnvidia-ml.so installed",
                           expected, f"dnf module install -y nvidia-driver:{kernel.value.split('.')[0]}-dkms", True)
    directory, versions = next(iter(libraries.items()))
    loaded = versions[0]
    if loaded == kernel.value:
        return CheckResult("nvml", Status.PASS, f"kernel module and {directory}/libnvidia-ml.so both {loaded}",
                           expected, "", True)
    return CheckResult("nvml", Status.FAIL, f"kernel module {kernel.value}, {directory}/libnvidia-ml.so {loaded}: "
                       "NVML fails with 'Driver/library version mismatch'", expected, remedy, True)


def _find_module_file(host: HostView, top: str, depth: int = 6) -> str | None:
    listing = host.list_dir(top)
    if not listing.ok:
        return None
    for name in listing.value:
        path = f"{top}/{name}"
        if re.fullmatch(r"nvidia\.ko(\.xz|\.gz|\.zst)?", name):
            return path
    if depth:
        for name in listing.value:
            path = f"{top}/{name}"
            if not host.link_target(path).ok and host.is_dir(path):  # skip build/source links
                found = _find_module_file(host, path, depth - 1)
                if found:
                    return found
    return None


# DKMS package names of NVIDIA's proprietary and open kernel modules (kmod-nvidia-latest-dkms
# and kmod-nvidia-open-dkms): /var/lib/dkms/<package>/<version>/<kernel>/<arch>/module/nvidia.ko*.
DKMS_PACKAGES = ("nvidia", "nvidia-open")


@dataclass(frozen=True)
class DkmsBuild:
    package: str
    version: str
    kernels: tuple[str, ...]     # kernels it was built for
    built: bool                  # a module was built for the running kernel
    installed: bool              # ... and `dkms install` put it under /lib/modules (dkms status: installed)
    failed_log: str | None       # build/make.log a failed build left behind


def running_kernel(host: HostView) -> Read[tuple[str, str]]:
    """(release, arch) of the running kernel."""
    release = host.read_text("/proc/sys/kernel/osrelease")
    if not release.ok:
        return release  # type: ignore[return-value]
    kernel = release.value.strip()
    arch = kernel.rsplit(".", 1)[-1] if kernel.endswith((".x86_64", ".aarch64")) else "x86_64"
    return Read((kernel, arch))


def dkms_builds(host: HostView, kernel: str, arch: str) -> tuple[list[DkmsBuild], bool]:
    """What DKMS holds for NVIDIA's modules, and whether any of its trees was readable.
    `dkms install` records an install as the link /var/lib/dkms/<package>/kernel-<kernel>-<arch>
    -> <version>/<kernel>/<arch>; a build alone (dkms status: built) leaves the module in the tree
    where modprobe never looks."""
    builds: list[DkmsBuild] = []
    readable = False
    for package in DKMS_PACKAGES:
        top = f"/var/lib/dkms/{package}"
        listing = host.list_dir(top)
        if not listing.ok:
            continue
        readable = True
        link = host.link_target(f"{top}/kernel-{kernel}-{arch}")
        for version in listing.value:
            if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
                continue  # kernel-<release>-<arch> links and 'original_module'
            entries = host.list_dir(f"{top}/{version}")
            # build/ is where DKMS compiles (a failed build stays there); source links the sources.
            kernels = tuple(k for k in entries.value if k not in ("source", "build")) if entries.ok else ()
            built = kernel in kernels and _find_module_file(host, f"{top}/{version}/{kernel}/{arch}/module", 0) is not None
            installed = built and link.ok and link.value.rstrip("/") == f"{version}/{kernel}/{arch}"
            log = f"{top}/{version}/build/make.log"
            builds.append(DkmsBuild(package, version, kernels, built, installed,
                                    log if entries.ok and "build" in entries.value and host.exists(log) else None))
    return builds, readable


def check_dkms(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = "nvidia module built and installed for the running kernel"
    running = running_kernel(host)
    if not running.ok:
        return unknown_result("dkms", running.reason, expected, True)
    kernel, arch = running.value
    remedy = (f"dnf install -y kernel-devel-{kernel} kernel-headers-{kernel} && dkms autoinstall -k {kernel}; "
              "then hold the kernel until the driver follows: dnf install -y python3-dnf-plugin-versionlock && "
              "dnf versionlock add kernel kernel-core kernel-modules kernel-devel")
    module_version = kernel_module_version(host)
    builds, readable = dkms_builds(host, kernel, arch)
    for build in builds:
        if build.installed and (not module_version.ok or module_version.value == build.version):
            return CheckResult("dkms", Status.PASS, f"DKMS installed {build.package} {build.version} for {kernel}",
                               expected, "", True)
    packaged = _find_module_file(host, f"/lib/modules/{kernel}")
    if packaged:
        return CheckResult("dkms", Status.PASS, f"nvidia module for {kernel} at {packaged}", expected, "", True)
    if not readable and not host.is_dir(f"/lib/modules/{kernel}") and not host.is_dir("/lib/modules"):
        return unknown_result("dkms", "neither /var/lib/dkms nor /lib/modules visible", expected, True)
    built = [b for b in builds if b.built]
    if built:
        b = built[0]
        return CheckResult("dkms", Status.FAIL,
                           f"running {kernel}; DKMS built {b.package} {b.version} for it but did not install it "
                           f"(dkms status: built; no nvidia module under /lib/modules/{kernel}), so modprobe cannot load it",
                           expected, f"dkms install {b.package}/{b.version} -k $(uname -r) && modprobe nvidia", True)
    if builds:
        others = "; ".join(f"{b.package} {b.version} for {', '.join(b.kernels) or 'no kernel'}" for b in builds)
        observed = f"running {kernel}; DKMS built {others}"
        logs = [b.failed_log for b in builds if b.failed_log]
        if logs:
            observed += f" (a failed build left {logs[0]})"
            remedy = f"Read {logs[0]} for why the build failed; then {remedy}"
    else:
        observed = f"running {kernel}; no nvidia module for it (no DKMS build, none under /lib/modules/{kernel})"
    return CheckResult("dkms", Status.FAIL, observed, expected, remedy, True)


def driver_cuda(host: HostView, gpu: Read[GpuFacts]) -> Read[tuple[str | None, str, bool]]:
    """(newest CUDA the loaded driver supports, where that comes from, driver newer than the table).
    What NVML / nvidia-smi report is taken only when it agrees with the loaded module
    (/proc/driver/nvidia/version): an XML file from another driver, or a CUDA version the loaded
    driver cannot have, is judged by NVIDIA's table for the loaded driver instead."""
    kernel = kernel_module_version(host)
    driver = kernel.value if kernel.ok else (gpu.value.driver_version if gpu.ok else None)
    reported = gpu.value.cuda_version if gpu.ok else None
    if not driver:
        return Read.missing(f"driver version unknown: {kernel.reason}")
    table, beyond = driver_max_cuda(driver)
    if not reported:
        return Read((table, f"driver {driver} supports CUDA up to {table or 'none known'} (NVIDIA's table)", beyond))
    said = f"{gpu.value.source} says driver {gpu.value.driver_version or '?'}, CUDA {reported}"
    if kernel.ok and gpu.value.driver_version and gpu.value.driver_version != kernel.value:
        return Read((table, f"{said}, but the loaded module is {kernel.value} (stale output?); judged by "
                     f"NVIDIA's table: up to {table or 'none known'}", beyond))
    if kernel.ok and not beyond and (table is None or version_tuple(reported) > version_tuple(table)):
        return Read((table, f"{said}, more than driver {kernel.value} supports; judged by NVIDIA's table: "
                     f"up to {table or 'none known'}", beyond))
    return Read((reported, f"driver {driver} reports CUDA {reported} ({gpu.value.source})", False))


def check_cuda(host: HostView, req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    required = req.cuda_version is not None
    expected = f"driver supports CUDA >= {req.cuda_version}" if required else "any"
    facts = driver_cuda(host, gpu)
    if not facts.ok:
        return unknown_result("cuda", facts.reason, expected, required)
    max_cuda, source, beyond = facts.value
    driver = kernel_module_version(host).value or (gpu.value.driver_version if gpu.ok else None)
    if not required:
        return CheckResult("cuda", Status.PASS, source, expected, "", False)
    if max_cuda and version_tuple(max_cuda) >= version_tuple(req.cuda_version):
        return CheckResult("cuda", Status.PASS, source, expected, "", True)
    if beyond:
        return unknown_result("cuda", f"driver {driver} is newer than rankops' driver/CUDA table", expected, True,
                        "Check `nvidia-smi` for the CUDA version, or run the validator with --nvidia-smi-xml.")
    return CheckResult("cuda", Status.FAIL, source, expected,
                       f"Upgrade the driver to a branch that supports CUDA {req.cuda_version}: dnf module reset -y "
                       "nvidia-driver && dnf module install -y nvidia-driver:latest-dkms && systemctl reboot; "
                       f"or build the models for CUDA <= {max_cuda}", True)


def secure_boot_state(host: HostView) -> Read[bool]:
    if not host.is_dir("/sys/firmware"):
        return Read.missing("/sys/firmware not visible")
    if not host.is_dir("/sys/firmware/efi"):
        return Read(False)  # legacy BIOS boot: no Secure Boot
    variables = host.list_dir("/sys/firmware/efi/efivars")
    if not variables.ok or not variables.value:
        return Read.missing("efivarfs not mounted at /sys/firmware/efi/efivars")
    raw = host.read_bytes(SECURE_BOOT_VAR)
    if not raw.ok:
        return Read(False) if raw.reason.endswith("not found") else raw  # no variable: firmware without it
    if len(raw.value) < 5:  # 4 attribute bytes, then the value byte
        return Read.missing(f"{SECURE_BOOT_VAR}: {len(raw.value)} bytes, expected 5")
    return Read(raw.value[4] == 1)


def check_secure_boot(host: HostView, req: NodeRequirements) -> CheckResult:
    required = req.secure_boot_signed_modules
    expected = "Secure Boot off, or the nvidia module signed"
    remedy = secure_boot_remedy(req)
    state = secure_boot_state(host)
    if not state.ok:
        return unknown_result("secure-boot", state.reason, expected, required)
    if not state.value:
        return CheckResult("secure-boot", Status.PASS, "Secure Boot off", expected, "", required)
    taint = host.read_text("/sys/module/nvidia/taint", allow_empty=True)
    present = installed_module(host) if not taint.ok and not host.exists("/proc/driver/nvidia/version") else None
    if present:
        # RHEL never loads an unsigned module under Secure Boot, so there is no taint to read:
        # an installed module that is not loaded is the signature failing.
        return CheckResult("secure-boot", Status.FAIL if required else Status.WARN,
                           f"Secure Boot on; {present} installed but not loaded: probably unsigned, or its signing "
                           "key not enrolled", expected, remedy, required)
    if not taint.ok:
        return unknown_result("secure-boot", f"Secure Boot on; cannot tell whether nvidia is signed ({taint.reason})",
                        expected, required, remedy)
    if "E" in taint.value:
        return CheckResult("secure-boot", Status.FAIL if required else Status.WARN,
                           f"Secure Boot on; nvidia module unsigned (taint flags '{taint.value.strip()}')",
                           expected, remedy, required)
    return CheckResult("secure-boot", Status.PASS, "Secure Boot on; nvidia module signed", expected, "", required)


def check_selinux(host: HostView, req: NodeRequirements) -> CheckResult:
    required = req.selinux_container_use_devices
    expected = "SELinux not enforcing, or container_use_devices on"
    remedy = "setsebool -P container_use_devices on"
    enforce = host.read_text("/sys/fs/selinux/enforce")
    if not enforce.ok:
        if enforce.reason.endswith("not found") and not host.is_dir("/sys/fs/selinux") and host.is_dir("/sys/fs"):
            return CheckResult("selinux", Status.PASS, "SELinux disabled", expected, "", required)
        return unknown_result("selinux", enforce.reason, expected, required)
    mode = enforce.value.strip()
    if mode not in ("0", "1"):
        return unknown_result("selinux", f"/sys/fs/selinux/enforce: {mode!r}, expected 0 or 1", expected, required)
    boolean = host.read_text("/sys/fs/selinux/booleans/container_use_devices")
    values = boolean.value.split() if boolean.ok else []
    if boolean.ok and (len(values) != 2 or not all(v in ("0", "1") for v in values)):
        return unknown_result("selinux", f"/sys/fs/selinux/booleans/container_use_devices: {boolean.value.strip()!r}, "
                        "expected 'current pending' such as '1 1'", expected, required)
    on = boolean.ok and values[0] == "1"
    if mode == "0":
        if on:
            return CheckResult("selinux", Status.PASS, "permissive; container_use_devices on", expected, "", required)
        return CheckResult("selinux", Status.WARN, "permissive; container_use_devices off (GPU pods break once "
                           "SELinux enforces)", expected, remedy, required)
    if not boolean.ok:
        return unknown_result("selinux", f"enforcing; {boolean.reason} (is container-selinux installed?)",
                        expected, required, f"dnf install -y container-selinux && {remedy}")
    if on:
        return CheckResult("selinux", Status.PASS, "enforcing; container_use_devices on", expected, "", required)
    return CheckResult("selinux", Status.FAIL if required else Status.WARN,
                       "enforcing; container_use_devices off", expected, remedy, required)


# RKE2 runs its own containerd and writes its config here on every start; admins and the GPU
# Operator put changes in config.toml.tmpl (containerd 2.0 releases: config-v3.toml.tmpl).
RKE2_CONTAINERD = "/var/lib/rancher/rke2/agent/etc/containerd"
# CRI-O's hooks_dir defaults; the GPU Operator writes its hook under /run (lost at reboot, rewritten).
OCI_HOOK_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d", "/run/containers/oci/hooks.d")


def _toml(host: HostView, path: str) -> Read[dict]:
    text = host.read_text(path, allow_empty=True)
    if not text.ok:
        return text  # type: ignore[return-value]
    source = text.value
    if path.endswith(".tmpl"):
        # A Go template: RKE2's documented form starts with {{ template "base" . }}; the
        # directive lines are not TOML, the rest is.
        source = re.sub(r"^\s*\{\{.*\}\}\s*$", "", source, flags=re.MULTILINE)
    try:
        return Read(tomllib.loads(source))
    except tomllib.TOMLDecodeError as exc:
        return Read.missing(f"{path}: not valid TOML ({exc})")


def _nvidia_runtime_in(tables: Any) -> bool:
    """True where some `runtimes` table has an nvidia entry or points at nvidia-container-runtime."""
    if not isinstance(tables, dict):
        return False
    runtimes = tables.get("runtimes")
    if isinstance(runtimes, dict):
        for name, runtime in runtimes.items():
            if "nvidia" in name or "nvidia-container-runtime" in json.dumps(runtime):
                return True
    return any(_nvidia_runtime_in(value) for value in tables.values() if isinstance(value, dict))


def _cdi_spec(host: HostView, path: str) -> Read[str]:
    text = host.read_text(path)
    if not text.ok:
        return text
    try:
        spec = yaml.safe_load(text.value)
    except yaml.YAMLError as exc:
        return Read.missing(f"{path}: not valid YAML/JSON ({exc.__class__.__name__})")
    if not isinstance(spec, dict) or not str(spec.get("kind", "")).startswith("nvidia.com/"):
        return Read(None)
    if not spec.get("devices"):
        return Read.missing(f"{path}: CDI spec for {spec['kind']} lists no devices")
    return Read(f"CDI spec {path} ({spec['kind']}, {len(spec['devices'])} devices)")


def check_container_toolkit(host: HostView, req: NodeRequirements) -> CheckResult:
    required = req.container_toolkit
    expected = "NVIDIA runtime configured for CRI-O/containerd/podman, or a CDI spec for the GPUs"
    evidence: list[str] = []
    problems: list[str] = []
    crio_files = ["/etc/crio/crio.conf"] + host.glob("/etc/crio/crio.conf.d", "*")
    for path in crio_files:
        parsed = _toml(host, path)
        if parsed.ok and _nvidia_runtime_in(parsed.value.get("crio", {})):
            evidence.append(f"CRI-O runtime in {path}")
        elif not parsed.ok and not parsed.reason.endswith("not found"):
            problems.append(parsed.reason)
    containerd_files = (["/etc/containerd/config.toml"] + host.glob("/etc/containerd/conf.d", "*.toml") +
                        [f"{RKE2_CONTAINERD}/{name}" for name in ("config.toml", "config.toml.tmpl", "config-v3.toml.tmpl")])
    for path in containerd_files:
        parsed = _toml(host, path)
        if parsed.ok and _nvidia_runtime_in(parsed.value.get("plugins", {})):
            evidence.append(f"containerd runtime in {path}")
        elif not parsed.ok and not parsed.reason.endswith("not found"):
            problems.append(parsed.reason)
    for directory in OCI_HOOK_DIRS:
        for path in host.glob(directory, "*.json"):
            text = host.read_text(path)
            if text.ok and "nvidia-container" in text.value:
                evidence.append(f"OCI hook {path}")
    seen_cdi = set()
    for directory in ("/etc/cdi", "/var/run/cdi", "/run/cdi"):
        for path in host.glob(directory, "*.yaml") + host.glob(directory, "*.json"):
            local = host.local_path(path)
            if local in seen_cdi:
                continue
            seen_cdi.add(local)
            spec = _cdi_spec(host, path)
            if spec.ok and spec.value:
                evidence.append(spec.value)
            elif not spec.ok:
                problems.append(spec.reason)
    installed = host.exists("/etc/nvidia-container-runtime/config.toml")
    install = ("dnf config-manager --add-repo https://nvidia.github.io/libnvidia-container/stable/rpm/"
               "nvidia-container-toolkit.repo && dnf install -y nvidia-container-toolkit && ")
    # Non-empty: the validator DaemonSet mounts this directory with DirectoryOrCreate, so the kubelet
    # leaves it empty on every node that is not RKE2's.
    if host.list_dir(RKE2_CONTAINERD).value:
        # RKE2 finds /usr/bin/nvidia-container-runtime when it starts and adds the nvidia runtime to
        # the config.toml it regenerates; nvidia-ctk's edits to that file would be overwritten.
        remedy = (install + "systemctl restart rke2-agent (rke2-server on a server node); then check "
                  f"grep -A3 nvidia {RKE2_CONTAINERD}/config.toml, and use runtimeClassName: nvidia")
    else:
        runtime = "containerd" if host.is_dir("/etc/containerd") and not host.is_dir("/etc/crio") else "crio"
        remedy = (install + f"nvidia-ctk runtime configure --runtime={runtime} && systemctl restart {runtime}; "
                  "for podman/CDI: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    if evidence:
        observed = "; ".join(evidence) + ("" if installed else " (no /etc/nvidia-container-runtime/config.toml)")
        return CheckResult("container-toolkit", Status.PASS, observed, expected, "", required)
    if problems:
        return unknown_result("container-toolkit", "; ".join(problems), expected, required, remedy)
    observed = ("nvidia-container-toolkit installed but no runtime configured and no CDI spec" if installed
                else "no NVIDIA container toolkit: no runtime entry, OCI hook or CDI spec")
    return CheckResult("container-toolkit", Status.FAIL if required else Status.WARN, observed, expected,
                       remedy, required)


def loader_dirs(host: HostView) -> Read[list[str]]:
    """Directories listed in /etc/ld.so.conf and /etc/ld.so.conf.d/*.conf."""
    dirs: list[str] = []
    reasons = []
    files = ["/etc/ld.so.conf"] + host.glob("/etc/ld.so.conf.d", "*.conf")
    for path in files:
        text = host.read_text(path, allow_empty=True)
        if not text.ok:
            reasons.append(text.reason)
            continue
        for line in text.value.splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("include") and line.startswith("/"):
                dirs.append(line.rstrip("/"))
    if reasons and not dirs and not host.list_dir("/etc/ld.so.conf.d").ok:
        return Read.missing("; ".join(reasons))
    return Read(dirs)


def check_libraries(host: HostView, req: NodeRequirements) -> CheckResult:
    expected = "libcuda and libnvidia-ml in a directory the dynamic loader searches"
    configured = loader_dirs(host)
    if not configured.ok:
        return unknown_result("libraries", configured.reason, expected, True)
    searched = list(DEFAULT_LIB_DIRS) + configured.value
    candidates = tuple(dict.fromkeys(searched + list(EXTRA_LIB_DIRS)))
    missing_libs = []
    unlisted = []
    found = []
    for library in ("libcuda.so", "libnvidia-ml.so"):
        where = user_space_library_versions(host, library, candidates)
        if not where:
            missing_libs.append(library)
            continue
        visible = [d for d in where if d in searched]
        if visible:
            found.append(f"{library} in {visible[0]}")
        else:
            unlisted.append((library, next(iter(where))))
    if missing_libs:
        return CheckResult("libraries", Status.FAIL, f"{', '.join(missing_libs)} not installed", expected,
                           "dnf module install -y nvidia-driver:latest-dkms (installs libcuda and libnvidia-ml)", True)
    if unlisted:
        dirs = sorted({d for _, d in unlisted})
        commands = " && ".join(f"echo {d} >> /etc/ld.so.conf.d/nvidia.conf" for d in dirs)
        return CheckResult("libraries", Status.FAIL,
                           "; ".join(f"{lib} only in {d}, which ld.so.conf does not list" for lib, d in unlisted),
                           expected, f"{commands} && ldconfig", True)
    return CheckResult("libraries", Status.PASS, "; ".join(found), expected, "", True)


def check_gpu_product(req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    required = bool(req.gpu_products)
    expected = f"one of {', '.join(req.gpu_products)}" if required else "any GPU"
    if not gpu.ok:
        return unknown_result("gpu-product", gpu.reason, expected, required,
                        "Run the validator where NVML works, or pass --nvidia-smi-xml with `nvidia-smi -q -x` output.")
    products = [g.product for g in gpu.value.gpus]
    observed = f"{len(products)} x {', '.join(sorted(set(products)))} ({gpu.value.source})"
    wanted = {normalise_product(p) for p in req.gpu_products}
    odd = sorted({p for p in products if normalise_product(p) not in wanted
                  and normalise_product(p).removeprefix("nvidia-") not in wanted})
    if not required or not odd:
        return CheckResult("gpu-product", Status.PASS, observed, expected, "", required)
    return CheckResult("gpu-product", Status.FAIL, observed, expected,
                       f"This node has {', '.join(odd)}; take it out of the pool or add the product to gpuProducts.",
                       required)


def check_gpu_memory(req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    required = req.min_gpu_memory_mib is not None
    expected = f">= {req.min_gpu_memory_mib} MiB per GPU" if required else "any"
    if not gpu.ok:
        return unknown_result("gpu-memory", gpu.reason, expected, required,
                        "Run the validator where NVML works, or pass --nvidia-smi-xml with `nvidia-smi -q -x` output.")
    sizes = [g.memory_mib for g in gpu.value.gpus]
    if any(size is None for size in sizes):
        unknown = sorted({g.product for g in gpu.value.gpus if g.memory_mib is None})
        return unknown_result("gpu-memory", f"memory of {', '.join(unknown)} unknown without NVML ({gpu.value.source})",
                        expected, required, "Run the validator where NVML works, or pass --nvidia-smi-xml.")
    sources = sorted({g.memory_source or gpu.value.source for g in gpu.value.gpus})
    observed = f"smallest GPU {min(sizes)} MiB ({', '.join(sources)})"
    if not required or min(sizes) >= req.min_gpu_memory_mib:
        return CheckResult("gpu-memory", Status.PASS, observed, expected, "", required)
    return CheckResult("gpu-memory", Status.FAIL, observed, expected,
                       "This node's GPUs are too small for the pool; take it out of the pool or lower minGpuMemoryMiB.",
                       required)


def check_gpu_health(req: NodeRequirements, gpu: Read[GpuFacts]) -> CheckResult:
    expected = "no uncorrectable ECC errors, below slowdown temperature, no hardware throttling"
    if not gpu.ok:
        return unknown_result("gpu-health", gpu.reason, expected, False, "Run the validator where NVML works.")
    if gpu.value.source.startswith("/proc"):
        return unknown_result("gpu-health", "temperature, throttling and ECC need NVML or nvidia-smi XML", expected, False,
                        "Run the validator where NVML works, or pass --nvidia-smi-xml.")
    failures, warnings = [], []
    for index, g in enumerate(gpu.value.gpus):
        if g.ecc_uncorrectable:
            failures.append(f"GPU {index}: {g.ecc_uncorrectable} uncorrectable ECC errors")
        limit = g.slowdown_temperature_c - 5 if g.slowdown_temperature_c else HOT_GPU_C
        if g.temperature_c is not None and g.temperature_c >= limit:
            warnings.append(f"GPU {index}: {g.temperature_c} C (slowdown at {g.slowdown_temperature_c or '?'} C)")
        if g.throttle_reasons:
            warnings.append(f"GPU {index}: throttling ({', '.join(g.throttle_reasons)})")
    remedy = ("Check cooling and airflow and the power supply (nvidia-smi -q -d TEMPERATURE,PERFORMANCE); after "
              "uncorrectable ECC errors drain the node and reset the GPU (nvidia-smi -r -i <index>) or replace it.")
    if failures:
        return CheckResult("gpu-health", Status.FAIL, "; ".join(failures + warnings), expected, remedy, False)
    if warnings:
        return CheckResult("gpu-health", Status.WARN, "; ".join(warnings), expected, remedy, False)
    temps = [g.temperature_c for g in gpu.value.gpus if g.temperature_c is not None]
    observed = f"healthy; hottest {max(temps)} C" if temps else "healthy"
    return CheckResult("gpu-health", Status.PASS, observed, expected, "", False)


Check = Callable[[HostView, NodeRequirements, Read[GpuFacts]], CheckResult]

# Order is the order a person fixes things in: OS, driver, then what sits on top of it.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("os", lambda h, r, g: check_os(h, r)),
    ("nouveau", lambda h, r, g: check_nouveau(h, r)),
    ("nvidia-module", lambda h, r, g: check_nvidia_module(h, r)),
    ("driver-version", check_driver_version),
    ("nvml", lambda h, r, g: check_nvml(h, r)),
    ("dkms", lambda h, r, g: check_dkms(h, r)),
    ("cuda", check_cuda),
    ("secure-boot", lambda h, r, g: check_secure_boot(h, r)),
    ("selinux", lambda h, r, g: check_selinux(h, r)),
    ("container-toolkit", lambda h, r, g: check_container_toolkit(h, r)),
    ("libraries", lambda h, r, g: check_libraries(h, r)),
    ("gpu-product", lambda h, r, g: check_gpu_product(r, g)),
    ("gpu-memory", lambda h, r, g: check_gpu_memory(r, g)),
    ("gpu-health", lambda h, r, g: check_gpu_health(r, g)),
)


def run_checks(host: HostView, requirements: NodeRequirements, gpu: Read[GpuFacts]) -> list[CheckResult]:
    from rankops.validator import latency  # imported here: it builds on this module's CheckResult

    results = []
    for check_id, check in CHECKS + latency.checks_for(requirements):
        try:
            results.append(check(host, requirements, gpu))
        except Exception as exc:  # a bug in one check must not cost the node its other verdicts
            results.append(unknown_result(check_id, f"check crashed: {exc.__class__.__name__}: {exc}", "", True,
                                    "Report this as a rankops bug, with the host files the check reads."))
    return results
