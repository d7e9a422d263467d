"""The command line against the REAL NVML library: this machine has no GPU, so nvmlInit fails."""

from __future__ import annotations

import json
import subprocess
import sys

import pynvml
import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodeagent", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(autouse=True)
def _needs_a_machine_without_gpus() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return
    pynvml.nvmlShutdown()
    pytest.skip("this machine has a working NVML")


def test_agent_without_gpu_exits_with_a_plain_message_naming_the_simulate_option() -> None:
    result = run_cli("--portal", "http://127.0.0.1:9", "--token", "yen_x", "--name", "n1")
    assert result.returncode == 2
    assert "No NVIDIA GPU can be used" in result.stderr and "NVML" in result.stderr
    assert "--simulate 8xH100" in result.stderr
    assert "Traceback" not in result.stderr


def test_discover_without_gpu_gives_the_same_message() -> None:
    result = run_cli("discover")
    assert result.returncode == 2 and "--simulate" in result.stderr and "Traceback" not in result.stderr


def test_discover_with_simulated_gpus_prints_gpus_topology_and_a_sample_as_json() -> None:
    result = run_cli("discover", "--simulate", "8xH100", "--name", "n1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["simulated"] is True
    assert len(report["gpus"]) == 8 and len(report["sample"]) == 8
    assert {g["nvlink_domain"] for g in report["gpus"]} == {"nvl0"}


def test_missing_portal_is_a_usage_error_not_a_traceback() -> None:
    result = run_cli("--simulate", "8xH100", "--token", "yen_x")
    assert result.returncode == 2 and "--portal is required" in result.stderr
