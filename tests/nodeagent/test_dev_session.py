"""Dev sessions on the node (docs/dev-sessions.md, "sshd" and "report"): the agent runs a real OpenSSH sshd
per task, and a real ssh client logs in with the owner's key. Agents in threads, the fake portal."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent import devsession, launcher
from nodeagent import protocol as agent_protocol
from scheduling.agent.protocol import DEV, validate
from tests.nodeagent.conftest import RunningAgent, task_spec, wait_gone
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]

needs_openssh = pytest.mark.skipif(
    devsession.find_sshd() is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None,
    reason="needs OpenSSH's server and client (apt-get install openssh-server openssh-client)",
)
pytestmark = needs_openssh
LOGIN = pwd.getpwuid(os.geteuid()).pw_name  # the agent runs its tasks as itself here


def keypair(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A client key made with ssh-keygen: (its private key file, its public key line)."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path, path.with_name(name + ".pub").read_text().strip()


def dev_spec(task_id: int, *, port: int, keys: list[str], **overrides: Any) -> dict[str, Any]:
    """A dev session's desired entry, as scheduling/agent/services/desired.py sends it."""
    dev = {
        "authorized_keys": keys,
        "allow_agent_forwarding": False,
        "allow_tcp_forwarding": False,
        "allow_x11_forwarding": False,
    }
    return task_spec(task_id, "", kind="dev", master_port=port, dev=dev, **overrides)


def reported(portal: FakePortal, task_id: int) -> dict[str, Any] | None:
    """The `dev` object of the newest heartbeat that reports the task, checked against the portal's schema."""
    for heartbeat in reversed(portal.heartbeats("node-t1")):
        for task in heartbeat["tasks"]:
            if task["task_id"] == task_id:
                dev = task.get("dev")
                return None if dev is None else validate(DEV, dev)  # raises if the portal would refuse it
    return None


