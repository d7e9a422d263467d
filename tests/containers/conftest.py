"""Real parts for container tests: Debian's docker-registry on a loopback port, a tiny busybox image
built with umoci and pushed there with skopeo, and agents (tests/nodeagent's fixtures) that run it
with runc. Everything here needs root and those tools; without them the tests skip saying which.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.oci import (  # noqa: F401  (re-exported)
    APPLETS,
    IMAGE_MARK,
    PASSWORD,
    TOOLS,
    USER,
    Registry,
    build_image,
    build_python_image,
    missing,
    start_registry,
    wait_until,
)
from nodeagent.containers.runtime import from_ref
from tests.nodeagent.conftest import RunningAgent, portal, start_agent  # noqa: F401  (fixtures used here)

needs_containers = pytest.mark.skipif(missing() is not None, reason=missing() or "")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    found = start_registry(tmp_path_factory.mktemp("registry"))
    yield found
    found.process.terminate()
    found.process.wait(timeout=10)


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A second registry that wants USER/PASSWORD (htpasswd's bcrypt, from apache2-utils)."""
    reason = missing() or (None if shutil.which("htpasswd") else "htpasswd (apache2-utils) is not installed: no bcrypt hashes")
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("auth-registry")
    htpasswd = folder / "htpasswd"
    subprocess.run(["htpasswd", "-Bbc", str(htpasswd), USER, PASSWORD], check=True, capture_output=True)
    found = start_registry(folder, htpasswd=htpasswd)
    yield found
    found.process.terminate()
    found.process.wait(timeout=10)


@pytest.fixture(scope="session")
def image(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The reference of the test image: Env IMAGE_VAR=from-image, Cmd echoes a line."""
    reference = registry.ref("busybox")
    build_image(
        tmp_path_factory.mktemp("image"),
        reference,
        env={"IMAGE_VAR": "from-image"},
        cmd=["/bin/sh", "-c", "echo from-the-image-cmd $IMAGE_VAR"],
    )
    return reference


def cleanup_containers(agent: Any) -> None:
    """Kill and remove every container an agent's records name (a failed test leaves none running)."""
    for record in list(agent.records.values()):
        found = from_ref(record.container)
        if found is not None:
            runtime, cid = found
            runtime.delete(cid, agent.state_dir / "containers" / cid)


@pytest.fixture
def start_ct_agent(start_agent: Callable[..., RunningAgent]) -> Iterator[Callable[..., RunningAgent]]:  # noqa: F811
    started: list[RunningAgent] = []

    def start(name: str = "node-t1", **overrides: Any) -> RunningAgent:
        running = start_agent(name, **overrides)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
        cleanup_containers(running.agent)


def container_spec(task_id: int, command: str, image: str, **overrides: Any) -> dict[str, Any]:
    from tests.nodeagent.conftest import task_spec

    container = {"image": image, "mounts": [], "workdir": None, "auth": None, **overrides.pop("container", {})}
    return task_spec(task_id, command, container=container, **overrides)


def runc_ids(state_dir: Path) -> list[str]:
    done = subprocess.run(["runc", "--root", str(state_dir / "runc"), "list", "--format", "json"], capture_output=True, text=True)
    return [c["id"] for c in json.loads(done.stdout or "null") or []] if done.returncode == 0 else []


@pytest.fixture(scope="session")
def python_image(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image with this interpreter's Python, Jupyter Server and ipykernel (bench/oci.py's
    build_python_image), its layout cached under the test run's var folder between sessions."""
    reference = registry.ref("python-jupyter")
    cache = Path(os.environ.get("YARD_VAR_DIR") or tmp_path_factory.mktemp("var")) / "oci-cache"
    build_python_image(tmp_path_factory.mktemp("python-image"), reference, cache=cache)
    return reference
