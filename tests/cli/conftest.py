"""The CLI's tests: golden translations of job files, the API's answers to them, and the real `yard`
console script against a live server with real node agents on simulated GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The API tests' cast (two tenants, tokens) and the end-to-end harness (real agents), reused as they are.
from tests.api.conftest import _fresh_cache_and_roomy_throttle, cast  # noqa: F401
from tests.e2e.conftest import Harness, harness  # noqa: F401

FILES = Path(__file__).parent / "files"
GOLDEN = Path(__file__).parent / "golden"


def yard_executable() -> str:
    """The installed console script (pip install -e cli/), next to this interpreter first."""
    beside = Path(sys.executable).parent / "yard"
    found = str(beside) if beside.exists() else shutil.which("yard")
    if not found:
        pytest.fail("the `yard` console script is not installed: run .venv/bin/pip install -e cli/ (make venv does)")
    return found


@dataclass
class Yard:
    """Runs `yard` as a user would: a subprocess with YARD_URL and YARD_TOKEN, its own config directory."""

    url: str
    token: str
    home: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "YARD_URL": self.url,
            "YARD_TOKEN": self.token,
            "YARD_POLL_S": "0.3",
            "XDG_CONFIG_HOME": str(self.home),
            "COLUMNS": "200",
        }

    def run(self, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([yard_executable(), *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"yard {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [yard_executable(), *args], env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


@pytest.fixture
def roomy_throttle(settings: Any) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "10000/minute"}}


@pytest.fixture
def yard(harness: Harness, roomy_throttle: None, tmp_path: Path) -> Iterator[Yard]:  # noqa: F811
    home = tmp_path / "config"
    home.mkdir()
    yield Yard(url=harness.url, token=harness.api_token, home=home)