def wait_report(portal: FakePortal, task_id: int, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        dev = reported(portal, task_id)
        return dev if dev is not None and predicate(dev) else None

    return portal.wait_for(check, timeout=20, what=what)  # type: ignore[no-any-return]


def known_hosts(tmp_path: Path, dev: dict[str, Any]) -> Path:
    """A known-hosts file pinning the reported host key, as `yard ssh --config` writes one."""
    host, _, port = dev["endpoint"].rpartition(":")
    path = tmp_path / f"known_hosts-{port}"
    path.write_text(f"[{host}]:{port} {dev['host_key']}\n")
    return path


def ssh_options(key: Path, pinned: Path) -> list[str]:
    return [
        "-F",
        "/dev/null",  # none of this machine's own ssh configuration
        "-i",
        str(key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "IdentityAgent=none",
        "-o",
        f"UserKnownHostsFile={pinned}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
    ]


def ssh(key: Path, pinned: Path, port: int, *command: str, user: str = LOGIN, **options: str) -> subprocess.CompletedProcess[str]:
    extra = [arg for name, value in options.items() for arg in ("-o", f"{name}={value}")]
    argv = ["ssh", *ssh_options(key, pinned), *extra, "-p", str(port), f"{user}@127.0.0.1", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def ssh_until(key: Path, pinned: Path, port: int, *command: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    """ssh until it gets in (sshd may not be listening yet when the task is first reported)."""
    deadline = time.monotonic() + timeout
    while True:
        done = ssh(key, pinned, port, *command)
        if done.returncode == 0 or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def exited(portal: FakePortal, task_id: int) -> dict[str, Any]:
    return portal.wait_for(lambda: portal.statuses_of(task_id, "exited"), timeout=20, what=f"task {task_id} exited")[-1]  # type: ignore[no-any-return]


def start_session(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path, task_id: int = 1, **overrides: Any
) -> tuple[RunningAgent, Path, int, dict[str, Any], Path]:
    """An agent running one dev session with one client key: (agent, key, port, report, known hosts)."""
    key, public = keypair(tmp_path, f"client-{task_id}")
    port = launcher.free_port("127.0.0.1")
    agent = start_agent()
    portal.set_desired("node-t1", [dev_spec(task_id, port=port, keys=[public], **overrides)])
    dev = wait_report(portal, task_id, lambda d: d["host_key"] is not None, "the dev session reported")
    return agent, key, port, dev, known_hosts(tmp_path, dev)


def test_the_owners_key_logs_in_with_the_tasks_gpus_and_variables_and_the_pinned_host_key(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    value = "two words, \"quotes\", 'single', a \\ backslash, $HOME and # not a comment"
    agent, key, port, dev, pinned = start_session(portal, start_agent, tmp_path, gpus=[2, 5], env={"MY_VAR": value})
    assert dev["endpoint"] == f"127.0.0.1:{port}"
    assert dev["host_key"].startswith("ssh-ed25519 ") and len(dev["host_key"].split()) == 2  # no comment
    done = ssh_until(key, pinned, port, 'echo $CUDA_VISIBLE_DEVICES; whoami; printf "%s\\n" "$MY_VAR"; echo $YARD_JOB_ID')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["2,5", LOGIN, value, "101"]
    # The agent's own environment and the rendezvous variables (MASTER_PORT is sshd's port) are not given.
    leaked = ssh(key, pinned, port, "echo ${YARD_LAUNCH_ID:-none} ${MASTER_PORT:-none}")
    assert leaked.stdout.split() == ["none", "none"]
    folder = Path(agent.record(1).dev.dir)
    assert (folder / "authorized_keys").stat().st_mode & 0o777 == 0o600
    config = (folder / "sshd_config").read_text()
    for line in ("PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", f'AllowUsers "{LOGIN}"'):
        assert line in config.splitlines()
    assert f"PermitRootLogin {'prohibit-password' if LOGIN == 'root' else 'no'}" in config.splitlines()


def test_scp_copies_a_file_in(portal: FakePortal, start_agent: StartAgent, tmp_path: Path) -> None:
    _, key, port, _, pinned = start_session(portal, start_agent, tmp_path)
    assert ssh_until(key, pinned, port, "true").returncode == 0
    source = tmp_path / "payload.txt"
    source.write_text("hello from the laptop\n")
    target = tmp_path / "copied.txt"
    argv = ["scp", *ssh_options(key, pinned), "-P", str(port), str(source), f"{LOGIN}@127.0.0.1:{target}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # OpenSSH 9: over SFTP (internal-sftp)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "hello from the laptop\n"


def test_a_key_not_in_the_spec_and_a_password_are_refused(portal: FakePortal, start_agent: StartAgent, tmp_path: Path) -> None:
    _, key, port, _, pinned = start_session(portal, start_agent, tmp_path)
    assert ssh_until(key, pinned, port, "true").returncode == 0
    stranger, _ = keypair(tmp_path, "stranger")
    refused = ssh(stranger, pinned, port, "true")
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
    # The server offers nothing but keys: a password is never even asked for.
    password = ssh(key, pinned, port, "true", PubkeyAuthentication="no", PreferredAuthentications="password,keyboard-interactive")
    assert password.returncode == 255 and "Permission denied (publickey)" in password.stderr
    # Another account cannot use the owner's key (one authorized_keys file for the session's login only).
    other = ssh(key, pinned, port, "true", user="nobody")
    assert other.returncode == 255 and "Permission denied" in other.stderr


def test_a_key_added_in_the_portal_is_let_in_and_a_removed_one_shut_out_without_a_restart(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    agent, key, port, _, pinned = start_session(portal, start_agent, tmp_path)
    first = key.with_name("client-1.pub").read_text().strip()
    assert ssh_until(key, pinned, port, "true").returncode == 0
    pid = agent.record(1).pid
    laptop, second = keypair(tmp_path, "laptop")
    assert ssh(laptop, pinned, port, "true").returncode == 255
    portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[first, second])])
    portal.wait_for(lambda: ssh(laptop, pinned, port, "true").returncode == 0, what="the added key let in")
    portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[second])])
    portal.wait_for(lambda: ssh(key, pinned, port, "true").returncode == 255, what="the removed key shut out")
    assert ssh(laptop, pinned, port, "true").returncode == 0
    assert agent.record(1).pid == pid and agent.record(1).state == "running"  # the same sshd all along


def test_open_connections_are_counted_and_the_last_activity_kept(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    _, key, port, dev, pinned = start_session(portal, start_agent, tmp_path)
    assert (dev["connections"], dev["last_activity"]) == (0, None)
    assert ssh_until(key, pinned, port, "true").returncode == 0
    argv = ["ssh", *ssh_options(key, pinned), "-p", str(port), f"{LOGIN}@127.0.0.1", "sleep 4"]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as client:
        busy = wait_report(portal, 1, lambda d: d["connections"] == 1, "one connection counted")
        assert busy["last_activity"] is not None and abs(busy["last_activity"] - time.time()) < 5
        assert client.wait(timeout=20) == 0
    idle = wait_report(portal, 1, lambda d: d["connections"] == 0, "the connection gone")
    assert idle["last_activity"] is not None and idle["last_activity"] >= busy["last_activity"]


def test_a_stop_ends_sshd_and_its_sessions_and_frees_the_port(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    agent, key, port, _, pinned = start_session(portal, start_agent, tmp_path)
    assert ssh_until(key, pinned, port, "true").returncode == 0
    marker = tmp_path / "session-pid"
    # A session whose processes ignore SIGHUP, as `nohup` would: they leave sshd's process group too.
    remote = f"trap '' HUP; echo $$ > {marker}; sleep 300"
    argv = ["ssh", *ssh_options(key, pinned), "-p", str(port), f"{LOGIN}@127.0.0.1", remote]
    client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        portal.wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the session started")
        shell = int(marker.read_text())
        pgid = agent.record(1).pid
        portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[], action="stop", grace_s=5)])
        ended = exited(portal, 1)
        assert ended["stopped_by"] == "sigterm"
        assert client.wait(timeout=10) is not None  # the client was disconnected
        assert wait_gone(pgid)
        portal.wait_for(lambda: not launcher.process_alive(shell, None), timeout=10, what="the session's shell gone")
        assert not listening(port)
    finally:
        client.kill()
        client.wait()


