"""The node's multi-node NVLink domain: configured (``fabric_domain``, ``--fabric-domain``) or read from
NVML's GPU fabric info ("<clusterUuid>/<cliqueId>"); none where NVML does not support it."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from nodeagent.__main__ import _parser
from nodeagent.config import build_config, load_toml
from nodeagent.telemetry import NvmlGpus, fabric_domain_of
from tests.nodeagent.test_nvml import FakeNvml, hgx

CLUSTER = uuid.UUID("12345678-1234-5678-9abc-def012345678")


def fabric_info(*, clique: int = 7, state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, raw: bytes = CLUSTER.bytes) -> Any:
    return SimpleNamespace(clusterUuid=list(raw), status=pynvml.NVML_SUCCESS, cliqueId=clique, state=state)


def test_fabric_info_names_cluster_uuid_and_clique() -> None:
    assert fabric_domain_of(fabric_info()) == f"{CLUSTER}/7"


def test_fabric_not_registered_or_without_cluster_uuid_is_none() -> None:
    assert fabric_domain_of(fabric_info(state=pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)) == ""
    assert fabric_domain_of(fabric_info(raw=bytes(16))) == ""
    assert fabric_domain_of(None) == ""


def test_nvml_gives_the_nodes_fabric_domain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={})
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfo", lambda h: fabric_info(), raising=False)
    source = NvmlGpus(sysfs_pci=tmp_path, kmsg=tmp_path / "kmsg", meminfo=tmp_path / "meminfo")
    assert source.fabric_domain == f"{CLUSTER}/7"


def test_gpus_without_fabric_support_give_none_and_no_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={})

    def unsupported(h: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfo", unsupported, raising=False)
    source = NvmlGpus(sysfs_pci=tmp_path, kmsg=tmp_path / "kmsg", meminfo=tmp_path / "meminfo")
    assert source.fabric_domain == ""
    assert "nvmlDeviceGetGpuFabricInfo" not in source.errors


def test_gpus_of_one_node_in_two_domains_give_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}, n=2), ancestor={})
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfo", lambda h: fabric_info(clique=h), raising=False)
    source = NvmlGpus(sysfs_pci=tmp_path, kmsg=tmp_path / "kmsg", meminfo=tmp_path / "meminfo")
    assert source.fabric_domain == ""
    assert "different fabric domains" in source.errors["nvmlDeviceGetGpuFabricInfo"]


def test_fabric_domain_from_the_config_file_and_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('fabric_domain = "nvl72-rack-4"\n')
    config = build_config(file_values=load_toml(path), cli_values={"portal": "http://p", "token": "t"})
    assert config.fabric_domain == "nvl72-rack-4"
    args = _parser().parse_args(["--fabric-domain", "nvl72-rack-5"])
    cli = {"portal": "http://p", "token": "t", "fabric_domain": args.fabric_domain}
    config = build_config(file_values=load_toml(path), cli_values=cli)
    assert config.fabric_domain == "nvl72-rack-5"
