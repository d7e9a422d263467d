"""A dev session in an image (docs/dev-sessions.md, "In an image"): a real agent pulls an image holding
this host's OpenSSH sshd (bench/oci.py's build_sshd_image) from a real registry and runs the image's sshd
in a runc container on the host's network; the real ssh client logs in as root with the spec's key, lands
inside the container (a file only the image has), is counted as a connection, and the stop ends it all."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.oci import SSHD_IMAGE_MARK, Registry, build_sshd_image
from nodeagent import devsession, launcher
from tests.containers.conftest import container_spec, needs_containers, runc_ids
from tests.nodeagent.conftest import RunningAgent
from tests.nodeagent.fakeportal import FakePortal
from tests.nodeagent.test_dev_session import (
    exited,
    keypair,
    known_hosts,
    listening,
    reported,
    ssh_options,
)

needs_openssh = pytest.mark.skipif(
    not Path("/usr/sbin/sshd").is_file() or devsession.find_sshd() is None or not Path("/usr/bin/ssh").is_file(),
    reason="needs OpenSSH's server (copied into the image) and client (apt-get install openssh-server openssh-client)",
)
pytestmark = [needs_containers, needs_openssh]
StartAgent = Callable[..., RunningAgent]


@pytest.fixture(scope="module")
def sshd_image(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    reference = registry.ref("sshd")
    build_sshd_image(tmp_path_factory.mktemp("sshd-image"), reference)
    return reference


def dev_in_image(task_id: int, image: str, *, port: int, keys: list[str], **overrides: Any) -> dict[str, Any]:
    dev = {"authorized_keys": keys, "allow_agent_forwarding": False, "allow_tcp_forwarding": False, "allow_x11_forwarding": False}
    return container_spec(task_id, "", image, kind="dev", master_port=port, dev=dev, **overrides)


def wait_dev(portal: FakePortal, task_id: int, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        dev = reported(portal, task_id)
        return dev if dev is not None and predicate(dev) else None

    try:
        return portal.wait_for(check, timeout=60, what=what)  # type: ignore[no-any-return]
    except AssertionError as exc:  # what sshd said, in the task's log
        raise AssertionError(f"{exc}\n--- task log:\n{log_of(portal, task_id)[-3000:]}") from exc


def ssh(key: Path, pinned: Path, port: int, command: str) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", *ssh_options(key, pinned), "-p", str(port), "root@127.0.0.1", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def log_of(portal: FakePortal, task_id: int) -> str:
    return portal.logs.get((task_id, 1), b"").decode(errors="replace")


def test_a_dev_session_in_an_image_runs_the_images_sshd_and_logs_in_inside_the_container(
    portal: FakePortal, start_ct_agent: StartAgent, sshd_image: str, tmp_path: Path
) -> None:
    key, public = keypair(tmp_path, "client")
    port = launcher.free_port("127.0.0.1")
    running = start_ct_agent()
    portal.set_desired("node-t1", [dev_in_image(1, sshd_image, port=port, keys=[public], env={"FROM_SPEC": "yes"})])
    dev = wait_dev(portal, 1, lambda d: d["host_key"] is not None and d["connections"] == 0, "the dev session reported")
    assert dev["login"] == "root"  # the container's root: the agent does not run tasks as their owners here
    pinned = known_hosts(tmp_path, dev)
    marker = f"cat {SSHD_IMAGE_MARK}; echo FROM_SPEC=$FROM_SPEC; id -u"

    def logged_in() -> subprocess.CompletedProcess[str] | None:
        done = ssh(key, pinned, port, marker)
        return done if done.returncode == 0 else None

    try:
        done = portal.wait_for(logged_in, timeout=60, what="a login through the image's sshd")
    except Exception as exc:
        raise AssertionError(f"{exc}\n--- task log:\n{log_of(portal, 1)[-3000:]}") from exc
    # Only the image has the file: the login's shell runs in the container; the spec's variables came with it.
    assert "the yard test's sshd image" in done.stdout and "FROM_SPEC=yes" in done.stdout, done.stdout
    assert done.stdout.split()[-1] == "0"
    assert len(runc_ids(running.agent.state_dir)) == 1

    # A connection open in the container is counted from the host's /proc (a child of the container's sshd).
    argv = ["ssh", *ssh_options(key, pinned), "-p", str(port), "root@127.0.0.1", "sleep 300"]
    client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        busy = wait_dev(portal, 1, lambda d: d["connections"] == 1, "one connection counted")
        assert busy["last_activity"] is not None
        # A key that is not in the spec is refused by the image's sshd.
        other, _ = keypair(tmp_path, "stranger")
        assert ssh(other, pinned, port, "true").returncode == 255

        # The stop ends sshd, the connection and the container, and frees the port.
        portal.set_desired("node-t1", [dev_in_image(1, sshd_image, port=port, keys=[], action="stop", grace_s=5)])
        ended = exited(portal, 1)
        assert ended["stopped_by"] == "sigterm", ended
        assert client.wait(timeout=20) is not None  # disconnected
    finally:
        client.kill()
        client.wait()
    portal.wait_for(lambda: not runc_ids(running.agent.state_dir), timeout=30, what="no container left")
    portal.wait_for(lambda: not listening(port), timeout=10, what="the port free")


def test_an_image_without_sshd_ends_the_session_saying_what_it_needs(
    portal: FakePortal, start_ct_agent: StartAgent, image: str
) -> None:
    start_ct_agent()
    portal.set_desired("node-t1", [dev_in_image(2, image, port=launcher.free_port("127.0.0.1"), keys=[])])  # busybox only
    status = portal.wait_for(lambda: portal.statuses_of(2, "exited"), timeout=60, what="task 2 exited")[-1]
    assert status["exit_code"] == 127
    assert devsession.NO_SSHD_IN_IMAGE in log_of(portal, 2), log_of(portal, 2)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory task owners can reach (pytest's temporary folders are mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="yard-ct-dev-owner-"))
    path.chmod(0o711)
    yield path / "agent"
    shutil.rmtree(path, ignore_errors=True)


def test_run_as_owner_the_owner_logs_in_where_the_image_has_the_account_and_is_refused_clearly_where_not(
    portal: FakePortal, start_ct_agent: StartAgent, registry: Registry, sshd_image: str, state_dir: Path, tmp_path: Path
) -> None:
    reference = registry.ref("sshd-nobody")
    build_sshd_image(tmp_path / "image", reference, accounts=("nobody",))
    key, public = keypair(tmp_path, "owner")
    running = start_ct_agent(run_as_owner=True, state_dir=state_dir)
    # The first image has no account "nobody": the session ends saying so.
    portal.set_desired("node-t1", [dev_in_image(3, sshd_image, port=launcher.free_port("127.0.0.1"), keys=[], user="nobody")])
    status = portal.wait_for(lambda: portal.statuses_of(3, "exited"), timeout=60, what="task 3 exited")[-1]
    assert status["exit_code"] == 1 and "this image has no account nobody in its /etc/passwd" in log_of(portal, 3)

    port = launcher.free_port("127.0.0.1")
    portal.set_desired("node-t1", [dev_in_image(4, reference, port=port, keys=[public], user="nobody")])
    dev = wait_dev(portal, 4, lambda d: d["host_key"] is not None, "the owner's session reported")
    assert dev["login"] == "nobody"
    pinned = known_hosts(tmp_path, dev)
    argv = ["ssh", *ssh_options(key, pinned), "-p", str(port), "nobody@127.0.0.1", f"cat {SSHD_IMAGE_MARK}; id -u"]

    def logged_in() -> subprocess.CompletedProcess[str] | None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return done if done.returncode == 0 else None

    try:
        done = portal.wait_for(logged_in, timeout=60, what="the owner's login through the image's sshd")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- task log:\n{log_of(portal, 4)[-3000:]}") from exc
    assert "the yard test's sshd image" in done.stdout and done.stdout.split()[-1] == str(pwd.getpwnam("nobody").pw_uid)
    assert ssh(key, pinned, port, "true").returncode == 255  # root stays out (PermitRootLogin no)
    portal.set_desired("node-t1", [dev_in_image(4, reference, port=port, keys=[], user="nobody", action="stop")])
    portal.wait_for(lambda: portal.statuses_of(4, "exited"), timeout=60, what="task 4 exited")
    portal.wait_for(lambda: not runc_ids(running.agent.state_dir), timeout=30, what="no container left")
