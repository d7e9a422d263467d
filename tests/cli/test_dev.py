"""`yard ssh-key`, `yard dev` and `yard ssh` against a live portal: the real ASGI app (API, and the dev
tunnel) under uvicorn on a loopback port, the `yard` console script as a subprocess, and — for the tunnel —
a real OpenSSH sshd on loopback and Debian's real ssh client running `yard ssh --proxy` as its ProxyCommand.

No agents: the test writes the session's job and task rows as the heartbeat would (RUNNING, the sshd's
endpoint and host key), and asserts on what people see.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from scheduling.models import Job, JobKind, Node, Task
from scheduling.states import JobState
from tenants.models import SshKey
from tenants.services import token_create_personal
from tests.cli.conftest import Yard, yard_executable
from tests.factories import make_cluster, make_job, make_user
from tests.portal.notebook_servers import free_port, proxy_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SSHD = "/usr/sbin/sshd"


@pytest.fixture
def portal(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The portal's ASGI app (Django's API and the dev tunnel) on a loopback port, as `make run` serves it."""
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
    # Django's ASGI handler runs each request in a thread of its own: its connection must close with the
    # request, not linger (CONN_MAX_AGE) where the test database's teardown meets it.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    with proxy_server() as url:
        settings.YARD_NOTEBOOK_URL = url  # where the API says the tunnel is
        yield url


@dataclass
class People:
    owner: Any  # named as this machine's account, which the test's sshd lets in
    owner_yard: Yard
    other_yard: Yard
    team: Any
    lead: Any


@pytest.fixture
def people(cast: Any, portal: str, tmp_path: Path) -> People:
    make_cluster(nodes=1)
    owner = make_user(getpass.getuser(), unit=cast.org.team_a)

    def yard_of(user: Any, name: str) -> Yard:
        home = tmp_path / f"config-{name}"
        home.mkdir()
        return Yard(url=portal, token=token_create_personal(user=user, name="cli", expires_at=None).raw, home=home)

    return People(
        owner=owner, owner_yard=yard_of(owner, "owner"), other_yard=yard_of(cast.bea, "bea"), team=cast.org.team_a, lead=cast.lead
    )


def keygen(path: Path, comment: str = "me@laptop") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def running_session(*, user: Any, team: Any, endpoint: str, host_key: str) -> Job:
    """A dev session as the heartbeat leaves it once its sshd runs: RUNNING, its rank 0 reporting."""
    job = make_job(team=team, user=user, kind=JobKind.DEV, state=JobState.RUNNING, command="", name="dev-test")
    Task.objects.create(
        job=job, attempt=1, rank=0, node=Node.objects.first(), state="RUNNING", dev_endpoint=endpoint,
        dev_host_key=host_key, dev_connections=0,
    )  # fmt: skip
    return job