def test_a_restarted_agent_adopts_the_session_its_host_key_and_its_keys(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    first, key, port, dev, pinned = start_session(portal, start_agent, tmp_path)
    public = key.with_name("client-1.pub").read_text().strip()
    assert ssh_until(key, pinned, port, "true").returncode == 0
    pid = first.record(1).pid
    first.stop()  # the agent goes; its workloads stay
    beats = len(portal.heartbeats("node-t1"))
    again = start_agent()
    adopted = portal.wait_for(
        lambda: [t for b in portal.heartbeats("node-t1")[beats:] for t in b["tasks"] if t["task_id"] == 1 and t["pid"] == pid],
        what="the session adopted",
    )[-1]
    assert adopted["dev"]["host_key"] == dev["host_key"] and adopted["dev"]["endpoint"] == dev["endpoint"]
    assert ssh(key, pinned, port, "true").returncode == 0
    laptop, second = keypair(tmp_path, "laptop")
    portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[public, second])])
    portal.wait_for(lambda: ssh(laptop, pinned, port, "true").returncode == 0, what="a key added after the restart")
    assert again.record(1).pid == pid


def test_each_session_has_a_host_key_of_its_own(portal: FakePortal, start_agent: StartAgent, tmp_path: Path) -> None:
    _, public = keypair(tmp_path, "client")
    ports = [launcher.free_port("127.0.0.1") for _ in range(2)]
    start_agent()
    specs = [dev_spec(1, port=ports[0], keys=[public]), dev_spec(2, port=ports[1], keys=[public], gpus=[1])]
    portal.set_desired("node-t1", specs)
    keys = [wait_report(portal, t, lambda d: d["host_key"] is not None, f"session {t} reported")["host_key"] for t in (1, 2)]
    assert keys[0] != keys[1]


def test_a_dev_session_in_an_image_is_prepared_and_goes_to_the_container_runtime(
    portal: FakePortal, start_agent: StartAgent
) -> None:
    """No longer refused: its sshd folder is made as on the node, and the task goes where any task in an image
    goes (here a node told to run no containers says so). The real run: tests/containers/test_dev_session_image.py."""
    agent = start_agent(container_runtime="none")
    container = {"image": "docker.io/library/python:3.12", "mounts": [], "workdir": None, "auth": None}
    portal.set_desired("node-t1", [dev_spec(1, port=launcher.free_port("127.0.0.1"), keys=[], container=container)])
    assert exited(portal, 1)["exit_code"] is None
    portal.wait_for(lambda: "this node cannot run containers" in portal.log_text(1), what="the runtime's reason in the log")
    assert "not supported" not in portal.log_text(1)
    configs = list(Path(agent.agent.state_dir).glob("tasks/*/sshd/sshd_config"))
    assert configs and 'AllowUsers "root"' in configs[0].read_text()


def test_an_image_without_sshd_or_login_says_what_it_needs(tmp_path: Path) -> None:
    """The container's command, run by a plain shell in a folder standing in for the image's root."""
    config = tmp_path / "sshd_config"
    config.write_text("")
    command = devsession.image_command(config, "no-such-login-here")
    bare = {"PATH": str(tmp_path)}  # no sshd on it (the host's /usr/sbin one is found: the login check follows)
    done = subprocess.run(["/bin/sh", "-c", command], env=bare, capture_output=True, text=True, timeout=30)
    if done.returncode == 127:
        assert devsession.NO_SSHD_IN_IMAGE in done.stderr
    else:
        assert done.returncode == 1 and "has no account no-such-login-here" in done.stderr


