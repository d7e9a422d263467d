"""Real GPUs through NVML (nvidia-ml-py, `import pynvml`): discovery, topology and telemetry.

Every NVML call goes through `_call`, so a call this GPU or driver does not support becomes None (and
an entry in `errors`, which `discover` prints) instead of a crash.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import pynvml  # type: ignore[import-untyped,unused-ignore]

from nodeagent.topology import GpuInfo, GpuSample, fold_groups, gpu_type_from_name

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SYSFS_PCI = Path("/sys/bus/pci/devices")
KMSG = Path("/dev/kmsg")
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


def parse_xid_line(line: str) -> tuple[str, int] | None:
    """("0000:3b:00", 79) from a kernel log line "NVRM: Xid (PCI:0000:3b:00): 79, pid=…"."""
    match = _XID_LINE.search(line)
    if not match:
        return None
    return normalize_bus_id(match.group(1)), int(match.group(2))


class NvmlGpus:
    simulated = False

    def __init__(self, *, sysfs_pci: Path = SYSFS_PCI, kmsg: Path = KMSG) -> None:
        init_nvml()
        self.errors: dict[str, str] = {}
        self._sysfs_pci = sysfs_pci
        count = self._call("nvmlDeviceGetCount") or 0
        self._handles: list[Any] = []
        for index in range(count):
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                self._handles.append(handle)
        self._bus_ids = [self._bus_id(h) for h in self._handles]
        self._gpus = self._discover()
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

    def _discover(self) -> list[GpuInfo]:
        indices = range(len(self._handles))
        domains = fold_groups(indices, self._nvlink_edges(), "nvl")
        switches = fold_groups(indices, self._pcie_pairs(), "pcie")
        gpus = []
        for i, handle in enumerate(self._handles):
            name = self._call("nvmlDeviceGetName", handle)
            name = name.decode() if isinstance(name, bytes) else str(name or "unknown")
            uuid = self._call("nvmlDeviceGetUUID", handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid or f"GPU-unknown-{i}")
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=uuid,
                    name=name,
                    gpu_type=gpu_type_from_name(name),
                    memory_mb=int(memory.total // MIB) if memory is not None else 0,
                    nvlink_domain=domains[i],
                    pcie_switch=switches[i],
                    numa_node=self._numa_node(handle, self._bus_ids[i]),
                )
            )
        return gpus

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

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
        for gpu, handle in zip(self._gpus, self._handles, strict=True):
            util = self._call("nvmlDeviceGetUtilizationRates", handle)
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            temperature = self._call("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)
            power_mw = self._call("nvmlDeviceGetPowerUsage", handle)
            samples.append(
                GpuSample(
                    uuid=gpu.uuid,
                    index=gpu.index,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    memory_used_mb=int(memory.used // MIB) if memory is not None else None,
                    temperature_c=float(temperature) if temperature is not None else None,
                    power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
                    xid_errors=xids.get(gpu.index, []),
                )
            )
        return samples

    def close(self) -> None:
        if self._event_set is not None:
            self._call("nvmlEventSetFree", self._event_set)
        if self._kmsg_fd is not None:
            os.close(self._kmsg_fd)
        self._call("nvmlShutdown")
