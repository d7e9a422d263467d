"""A task in a container, run by a real agent with runc from an image in a real registry: its output,
exit code, variables, GPUs and mounts, and a pull that fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent import launcher
from tests.containers.conftest import Registry, container_spec, needs_containers, runc_ids
from tests.nodeagent.conftest import RunningAgent
from tests.nodeagent.fakeportal import FakePortal

pytestmark = needs_containers
StartAgent = Callable[..., RunningAgent]


def exited(portal: FakePortal, task_id: int, timeout: float = 60.0) -> dict[str, object]:
    statuses = portal.wait_for(lambda: portal.statuses_of(task_id, "exited"), what=f"task {task_id} exited", timeout=timeout)
    return statuses[-1]  # type: ignore[no-any-return]


def log_of(portal: FakePortal, task_id: int) -> str:
    return portal.logs.get((task_id, 1), b"").decode(errors="replace")


def test_a_task_prints_in_its_container_and_exits_with_its_code(
    portal: FakePortal, start_ct_agent: StartAgent, image: str
) -> None:
    running = start_ct_agent()
    portal.set_desired(
        "node-t1", [container_spec(1, "echo hello-from-inside; cat /etc/os-release 2>&1 | head -1; exit 7", image)]
    )
    status = exited(portal, 1)
    assert status["exit_code"] == 7
    log = log_of(portal, 1)
    assert "hello-from-inside" in log
    # busybox's rootfs has no os-release: the task did not run on the host (which has one)
    assert "No such file" in log, log
    assert runc_ids(running.agent.state_dir) == []  # runc removed it with its end
    assert not list((running.agent.state_dir / "containers").iterdir())  # and the agent its bundle


def test_without_a_command_the_image_cmd_runs(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    start_ct_agent()
    portal.set_desired("node-t1", [container_spec(2, "", image)])
    assert exited(portal, 2)["exit_code"] == 0
    assert "from-the-image-cmd from-image" in log_of(portal, 2)


def test_env_gpus_and_mounts_are_visible_inside(
    portal: FakePortal, start_ct_agent: StartAgent, image: str, tmp_path: Path
) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "train.txt").write_text("a-training-file\n")
    ckpt = tmp_path / "ckpt" / "job-103"
    running = start_ct_agent()
    command = (
        "env | sort > $YARD_WORKDIR/env.txt; cat /data/train.txt; "
        "echo written-inside > $YARD_CHECKPOINT_DIR/ckpt.txt; "
        "touch /data/x 2>&1 || echo data-is-read-only; "
        "echo rootfs-write > /made-inside && cat /made-inside; pwd"
    )
    spec = container_spec(
        3,
        command,
        image,
        gpus=[4, 5],
        rank=1,
        world_size=2,
        env={"WANDB_MODE": "offline", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
        checkpoint_dir=str(ckpt),
        container={"mounts": [{"source": str(data), "target": "/data", "readonly": True}], "workdir": "/workspace"},
    )
    portal.set_desired("node-t1", [spec])
    assert exited(portal, 3)["exit_code"] == 0
    record = running.record(3)
    env = dict(line.split("=", 1) for line in (Path(record.run_dir) / "env.txt").read_text().splitlines() if "=" in line)
    assert env["IMAGE_VAR"] == "from-image"  # the image's Env
    assert env["PATH"] == "/bin"  # the image's, not the agent's
    assert env["WANDB_MODE"] == "offline"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "4,5"  # the host's GPUs, as the NVIDIA toolkit takes them
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # only their device nodes are inside, numbered from 0
    assert (env["RANK"], env["WORLD_SIZE"], env["YARD_TASK_ID"]) == ("1", "2", "3")
    assert Path(env["YARD_SIM_UTIL_FILE"]) == record.util_file  # the simulated GPUs' file, at its path
    log = log_of(portal, 3)
    assert "a-training-file" in log and "data-is-read-only" in log and "rootfs-write" in log
    assert "/workspace" in log  # the workdir the spec names
    assert (ckpt / "ckpt.txt").read_text() == "written-inside\n"  # the checkpoint dir, on the host


def test_a_missing_image_fails_the_task_with_image_pull_and_a_clear_message(
    portal: FakePortal, start_ct_agent: StartAgent, registry: Registry
) -> None:
    start_ct_agent()
    portal.set_desired("node-t1", [container_spec(4, "echo never", registry.ref("no-such-image"))])
    status = exited(portal, 4)
    assert status["stop_cause"] == "image_pull"
    assert status["message"] == f"image pull failed: {registry.ref('no-such-image')}: no such image (manifest unknown)"
    assert "yard-agent: image pull failed" in log_of(portal, 4)


def test_a_registry_off_the_allow_list_is_refused(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    start_ct_agent(registry_allow="nvcr.io")
    portal.set_desired("node-t1", [container_spec(5, "echo never", image)])
    status = exited(portal, 5)
    assert status["stop_cause"] == "image_pull"
    assert "is not allowed on this node (allowed: nvcr.io)" in str(status["message"])


def test_a_mount_the_node_lacks_fails_the_task_saying_which(
    portal: FakePortal, start_ct_agent: StartAgent, image: str, tmp_path: Path
) -> None:
    start_ct_agent()
    missing = tmp_path / "no-such-dataset"
    mounts = [{"source": str(missing), "target": "/data", "readonly": True}]
    portal.set_desired("node-t1", [container_spec(6, "echo never", image, container={"mounts": mounts})])
    status = exited(portal, 6)
    assert (
        status["message"]
        == f"cannot prepare the container: the container mount's source {missing} does not exist on node node-t1"
    )
    assert log_of(portal, 6).startswith("yard-agent: cannot prepare the container")  # and nothing ran


def test_two_containers_rendezvous_over_the_hosts_network(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    port = launcher.free_port("127.0.0.1")
    start_ct_agent()
    # The server reads the socket to its end with -e: a bare `nc -l` whose stdin is at its end shuts its
    # side at once, and the client's nc may take that end for the reply and quit before it sends a byte.
    server = f"nc -l -p {port} -e sh -c 'cat > $YARD_WORKDIR/got.txt'; cat $YARD_WORKDIR/got.txt"
    client = f"for i in $(seq 1 100); do echo hello-rank-0 | nc 127.0.0.1 {port} && exit 0; sleep 0.1; done; exit 1"
    portal.set_desired(
        "node-t1",
        [
            container_spec(7, server, image, rank=0, world_size=2),
            container_spec(8, client, image, rank=1, world_size=2, gpus=[1]),
        ],
    )
    assert exited(portal, 8)["exit_code"] == 0
    assert exited(portal, 7)["exit_code"] == 0
    assert "hello-rank-0" in log_of(portal, 7)


def test_a_notebook_in_an_image_without_jupyter_ends_saying_what_the_image_lacks(
    portal: FakePortal, start_ct_agent: StartAgent, image: str
) -> None:
    start_ct_agent()
    portal.set_desired("node-t1", [container_spec(9, "", image, kind="notebook")])  # busybox: a shell, no jupyter
    status = exited(portal, 9)
    assert status["exit_code"] == 127
    assert "this image has no jupyter on its PATH (/bin)" in log_of(portal, 9), log_of(portal, 9)