def test_a_port_taken_meanwhile_ends_the_session_with_sshds_reason_in_its_log(
    portal: FakePortal, start_agent: StartAgent
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        start_agent()
        portal.set_desired("node-t1", [dev_spec(1, port=taken.getsockname()[1], keys=[])])
        assert exited(portal, 1)["exit_code"] == 255
    portal.wait_for(lambda: "Address already in use" in portal.log_text(1), what="sshd's reason in the log")


def test_a_node_without_sshd_fails_the_launch_saying_what_to_install(
    portal: FakePortal, start_agent: StartAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devsession, "find_sshd", lambda: None)
    start_agent()
    portal.set_desired("node-t1", [dev_spec(1, port=launcher.free_port("127.0.0.1"), keys=[])])
    exited(portal, 1)
    expected = "this node has no OpenSSH server (apt-get install openssh-server)"
    portal.wait_for(lambda: expected in portal.log_text(1), what="the reason in the log")


def test_sshd_config_quotes_values_and_refuses_what_it_cannot_carry() -> None:
    given, refused = devsession.login_env(
        {"A": 'x "y" \\z', "BAD NAME": "1", "NL": "a\nb", "HOME": "/root", "MASTER_PORT": "1", "YARD_JOB_ID": "7"}
    )
    assert given == {"A": 'x "y" \\z', "YARD_JOB_ID": "7"} and refused == ["BAD NAME", "NL"]
    assert devsession.quote('x "y" \\z') == '"x \\"y\\" \\\\z"'
    spec = {"dev": {"authorized_keys": ["ssh-ed25519 AAAA a", " ssh-ed25519 AAAA a ", "ssh-ed25519 BBBB\ncommand=x", 7, ""]}}
    assert devsession.clean_keys(spec) == ["ssh-ed25519 AAAA a"]
    assert devsession.endpoint("::1", 2222) == "[::1]:2222"


def test_the_agents_report_bounds_are_the_portals() -> None:
    props = DEV.props
    assert props["endpoint"].spec.max_length == agent_protocol.DEV_ENDPOINT_MAX
    assert props["host_key"].spec.max_length == agent_protocol.DEV_HOST_KEY_MAX
    assert props["connections"].spec.maximum == agent_protocol.DEV_CONNECTIONS_MAX


@pytest.fixture
def owner() -> Iterator[pwd.struct_passwd]:
    """A throwaway local account with a shell (Debian's `nobody` is locked, and sshd, rightly, lets no one in
    as a locked account), removed afterwards."""
    if os.geteuid() != 0 or launcher.SETPRIV is None or shutil.which("useradd") is None:
        pytest.skip("switching accounts needs root, setpriv and useradd")
    name = "yarddev" + secrets.token_hex(4)
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/tmp", "--shell", "/bin/sh", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "--force", name], capture_output=True)


def test_run_as_owner_the_owner_runs_sshd_and_is_the_only_login(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path, owner: pwd.struct_passwd
) -> None:
    base = Path(tempfile.mkdtemp(prefix="yard-dev-"))  # pytest's own folders are closed to other accounts
    base.chmod(0o711)
    try:
        key, public = keypair(tmp_path, "client")
        port = launcher.free_port("127.0.0.1")
        agent = start_agent(run_as_owner=True, state_dir=base / "agent")
        portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[public], user=owner.pw_name, gpus=[3])])
        dev = wait_report(portal, 1, lambda d: d["host_key"] is not None, "the dev session reported")
        pinned = known_hosts(tmp_path, dev)
        done = portal.wait_for(
            lambda: (d := ssh(key, pinned, port, "whoami; echo $CUDA_VISIBLE_DEVICES", user=owner.pw_name)).returncode == 0 and d,
            what="logged in as the owner",
        )
        assert done.stdout.split() == [owner.pw_name, "3"]
        assert ssh(key, pinned, port, "true", user="root").returncode == 255  # root stays out
        record = agent.record(1)
        listener = next(p for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == record.pid)
        assert listener.stat().st_uid == owner.pw_uid
        folder = Path(record.dev.dir)
        assert folder.parent == Path(record.workdir)  # the agent's folder, not the owner's work directory
        assert {p.stat().st_uid for p in (folder, *folder.iterdir())} == {owner.pw_uid}
        assert "PermitRootLogin no" in (folder / "sshd_config").read_text().splitlines()
        # A key added later is written for the owner's sshd to read.
        laptop, second = keypair(tmp_path, "laptop")
        portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[public, second], user=owner.pw_name, gpus=[3])])
        portal.wait_for(lambda: ssh(laptop, pinned, port, "true", user=owner.pw_name).returncode == 0, what="the added key")
        portal.set_desired("node-t1", [dev_spec(1, port=port, keys=[], user=owner.pw_name, action="stop")])
        exited(portal, 1)
        assert not listening(port)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _ppid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
