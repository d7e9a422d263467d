"""Real GPUs through NVML (nvidia-ml-py, `import pynvml`): discovery, topology and telemetry; and the
host's CPU cores and memory, registered with them.

Every NVML call goes through `_call`, so a call this GPU or driver does not support becomes None (and
an entry in `errors`, which `discover` prints) instead of a crash.

A physical GPU in MIG mode is not reported itself: each of its MIG instances is, as a GPU of its own
(topology.mig_instance), with the parent's place in the topology. NVML gives most drivers' MIG
instances no utilisation and no power reading: those are None, the parent's temperature stands for
its instances', and an XID on the parent is reported on each of its instances.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import uuid
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import pynvml  # type: ignore[import-untyped,unused-ignore]

from nodeagent.topology import (
    MIG_MAX_PHYSICAL,
    MIG_SLOTS,
    GpuInfo,
    GpuSample,
    fold_groups,
    gpu_type_from_name,
    mig_instance,
    mig_profile_from_attributes,
    mig_profile_from_name,
)

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SYSFS_PCI = Path("/sys/bus/pci/devices")
KMSG = Path("/dev/kmsg")
MEMINFO = Path("/proc/meminfo")
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (\d+)")
# A remote NVLink end that is not one of our GPUs is an NVSwitch; a node's NVSwitches form one fabric.
_NVSWITCH = ("nvswitch",)


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why, for a person."""


def init_nvml() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
            why = "the NVML library (libnvidia-ml.so) was not found: no NVIDIA driver is installed"
        elif isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
            why = "the NVIDIA kernel driver is not loaded"
        else:
            why = f"NVML failed to initialise ({type(exc).__name__}: {exc})"
        raise NvmlUnavailable(f"No NVIDIA GPU can be used: {why}.") from exc


def host_cpus() -> int:
    """The cores this agent (and so the workloads it starts) may run on: its CPU affinity, which a
    cgroup or `taskset` may have narrowed below the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def host_memory_mb(meminfo: Path = MEMINFO) -> int:
    """MemTotal of /proc/meminfo in MiB; 0 (unknown) where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == "MemTotal":
                number, _, unit = rest.strip().partition(" ")
                return int(number) // 1024 if unit.strip() == "kB" else int(number) // MIB
    except (OSError, ValueError):
        pass
    return 0


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML says "00000000:3B:00.0", sysfs and the kernel log "0000:3b:00.0": compare one form."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    domain, _, rest = text.partition(":")
    if not rest:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def fabric_domain_of(info: Any) -> str:
    """A GPU's multi-node NVLink domain from its NVML fabric info (``nvmlDeviceGetGpuFabricInfo``):
    "<clusterUuid>/<cliqueId>", unique in the cluster; "" when it is in none (no fabric, the fabric
    manager has not finished registering it, or no cluster UUID)."""
    completed = getattr(pynvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3)
    if info is None or getattr(info, "state", None) != completed or getattr(info, "status", 0) != 0:
        return ""
    raw = bytes(info.clusterUuid)
    if len(raw) != 16 or not any(raw):
        return ""
    return f"{uuid.UUID(bytes=raw)}/{int(info.cliqueId)}"


def parse_xid_line(line: str) -> tuple[str, int] | None:
    """("0000:3b:00", 79) from a kernel log line "NVRM: Xid (PCI:0000:3b:00): 79, pid=…"."""
    match = _XID_LINE.search(line)
    if not match:
        return None
    return normalize_bus_id(match.group(1)), int(match.group(2))