def test_ssh_keys_are_added_listed_and_removed(people: People, tmp_path: Path) -> None:
    yard = people.owner_yard
    laptop = keygen(tmp_path / "id_laptop", comment="ann@laptop")
    added = yard.run("ssh-key", "add", str(tmp_path / "id_laptop.pub"), "--name", "laptop", check=True)
    key = SshKey.objects.get(user=people.owner)
    assert f"Added SSH key {key.pk} laptop (ssh-ed25519 {fingerprint(tmp_path / 'id_laptop.pub')})" in added.stdout
    assert key.public_key == " ".join(laptop.split()[:2])

    desk = keygen(tmp_path / "id_desk", comment="ann@desk")
    piped = subprocess.run(
        [yard_executable(), "ssh-key", "add", "-", "--json"], input=desk, env=yard.env(), capture_output=True, text=True
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["name"] == "ann@desk"  # no --name: the key's comment

    private = yard.run("ssh-key", "add", str(tmp_path / "id_desk"))
    assert private.returncode == 2 and "PRIVATE key" in private.stderr
    assert SshKey.objects.filter(user=people.owner).count() == 2  # the private key was never sent

    missing = yard.run("ssh-key", "add", str(tmp_path / "nope.pub"))
    assert missing.returncode == 2 and "no such file" in missing.stderr

    listed = yard.run("ssh-key", "list", check=True).stdout
    assert "laptop" in listed and "ann@desk" in listed and fingerprint(tmp_path / "id_desk.pub") in listed
    assert people.other_yard.run("ssh-key", "list", check=True).stdout.count("SHA256:") == 0

    stranger = people.other_yard.run("ssh-key", "remove", str(key.pk))
    assert stranger.returncode == 1 and SshKey.objects.filter(pk=key.pk).exists()  # another's key: as a missing one
    assert f"Removed SSH key {key.pk}" in yard.run("ssh-key", "remove", str(key.pk), check=True).stdout
    assert [k["name"] for k in json.loads(yard.run("ssh-key", "list", "--json", check=True).stdout)] == ["ann@desk"]


def test_ssh_config_pins_the_host_key_under_the_host_alias(people: People, tmp_path: Path) -> None:
    host_key = keygen(tmp_path / "host", comment="root@node")
    job = running_session(user=people.owner, team=people.team, endpoint="127.0.0.1:2222", host_key=host_key)
    done = people.owner_yard.run("ssh", "--config", str(job.pk), check=True)
    known = people.owner_yard.home / "yard" / "known_hosts"
    lines = done.stdout.splitlines()
    assert lines[0] == f"Host yard-{job.pk}"
    options = dict(line.strip().split(" ", 1) for line in lines[1:])
    assert options["User"] == people.owner.username
    assert options["ProxyCommand"].endswith(f"ssh --proxy {job.pk}")
    assert options["HostKeyAlias"] == f"yard-{job.pk}"
    assert options["UserKnownHostsFile"] == str(known)
    assert options["StrictHostKeyChecking"] == "yes"
    assert known.read_text() == f"yard-{job.pk} {' '.join(host_key.split()[:2])}\n"
    assert "no SSH keys" in done.stderr  # none added yet: said on stderr, the block stays clean

    again = people.owner_yard.run("ssh", "--config", str(job.pk), check=True)  # the pin is replaced, not repeated
    assert again.stdout == done.stdout and known.read_text().count(f"yard-{job.pk} ") == 1

    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED)
    stopped = people.owner_yard.run("ssh", "--config", str(job.pk))
    assert stopped.returncode == 1 and stopped.stdout == "" and "not running" in stopped.stderr
    assert people.other_yard.run("ssh", "--config", str(job.pk)).returncode == 1


def test_dev_launch_list_status_and_stop(people: People) -> None:
    yard = people.owner_yard
    made = json.loads(yard.run("dev", "launch", "--team", people.team.slug, "--gpus", "1", "--gpu-type", "H100",
                               "--time-limit", "8h", "--json", check=True).stdout)  # fmt: skip
    job = Job.objects.get(pk=made["id"])
    assert (job.kind, job.user, job.time_limit_s, job.gpus_per_replica) == (JobKind.DEV, people.owner, 8 * 3600, 1)
    listed = yard.run("dev", "list", check=True).stdout
    assert str(job.pk) in listed and job.name in listed
    status = yard.run("dev", "status", str(job.pk), check=True).stdout
    assert f"{job.pk} {job.name}" in status and "1 H100" in status
    stopped = yard.run("dev", "stop", str(job.pk), check=True).stdout
    assert f"dev session {job.pk}" in stopped


def test_dev_launch_wait_returns_once_the_sshd_has_reported(people: People, tmp_path: Path) -> None:
    waiting = people.owner_yard.start("dev", "launch", "--team", people.team.slug, "--wait")
    job = wait_for_row(lambda: Job.objects.filter(kind=JobKind.DEV, user=people.owner).first())
    time.sleep(1)
    assert waiting.poll() is None  # pending: still waiting
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    Task.objects.create(job=job, attempt=1, rank=0, node=Node.objects.first(), state="RUNNING")
    time.sleep(1)
    assert waiting.poll() is None  # running, but its sshd has not reported: a connection would be refused
    Task.objects.filter(job=job).update(dev_endpoint="127.0.0.1:2222", dev_host_key=keygen(tmp_path / "host"))
    stdout, stderr = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, stderr
    assert f"dev session {job.pk} is running: connect with `yard ssh {job.pk}`" in stdout


