"""NVML discovery and telemetry against a stubbed pynvml: canned devices, links, ancestors, errors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from nodeagent.telemetry import NvmlGpus, parse_xid_line

MIB = 1024 * 1024


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    bus: str  # as NVML writes it: "00000000:1B:00.0"
    links: list[str] = field(default_factory=list)  # remote bus ids of the enabled NVLinks
    name: str = "NVIDIA H100 80GB HBM3"
    numa: int | None = 0
    temperature: int | Exception = 40
    power_mw: int = 300_000


class FakeNvml:
    """Installs canned answers as pynvml's functions; handles are the GPU indices."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        gpus: list[FakeGpu],
        *,
        ancestor: dict[frozenset[int], int],
        events: list[tuple[int, int]] | None = None,
        events_supported: bool = True,
        nvlink_supported: bool = True,
    ) -> None:
        self.gpus = gpus
        self.ancestor = ancestor
        self.events = list(events or [])
        self.events_supported = events_supported
        self.nvlink_supported = nvlink_supported
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h}"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].bus.encode())

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=81559 * MIB, used=1000 * MIB * (h + 1))

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        numa = self.gpus[h].numa
        if numa is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if not self.nvlink_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if link < len(self.gpus[h].links) else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].links[link])

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        linked = self.gpus[b].bus in self.gpus[a].links
        return pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.ancestor.get(frozenset((a, b)), pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=10 * (h + 1), memory=5)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        value = self.gpus[h].temperature
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self.gpus[h].power_mw

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None: ...

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: str) -> None:
        if not self.events_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        device, code = self.events.pop(0)
        return SimpleNamespace(device=device, eventData=code, eventType=pynvml.nvmlEventTypeXidCriticalError)


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02X}:00.0"


def hgx(links: dict[int, list[str]], n: int = 4) -> list[FakeGpu]:
    return [FakeGpu(bus=bus(i), links=links.get(i, [])) for i in range(n)]


PAIRS = {
    frozenset((0, 1)): pynvml.NVML_TOPOLOGY_SINGLE,
    frozenset((2, 3)): pynvml.NVML_TOPOLOGY_MULTIPLE,
    frozenset((0, 2)): pynvml.NVML_TOPOLOGY_NODE,
}


def test_direct_nvlink_pairs_fold_into_two_domains(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({0: [bus(1)], 1: [bus(0)], 2: [bus(3)], 3: [bus(2)]}), ancestor=PAIRS)
    gpus = NvmlGpus(kmsg=tmp_path / "kmsg").gpus()
    assert [g.nvlink_domain for g in gpus] == ["nvl0", "nvl0", "nvl1", "nvl1"]


def test_gpus_linked_to_nvswitches_form_one_domain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    switches = [f"00000000:{0xA0 + s:02X}:00.0" for s in range(4)]
    FakeNvml(monkeypatch, hgx({i: switches for i in range(8)}, n=8), ancestor={})
    assert {g.nvlink_domain for g in NvmlGpus(kmsg=tmp_path / "kmsg").gpus()} == {"nvl0"}


def test_pcie_switch_groups_gpus_whose_common_ancestor_is_at_most_a_switch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    FakeNvml(monkeypatch, hgx({}), ancestor=PAIRS)
    gpus = NvmlGpus(kmsg=tmp_path / "kmsg").gpus()
    assert [g.pcie_switch for g in gpus] == ["pcie0", "pcie0", "pcie1", "pcie1"]
    assert [g.nvlink_domain for g in gpus] == ["nvl0", "nvl1", "nvl2", "nvl3"]


def test_p2p_status_is_the_nvlink_fallback_when_link_state_is_unsupported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    FakeNvml(monkeypatch, hgx({0: [bus(1)], 1: [bus(0)]}), ancestor={}, nvlink_supported=False)
    assert [g.nvlink_domain for g in NvmlGpus(kmsg=tmp_path / "kmsg").gpus()] == ["nvl0", "nvl0", "nvl1", "nvl2"]


def test_numa_node_falls_back_to_sysfs_when_nvml_does_not_say(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpus = hgx({}, n=2)
    gpus[1].numa = None
    (tmp_path / "0000:11:00.0").mkdir()
    (tmp_path / "0000:11:00.0" / "numa_node").write_text("1\n")
    FakeNvml(monkeypatch, gpus, ancestor={})
    found = NvmlGpus(sysfs_pci=tmp_path, kmsg=tmp_path / "kmsg").gpus()
    assert [g.numa_node for g in found] == [0, 1]


def test_discovery_reports_name_type_uuid_and_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=1), ancestor={})
    gpu = NvmlGpus(kmsg=tmp_path / "kmsg").gpus()[0]
    assert (gpu.index, gpu.uuid, gpu.name, gpu.gpu_type, gpu.memory_mb) == (
        0,
        "GPU-fake-0",
        "NVIDIA H100 80GB HBM3",
        "H100",
        81559,
    )


def test_telemetry_reads_every_metric(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={})
    sample = NvmlGpus(kmsg=tmp_path / "kmsg").sample({})[1]
    assert (sample.utilization_pct, sample.memory_used_mb, sample.temperature_c, sample.power_w) == (20.0, 2000, 40.0, 300.0)


def test_one_unsupported_metric_becomes_null_and_the_rest_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpus = hgx({}, n=2)
    gpus[1].temperature = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    FakeNvml(monkeypatch, gpus, ancestor={})
    source = NvmlGpus(kmsg=tmp_path / "kmsg")
    samples = source.sample({})
    assert [s.temperature_c for s in samples] == [40.0, None]
    assert samples[1].power_w == 300.0
    assert "NotSupported" in source.errors["nvmlDeviceGetTemperature"]


def test_xid_events_are_reported_once_on_their_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={}, events=[(1, 79), (1, 48)])
    source = NvmlGpus(kmsg=tmp_path / "kmsg")
    assert [s.xid_errors for s in source.sample({})] == [[], [79, 48]]
    assert [s.xid_errors for s in source.sample({})] == [[], []]


def test_xid_falls_back_to_polling_the_kernel_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,100,1,-;NVRM: Xid (PCI:0000:10:00): 13, old error before the agent started\n")
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={}, events_supported=False)
    source = NvmlGpus(kmsg=kmsg)
    with open(kmsg, "a") as log:
        log.write("4,101,2,-;NVRM: Xid (PCI:0000:11:00): 79, pid=1234, GPU has fallen off the bus.\n")
    os.sync()
    assert [s.xid_errors for s in source.sample({})] == [[], [79]]


def test_parse_xid_line_reads_bus_and_code() -> None:
    assert parse_xid_line("NVRM: Xid (PCI:0000:3b:00): 48, pid=7, DBE") == ("0000:3b:00", 48)
    assert parse_xid_line("usb 1-1: new device") is None


def test_discovery_and_telemetry_survive_every_call_being_unsupported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={})

    def unsupported(*args: Any) -> Any:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name in dir(FakeNvml):
        if name.startswith("nvmlDevice") and name not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"):
            monkeypatch.setattr(pynvml, name, unsupported)
    source = NvmlGpus(sysfs_pci=tmp_path, kmsg=tmp_path / "no-kmsg")
    assert [(g.index, g.name, g.memory_mb, g.numa_node) for g in source.gpus()] == [
        (0, "unknown", 0, None),
        (1, "unknown", 0, None),
    ]
    assert [s.utilization_pct for s in source.sample({})] == [None, None]
    assert {"nvmlDeviceGetName", "nvmlDeviceGetTemperature", "xid"} <= set(source.errors)
    source.close()