class NvmlGpus:
    simulated = False

    def __init__(self, *, sysfs_pci: Path = SYSFS_PCI, kmsg: Path = KMSG, meminfo: Path = MEMINFO) -> None:
        init_nvml()
        self.errors: dict[str, str] = {}
        self.cpus = host_cpus()
        self.memory_mb = host_memory_mb(meminfo)
        self._sysfs_pci = sysfs_pci
        count = self._call("nvmlDeviceGetCount") or 0
        self._handles: list[Any] = []
        for index in range(count):
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                self._handles.append(handle)
        self._bus_ids = [self._bus_id(h) for h in self._handles]
        self.fabric_domain = self._fabric_domain()
        # What is reported: (GPU, its handle — a MIG device handle for an instance —, physical position).
        self._devices: list[tuple[GpuInfo, Any, int]] = self._discover()
        self._event_set: Any = None
        self._kmsg_fd: int | None = None
        self._setup_xid(kmsg)

    # -- calls -------------------------------------------------------------------------------------
    def _attempt(self, name: str, *args: Any) -> tuple[bool, Any]:
        """(True, pynvml.<name>(*args)), or (False, None) when it fails; the first failure of each
        call is kept in `errors`."""
        function: Callable[..., Any] | None = getattr(pynvml, name, None)
        if function is None:
            self.errors.setdefault(name, "not in this pynvml")
            return False, None
        try:
            return True, function(*args)
        except pynvml.NVMLError as exc:
            self.errors.setdefault(name, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # odd drivers raise odd things; discovery must go on
            self.errors.setdefault(name, f"{type(exc).__name__}: {exc}")
        return False, None

    def _call(self, name: str, *args: Any) -> Any:
        """pynvml.<name>(*args), or None when it fails."""
        return self._attempt(name, *args)[1]

    # -- discovery ---------------------------------------------------------------------------------
    def _fabric_domain(self) -> str:
        """The node's multi-node NVLink domain: its GPUs' common one (``fabric_domain_of``), or "".

        Most GPUs have none: NVML then answers NotSupported (or this driver lacks the call), which is
        not an error. GPUs of one node in different domains (a misconfigured fabric) give none."""
        function: Callable[..., Any] | None = getattr(pynvml, "nvmlDeviceGetGpuFabricInfo", None)
        if function is None:
            return ""
        quiet = {getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(pynvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)}
        domains: set[str] = set()
        for handle in self._handles:
            try:
                domains.add(fabric_domain_of(function(handle)))
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) in quiet:
                    return ""
                self.errors.setdefault("nvmlDeviceGetGpuFabricInfo", f"{type(exc).__name__}: {exc}")
                return ""
            except Exception as exc:  # odd drivers raise odd things; discovery must go on
                self.errors.setdefault("nvmlDeviceGetGpuFabricInfo", f"{type(exc).__name__}: {exc}")
                return ""
        if len(domains) > 1:
            self.errors.setdefault("nvmlDeviceGetGpuFabricInfo", f"GPUs in different fabric domains: {sorted(domains)}")
            return ""
        return next(iter(domains), "")

    def _bus_id(self, handle: Any) -> str | None:
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        return normalize_bus_id(pci.busId) if pci is not None else None

    def _numa_node(self, handle: Any, bus_id: str | None) -> int | None:
        numa = self._call("nvmlDeviceGetNumaNodeId", handle)
        if isinstance(numa, int) and numa >= 0:
            return numa
        if bus_id is None:
            return None
        try:
            value = int((self._sysfs_pci / bus_id / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def _nvlink_edges(self) -> list[tuple[Hashable, Hashable]]:
        index_of_bus = {bus: i for i, bus in enumerate(self._bus_ids) if bus is not None}
        edges: list[tuple[Hashable, Hashable]] = []
        any_state = False
        for i, handle in enumerate(self._handles):
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                state = self._call("nvmlDeviceGetNvLinkState", handle, link)
                if state is None:
                    # Links past the device's last one fail with InvalidArgument: stop asking.
                    break
                any_state = True
                if state != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                remote_bus = normalize_bus_id(remote.busId) if remote is not None else None
                peer = index_of_bus.get(remote_bus) if remote_bus else None
                edges.append((("gpu", i), ("gpu", peer) if peer is not None else _NVSWITCH))
        if not any_state:
            edges.extend(self._p2p_nvlink_edges())
        return edges

    def _p2p_nvlink_edges(self) -> list[tuple[Hashable, Hashable]]:
        """Fallback where per-link state is not exposed: ask NVML whether each pair talks over NVLink."""
        edges: list[tuple[Hashable, Hashable]] = []
        for i, a in enumerate(self._handles):
            for j in range(i + 1, len(self._handles)):
                status = self._call("nvmlDeviceGetP2PStatus", a, self._handles[j], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if status == pynvml.NVML_P2P_STATUS_OK:
                    edges.append((("gpu", i), ("gpu", j)))
        return edges

    def _pcie_pairs(self) -> list[tuple[Hashable, Hashable]]:
        pairs: list[tuple[Hashable, Hashable]] = []
        for i, a in enumerate(self._handles):
            for j in range(i + 1, len(self._handles)):
                level = self._call("nvmlDeviceGetTopologyCommonAncestor", a, self._handles[j])
                # Same board (INTERNAL), one switch (SINGLE) or a switch tree (MULTIPLE): one PCIe switch.
                if isinstance(level, int) and level <= pynvml.NVML_TOPOLOGY_MULTIPLE:
                    pairs.append((("gpu", i), ("gpu", j)))
        return pairs

    def _discover(self) -> list[tuple[GpuInfo, Any, int]]:
        indices = range(len(self._handles))
        domains = fold_groups(indices, self._nvlink_edges(), "nvl")
        switches = fold_groups(indices, self._pcie_pairs(), "pcie")
        devices: list[tuple[GpuInfo, Any, int]] = []
        for i, handle in enumerate(self._handles):
            name = _text(self._call("nvmlDeviceGetName", handle)) or "unknown"
            uuid = _text(self._call("nvmlDeviceGetUUID", handle)) or f"GPU-unknown-{i}"
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            gpu = GpuInfo(
                index=i,
                uuid=uuid,
                name=name,
                gpu_type=gpu_type_from_name(name),
                memory_mb=int(memory.total // MIB) if memory is not None else 0,
                nvlink_domain=domains[i],
                pcie_switch=switches[i],
                numa_node=self._numa_node(handle, self._bus_ids[i]),
            )
            if self._mig_enabled(handle):
                devices.extend((instance, mig, i) for instance, mig in self._mig_instances(gpu, handle, physical=i))
            else:
                devices.append((gpu, handle, i))
        return devices

    def _mig_enabled(self, handle: Any) -> bool:
        """Whether the GPU is in MIG mode now (a pending change counts only after the GPU resets)."""
        function: Callable[..., Any] | None = getattr(pynvml, "nvmlDeviceGetMigMode", None)
        if function is None:
            return False
        try:
            current, _pending = function(handle)
        except pynvml.NVMLError_NotSupported:
            return False  # not MIG-capable: the usual case, nothing to note
        except Exception as exc:
            self.errors.setdefault("nvmlDeviceGetMigMode", f"{type(exc).__name__}: {exc}")
            return False
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _mig_instances(self, parent: GpuInfo, handle: Any, *, physical: int) -> list[tuple[GpuInfo, Any]]:
        """The GPU's MIG instances as GPU entries, with their handles; empty slots are skipped."""
        if physical >= MIG_MAX_PHYSICAL:
            self.errors.setdefault("mig", f"GPU {physical} is in MIG mode, but only GPUs 0..15 can report MIG instances")
            return []
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        found: list[tuple[GpuInfo, Any]] = []
        for slot in range(min(int(count), MIG_SLOTS)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # no instance in this slot
            except Exception as exc:
                self.errors.setdefault("nvmlDeviceGetMigDeviceHandleByIndex", f"{type(exc).__name__}: {exc}")
                continue
            uuid = _text(self._call("nvmlDeviceGetUUID", mig))
            memory = self._call("nvmlDeviceGetMemoryInfo", mig)
            profile = mig_profile_from_name(_text(self._call("nvmlDeviceGetName", mig)) or "")
            attributes = self._call("nvmlDeviceGetAttributes", mig) if profile is None or memory is None else None
            if profile is None and attributes is not None:
                profile = mig_profile_from_attributes(
                    slices=int(attributes.gpuInstanceSliceCount), memory_mb=int(attributes.memorySizeMB)
                )
            if not uuid or profile is None:
                # Without its UUID no workload can be pointed at it; without its profile it has no type.
                self.errors.setdefault("mig", f"GPU {physical}: MIG instance {slot} skipped (no UUID or profile)")
                continue
            if memory is not None:
                memory_mb = int(memory.total // MIB)
            else:
                memory_mb = int(attributes.memorySizeMB) if attributes is not None else 0
            instance = mig_instance(parent, physical=physical, slot=slot, uuid=uuid, profile=profile, memory_mb=memory_mb)
            found.append((instance, mig))
        if not found:
            self.errors.setdefault("mig", f"GPU {physical} is in MIG mode with no MIG instances: it offers nothing to run on")
        return found

    def gpus(self) -> list[GpuInfo]:
        return [gpu for gpu, _, _ in self._devices]

    # -- XID errors --------------------------------------------------------------------------------
    def _setup_xid(self, kmsg: Path) -> None:
        event_set = self._call("nvmlEventSetCreate")
        registered = 0
        if event_set is not None:
            for handle in self._handles:
                ok, _ = self._attempt("nvmlDeviceRegisterEvents", handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered += ok
        if registered == len(self._handles) and event_set is not None:
            self._event_set = event_set
            return
        # Polling fallback: the driver logs every XID to the kernel log; read only what comes next.
        try:
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(fd, 0, os.SEEK_END)
            self._kmsg_fd = fd
        except OSError as exc:
            self.errors.setdefault("xid", f"no XID source: NVML events unsupported and {kmsg}: {exc}")

    def _poll_event_xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        for _ in range(1000):  # bounded: an XID storm must not stall the heartbeat
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, 0)
            except pynvml.NVMLError:
                break  # NVMLError_Timeout: nothing (more) pending
            index = self._call("nvmlDeviceGetIndex", data.device)
            if isinstance(index, int):
                found.setdefault(index, []).append(int(data.eventData))
        return found

    def _poll_kmsg_xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        if self._kmsg_fd is None:
            return found
        for _ in range(10000):
            try:
                record = os.read(self._kmsg_fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them: go on
                    continue
                break
            if not record:
                break
            # /dev/kmsg gives one record per read; a plain log file may give many lines.
            for line in record.decode(errors="replace").splitlines():
                parsed = parse_xid_line(line)
                if parsed is None:
                    continue
                bus, code = parsed
                for index, gpu_bus in enumerate(self._bus_ids):
                    if gpu_bus is not None and gpu_bus.startswith(bus):
                        found.setdefault(index, []).append(code)
        return found

    # -- telemetry ---------------------------------------------------------------------------------
    def sample(self, util_files: Mapping[int, Path]) -> list[GpuSample]:
        xids = self._poll_event_xids() if self._event_set is not None else self._poll_kmsg_xids()
        samples = []
        for gpu, handle, physical in self._devices:
            # On a MIG instance most drivers answer NotSupported for utilisation: it is then None.
            util = self._call("nvmlDeviceGetUtilizationRates", handle)
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            board = self._handles[physical]
            temperature = self._call("nvmlDeviceGetTemperature", board, pynvml.NVML_TEMPERATURE_GPU)
            # The board's power is not an instance's: left out rather than counted once per slice.
            power_mw = None if gpu.mig_profile else self._call("nvmlDeviceGetPowerUsage", handle)
            samples.append(
                GpuSample(
                    uuid=gpu.uuid,
                    index=gpu.index,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    memory_used_mb=int(memory.used // MIB) if memory is not None else None,
                    temperature_c=float(temperature) if temperature is not None else None,
                    power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
                    xid_errors=list(xids.get(physical, [])),
                )
            )
        return samples

    def close(self) -> None:
        if self._event_set is not None:
            self._call("nvmlEventSetFree", self._event_set)
        if self._kmsg_fd is not None:
            os.close(self._kmsg_fd)
        self._call("nvmlShutdown")
