"""MIG: instances found through a stubbed NVML, simulated MIG layouts and their checks, and the
MIG UUIDs a task's CUDA_VISIBLE_DEVICES names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.journal import TaskRecord
from nodeagent.simgpu import TopologyError, gpus_from_file, parse_mig_layout, simulated_gpus
from nodeagent.telemetry import NvmlGpus
from nodeagent.topology import mig_index, mig_profile_from_attributes, mig_profile_from_name
from tests.nodeagent.conftest import task_spec
from tests.nodeagent.test_nvml import MIB, FakeGpu, FakeNvml, bus, nvml_error


@dataclass(frozen=True)
class MigHandle:
    physical: int
    slot: int


class MigNvml(FakeNvml):
    """FakeNvml with MIG: `layout` maps a physical GPU in MIG mode to {slot: profile}; GPUs in
    `unsupported` answer NotSupported to nvmlDeviceGetMigMode, the others are MIG-capable but off."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        gpus: list[FakeGpu],
        *,
        layout: dict[int, dict[int, str]],
        unsupported: frozenset[int] = frozenset(),
        named: bool = True,
    ) -> None:
        self.layout = layout
        self.unsupported = unsupported
        self.named = named
        super().__init__(monkeypatch, gpus, ancestor={})

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        if h in self.unsupported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if h in self.layout else pynvml.NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, slot: int) -> MigHandle:
        if slot not in self.layout[h]:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return MigHandle(h, slot)

    def _profile(self, h: MigHandle) -> str:
        return self.layout[h.physical][h.slot]

    def nvmlDeviceGetName(self, h: Any) -> str:
        if isinstance(h, MigHandle):
            if not self.named:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return f"NVIDIA H100 80GB HBM3 MIG {self._profile(h)}"
        return super().nvmlDeviceGetName(h)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if isinstance(h, MigHandle):
            return f"MIG-fake-{h.physical}-{h.slot}"
        return super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        if isinstance(h, MigHandle):
            gb = int(self._profile(h).split(".")[1].removesuffix("gb"))
            return SimpleNamespace(total=gb * 1000 * MIB, used=(500 + h.slot) * MIB)
        return super().nvmlDeviceGetMemoryInfo(h)

    def nvmlDeviceGetAttributes(self, h: MigHandle) -> Any:
        slices = int(self._profile(h).split("g.")[0])
        return SimpleNamespace(gpuInstanceSliceCount=slices, memorySizeMB=9856 * slices)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        if isinstance(h, MigHandle):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetUtilizationRates(h)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        assert not isinstance(h, MigHandle), "a MIG instance has no power reading of its own"
        return super().nvmlDeviceGetPowerUsage(h)


def two_gpus() -> list[FakeGpu]:
    return [FakeGpu(bus=bus(0), links=[bus(1)]), FakeGpu(bus=bus(1), links=[bus(0)])]


# -- NVML ------------------------------------------------------------------------------------------


def test_a_mig_gpu_reports_its_instances_and_a_whole_gpu_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    MigNvml(monkeypatch, two_gpus(), layout={0: {0: "3g.40gb", 1: "3g.40gb"}})
    gpus = NvmlGpus(kmsg=tmp_path / "kmsg").gpus()
    assert [(g.index, g.uuid, g.gpu_type, g.mig_profile, g.parent_uuid, g.memory_mb) for g in gpus] == [
        (128, "MIG-fake-0-0", "H100.3g.40gb", "3g.40gb", "GPU-fake-0", 40000),
        (129, "MIG-fake-0-1", "H100.3g.40gb", "3g.40gb", "GPU-fake-0", 40000),
        (1, "GPU-fake-1", "H100", "", "", 81559),
    ]
    # The instances sit where their GPU sits in the topology.
    assert [(g.nvlink_domain, g.pcie_switch, g.numa_node) for g in gpus] == [
        ("nvl0", "pcie0", 0),
        ("nvl0", "pcie0", 0),
        ("nvl0", "pcie1", 0),
    ]


def test_a_gpu_without_mig_support_is_a_whole_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    MigNvml(monkeypatch, two_gpus(), layout={}, unsupported=frozenset({0}))
    source = NvmlGpus(kmsg=tmp_path / "kmsg")
    assert [(g.index, g.gpu_type, g.mig_profile) for g in source.gpus()] == [(0, "H100", ""), (1, "H100", "")]
    assert "nvmlDeviceGetMigMode" not in source.errors  # NotSupported is the usual answer, not an error


