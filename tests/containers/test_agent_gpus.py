"""GPUs in a container as the node's CDI spec describes them: a small hand-written spec (the shape
`nvidia-ctk cdi generate` writes) applied to a real runc container."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nodeagent.containers import cdi
from nodeagent.containers.base import ContainerPlan, ImageConfig
from nodeagent.containers.images import ImageCache
from nodeagent.containers.runc import Runc, bundle_config
from tests.containers.conftest import needs_containers

MB = 1024 * 1024


def write_spec(folder: Path) -> Path:
    """GPU 0 is /dev/zero under the name /dev/nvidia0, GPU 1 /dev/full; the driver "library" a host file."""
    driver = folder / "libfake-nvidia.so.1"
    driver.write_text("a-driver-library\n")
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/zero"}]}},
            {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/dev/full"}]}},
        ],
        "containerEdits": {
            "env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"}],
            "mounts": [
                {
                    "hostPath": str(driver),
                    "containerPath": "/usr/lib/x86_64-linux-gnu/libfake-nvidia.so.1",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
        },
    }
    path = folder / "nvidia.json"
    path.write_text(json.dumps(spec))
    return path


def test_the_spec_gives_the_common_edits_and_those_of_the_tasks_gpus_only(tmp_path: Path) -> None:
    spec = cdi.load(write_spec(tmp_path))
    edits = cdi.edits_for(spec, [1])
    assert [d["path"] for d in edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia1"]
    config = bundle_config(
        ContainerPlan("yard-x", tmp_path, tmp_path, ImageConfig(), ["/bin/true"], {}, "/", gpus=[1]),
        root=tmp_path,
        readonly=True,
        edits=edits,
    )
    devices = {d["path"]: (d["major"], d["minor"]) for d in config["linux"]["devices"]}
    assert devices == {"/dev/nvidiactl": (1, 3), "/dev/nvidia1": (1, 7)}
    allowed = {(r.get("major"), r.get("minor")) for r in config["linux"]["resources"]["devices"] if r["allow"]}
    assert {(1, 3), (1, 7)} <= allowed and (1, 5) in allowed  # /dev/zero is allowed anyway (a default device)
    assert "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu" in config["process"]["env"]
    assert "process" in config and "rlimits" not in config["process"]


def test_a_bad_spec_says_which_file(tmp_path: Path) -> None:
    bad = tmp_path / "nvidia.json"
    bad.write_text("{not json")
    with pytest.raises(cdi.CdiError, match=str(bad)):
        cdi.load(bad)


@needs_containers
def test_a_container_gets_its_gpus_device_nodes_and_the_driver_files_the_spec_names(image: str, tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path)
    found = ImageCache(root=tmp_path / "cache", max_bytes=1024 * MB).get(image, auth=None)
    runtime = Runc(binary="runc", root=tmp_path / "runc", cdi_paths=(spec_path,))
    command = (
        "test -c /dev/nvidia0 && echo has-nvidia0; test -e /dev/nvidia1 || echo no-nvidia1; "
        "test -c /dev/nvidiactl && echo has-nvidiactl; head -c 4 /dev/nvidia0 | wc -c; "
        "cat /usr/lib/x86_64-linux-gnu/libfake-nvidia.so.1; echo $NVIDIA_CTK_LIBCUDA_DIR"
    )
    plan = ContainerPlan(
        "yard-cdi-test", tmp_path / "bundle", found.rootfs, found.config, ["/bin/sh", "-c", command], {}, "/", gpus=[0]
    )
    note = runtime.prepare(plan)
    assert f"GPUs as {spec_path} says" in note
    try:
        done = subprocess.run(runtime.run_argv(plan), capture_output=True, text=True, timeout=60)
    finally:
        runtime.delete(plan.container_id, plan.bundle)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[:3] == ["has-nvidia0", "no-nvidia1", "has-nvidiactl"]
    assert "4" in lines and "a-driver-library" in lines and "/usr/lib/x86_64-linux-gnu" in lines
    assert not plan.bundle.exists()