def wait_for_row(find: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while (found := find()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return found


@dataclass
class Sshd:
    port: int
    host_key: str
    client_key: Path


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real OpenSSH sshd on a loopback port, configured as the agent configures a session's (docs/dev-sessions.md),
    letting in this machine's account with the test's client key only."""
    if not (os.access(SSHD, os.X_OK) and shutil.which("ssh")):
        pytest.skip("needs OpenSSH's sshd and ssh (Debian: openssh-server, openssh-client)")
    root = tmp_path / "sshd"
    root.mkdir()
    host_key = keygen(root / "host_ed25519", comment="")
    client_pub = keygen(tmp_path / "client", comment="test@yard")
    (root / "authorized_keys").write_text(client_pub + "\n")
    (root / "authorized_keys").chmod(0o600)
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress 127.0.0.1:{port}",
                f"HostKey {root / 'host_ed25519'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",  # the test's account may be root (a container)
                "AllowAgentForwarding no",
                "AllowTcpForwarding no",
                "X11Forwarding no",
                "PermitTTY yes",
                "UsePAM no",
                "StrictModes no",  # the test's files live under /tmp
                "PidFile none",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        # Debian's sshd run as root wants its privilege separation folder, which its service unit makes and
        # which may not exist on a fresh machine (the agent makes it too: nodeagent/devsession.py _check).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(root / "sshd.log", "wb")  # noqa: SIM115 - the child holds it
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert process.poll() is None, (root / "sshd.log").read_text()
                assert time.monotonic() < deadline, "sshd did not listen"
                time.sleep(0.1)
        yield Sshd(port=port, host_key=host_key, client_key=tmp_path / "client")
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_real_ssh_runs_a_command_through_yard_ssh_proxy(people: People, sshd: Sshd, tmp_path: Path) -> None:
    job = running_session(user=people.owner, team=people.team, endpoint=f"127.0.0.1:{sshd.port}", host_key=sshd.host_key)
    yard = people.owner_yard
    proxy = " ".join([yard_executable(), "ssh", "--proxy", str(job.pk)])
    known = tmp_path / "known_hosts"
    known.write_text(f"yard-{job.pk} {sshd.host_key}\n")
    ssh = [
        "ssh", "-F", "/dev/null", "-o", f"ProxyCommand={proxy}", "-o", f"HostKeyAlias=yard-{job.pk}",
        "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes", "-i", str(sshd.client_key), "-l", getpass.getuser(), f"yard-{job.pk}", "echo ok",
    ]  # fmt: skip
    done = subprocess.run(ssh, env=yard.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"

    # The Host block `yard ssh --config` prints does the same, with its own known-hosts pin.
    config = tmp_path / "ssh_config"
    config.write_text(yard.run("ssh", "--config", str(job.pk), check=True).stdout)
    extra = ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(sshd.client_key)]
    done = subprocess.run(["ssh", "-F", str(config), *extra, f"yard-{job.pk}", "echo", "ok"], env=yard.env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"

    # And `yard ssh ID -- …` runs the system ssh with those options.
    done = yard.run("ssh", str(job.pk), "--", *extra, "echo", "ok", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"

    # Someone else's token: the tunnel is refused, on stderr, and ssh gets nothing.
    other = subprocess.run(ssh, env=people.other_yard.env(), capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and other.stdout == ""
    # The team lead sees the session in the API, but the tunnel is its owner's alone.
    lead = Yard(url=yard.url, token=token_create_personal(user=people.lead, name="cli", expires_at=None).raw, home=yard.home)
    refused = lead.run("ssh", "--proxy", str(job.pk), timeout=30)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "the portal refused the tunnel (403): No running dev session of yours" in refused.stderr


def test_yard_ssh_proxy_copies_bytes_and_says_why_when_the_session_is_cut(
    people: People, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from portal import dev_proxy

    monkeypatch.setattr(dev_proxy, "RECHECK_S", 0.3)
    echo = socket.create_server(("127.0.0.1", 0))

    def serve_one() -> None:
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve_one, daemon=True).start()
    job = running_session(
        user=people.owner, team=people.team, endpoint=f"127.0.0.1:{echo.getsockname()[1]}", host_key=keygen(tmp_path / "h")
    )
    proxy = subprocess.Popen(
        [yard_executable(), "ssh", "--proxy", str(job.pk)], env=people.owner_yard.env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proxy.stdin is not None and proxy.stdout is not None
        proxy.stdin.write(b"SSH-2.0-OpenSSH_9.2\r\n")
        proxy.stdin.flush()
        assert proxy.stdout.read(21) == b"SSH-2.0-OpenSSH_9.2\r\n"
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
        proxy.wait(timeout=20)  # stdin stays open: the end is the portal's, not ours
        assert proxy.stderr is not None
        stderr = proxy.stderr.read()
    finally:
        proxy.kill()
        echo.close()
    assert proxy.returncode == 1
    assert b"the tunnel was closed (1008: the dev session stopped" in stderr