def test_an_empty_mig_slot_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    MigNvml(monkeypatch, two_gpus(), layout={0: {0: "1g.10gb", 3: "2g.20gb"}, 1: {6: "1g.10gb"}})
    gpus = NvmlGpus(kmsg=tmp_path / "kmsg").gpus()
    assert [(g.index, g.mig_profile) for g in gpus] == [(128, "1g.10gb"), (131, "2g.20gb"), (mig_index(1, 6), "1g.10gb")]
    assert mig_index(1, 6) == 142


def test_the_profile_comes_from_the_attributes_where_the_name_has_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    MigNvml(monkeypatch, two_gpus(), layout={0: {0: "1g.10gb", 1: "2g.20gb"}}, named=False)
    gpus = NvmlGpus(kmsg=tmp_path / "kmsg").gpus()
    assert [g.gpu_type for g in gpus] == ["H100.1g.10gb", "H100.2g.20gb", "H100"]


def test_mig_telemetry_gives_memory_and_no_utilisation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    MigNvml(monkeypatch, two_gpus(), layout={0: {0: "3g.40gb", 1: "3g.40gb"}})
    samples = {s.index: s for s in NvmlGpus(kmsg=tmp_path / "kmsg").sample({})}
    assert (samples[128].utilization_pct, samples[128].memory_used_mb, samples[128].power_w) == (None, 500, None)
    assert samples[129].memory_used_mb == 501
    assert samples[128].temperature_c == 40.0  # the board's
    assert (samples[1].utilization_pct, samples[1].power_w) == (20.0, 300.0)


def test_an_xid_on_a_mig_gpu_is_reported_on_its_instances(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = MigNvml(monkeypatch, two_gpus(), layout={0: {0: "3g.40gb", 1: "3g.40gb"}})
    source = NvmlGpus(kmsg=tmp_path / "kmsg")
    fake.events.append((0, 79))
    assert {s.index: s.xid_errors for s in source.sample({})} == {128: [79], 129: [79], 1: []}


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "3g.40gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", "1c.3g.40gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb"),
        ("NVIDIA H100 80GB HBM3", None),
    ],
)
def test_mig_profile_from_the_device_name(name: str, profile: str | None) -> None:
    assert mig_profile_from_name(name) == profile


def test_mig_profile_from_slices_and_memory() -> None:
    assert mig_profile_from_attributes(slices=3, memory_mb=40192) == "3g.40gb"
    assert mig_profile_from_attributes(slices=1, memory_mb=9856) == "1g.10gb"


# -- simulated MIG ---------------------------------------------------------------------------------


def test_a_sim_mig_layout_parses_per_gpu() -> None:
    assert parse_mig_layout("0:1g.10gb*7, 1:3g.40gb*2,1:1g.10gb") == {0: ["1g.10gb"] * 7, 1: ["3g.40gb"] * 2 + ["1g.10gb"]}


def test_simulated_mig_instances_look_like_real_ones() -> None:
    source = simulated_gpus(node="n1", simulate="2xH100", mig="0:1g.10gb*7")
    gpus = source.gpus()
    assert [g.index for g in gpus] == [1, *range(128, 135)]
    whole, first = gpus[0], gpus[1]
    assert (first.gpu_type, first.mig_profile, first.name) == ("H100.1g.10gb", "1g.10gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert first.uuid.startswith("MIG-") and len(first.uuid) == len("MIG-") + 36
    assert len({g.uuid for g in gpus}) == 8
    assert first.parent_uuid.startswith("GPU-") and first.parent_uuid != whole.uuid
    assert first.memory_mb == 81559 // 8
    assert (first.nvlink_domain, first.pcie_switch, first.numa_node) == ("nvl0", "pcie0", 0)
    # Stable: the same node and layout give the same UUIDs.
    assert [g.uuid for g in simulated_gpus(node="n1", simulate="2xH100", mig="0:1g.10gb*7").gpus()] == [g.uuid for g in gpus]


def test_simulated_mig_instances_follow_their_workloads_util_file(tmp_path: Path) -> None:
    util = tmp_path / "sim-util"
    util.write_text("80")
    source = simulated_gpus(node="n1", simulate="1xH100", mig="0:3g.40gb*2")
    samples = {s.index: s for s in source.sample({129: util})}
    assert (samples[128].utilization_pct, samples[129].utilization_pct) == (0.0, 80.0)
    assert samples[129].memory_used_mb == int(81559 * 4 // 8 * 0.9 * 0.8)


@pytest.mark.parametrize(
    ("gpus", "layout", "message"),
    [
        ("2xH100", "0:1g.10gb*", "bad --sim-mig part '0:1g.10gb\\*'"),
        ("2xH100", "0-1g.10gb", "bad --sim-mig part '0-1g.10gb'"),
        ("2xH100", "0:1g.10gb*9", "1 to 7 instances"),
        ("2xH100", "2:1g.10gb", "no GPU 2"),
        ("2xH100", "0:1g.5gb", "H100 has no MIG profile '1g.5gb'"),
        ("2xA100", "1:1g.20gb", "GPU 1: A100 has no MIG profile '1g.20gb'"),
        ("2xH100", "0:3g.40gb*3", "at most 2 × 3g.40gb, not 3"),
        ("2xH100", "1:4g.40gb,1:3g.40gb,1:1g.10gb", "GPU 1: 4g.40gb \\+ 3g.40gb \\+ 1g.10gb needs 8 compute"),
        ("2xH100", "0:1g.20gb*4,0:1g.10gb", "needs 5 compute and 9 memory slices"),
        ("2xH200", "0:1g.10gb", "GPU 0 is a H200; simulated MIG knows A100, H100"),
    ],
)
def test_a_wrong_sim_mig_layout_is_refused_naming_the_bad_part(gpus: str, layout: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        simulated_gpus(node="n1", simulate=gpus, mig=layout)


def test_full_legal_layouts_are_accepted() -> None:
    for layout in ("0:7g.80gb", "0:4g.40gb,0:3g.40gb", "0:2g.20gb*3,0:1g.10gb", "0:1g.20gb*4", "0:3g.40gb*2"):
        assert simulated_gpus(node="n1", simulate="1xA100" if "1g.20gb" not in layout else "1xH100", mig=layout).gpus()


def test_a_topology_file_gives_a_mig_layout_per_gpu(tmp_path: Path) -> None:
    path = tmp_path / "topo.json"
    path.write_text(
        json.dumps(
            {
                "gpus": [
                    {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920, "mig": ["3g.40gb", "4g.40gb"]},
                    {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920},
                ]
            }
        )
    )
    gpus = gpus_from_file(path, node="n1")
    assert [(g.index, g.gpu_type, g.memory_mb) for g in gpus] == [
        (1, "A100", 81920),
        (128, "A100.3g.40gb", 40960),
        (129, "A100.4g.40gb", 40960),
    ]


def test_a_wrong_mig_layout_in_a_topology_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "topo.json"
    path.write_text(json.dumps({"gpus": [{"index": 0, "mig": ["7g.80gb", "1g.10gb"]}]}))
    with pytest.raises(TopologyError, match=r"topo\.json: GPU 0: 7g\.80gb \+ 1g\.10gb needs 8 compute"):
        gpus_from_file(path, node="n1")
    path.write_text(json.dumps({"gpus": [{"index": 0, "mig": "1g.10gb"}]}))
    with pytest.raises(TopologyError, match="mig must be a list"):
        gpus_from_file(path, node="n1")


# -- CUDA_VISIBLE_DEVICES --------------------------------------------------------------------------


def env_for(tmp_path: Path, gpus: list[int], *, mig: str | None) -> dict[str, str]:
    source = simulated_gpus(node="node-m1", simulate="2xH100", mig=mig)
    agent = Agent(AgentConfig(portal="http://127.0.0.1:9", token="ynd_x", name="node-m1", state_dir=tmp_path), source)
    record = TaskRecord(
        task_id=7, attempt=1, job_id=107, kind="batch", launch_id="l", workdir=str(tmp_path / "w"), checkpoint_dir="c", gpus=gpus
    )
    return agent.workloads.task_env(task_spec(7, "true", gpus=gpus), record)


def test_a_task_on_mig_instances_sees_their_mig_uuids(tmp_path: Path) -> None:
    env = env_for(tmp_path, [129, 130], mig="0:1g.10gb*7")
    uuids = {g.index: g.uuid for g in simulated_gpus(node="node-m1", simulate="2xH100", mig="0:1g.10gb*7").gpus()}
    assert env["CUDA_VISIBLE_DEVICES"] == f"{uuids[129]},{uuids[130]}"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert env["YARD_NUM_GPUS"] == "2"


def test_a_task_on_whole_gpus_still_sees_indices(tmp_path: Path) -> None:
    assert env_for(tmp_path, [1], mig="0:1g.10gb*7")["CUDA_VISIBLE_DEVICES"] == "1"
    assert env_for(tmp_path, [0, 1], mig=None)["CUDA_VISIBLE_DEVICES"] == "0,1"
