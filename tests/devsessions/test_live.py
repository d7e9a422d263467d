"""A dev session end to end, with everything real: gunicorn, uvicorn (the SSH tunnel), a Celery worker and
beat (the cycle and the idle reaper), a `nodeagent.fleet` agent running OpenSSH's sshd on a simulated
node, and Debian's own `ssh` and `scp` going through `yard ssh --proxy` as their ProxyCommand.

Asserted (issue 28): the owner's key gets a shell with the session's GPUs and copies a file both ways;
another person's key is refused by sshd, and their token by the portal's tunnel; the GPU staying idle
brings the idle warning and then the stop, although an SSH connection stays open the whole time; and
after the stop the sshd is gone. The reaper's timings are scaled to seconds (an idle policy of 45 s).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bench.stack import Stack
from tests.livestack import free_port_block, wait_for

pytestmark = [pytest.mark.slow]

if not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()) or not shutil.which("ssh"):
    pytest.skip(
        "OpenSSH (openssh-server and openssh-client) is not installed: scripts/services.sh installs it", allow_module_level=True
    )

ENV = {
    "YARD_TELEMETRY_WINDOW_S": "5",
    "YARD_REAPER_INTERVAL_S": "2",
    "YARD_HEARTBEAT_INTERVAL_S": "1",
    "YARD_CYCLE_INTERVAL_S": "1",
}
PEOPLE = """
from scheduling.models import IdlePolicy
from tenants.models import OrgUnit
from tenants.services import token_create_personal
from tests.factories import make_user
team = OrgUnit.objects.get(slug="bench")
IdlePolicy.objects.create(unit=team, timeout_s=45, warn_lead_s=20, allow_extend=True, extend_s=60)
for name in ("dana", "eve"):
    user = make_user(name, unit=team)
    print(name, token_create_personal(user=user, name="laptop", expires_at=None).raw)
"""


class Person:
    """Someone with a laptop: an SSH key pair, the `yard` CLI logged in with their own token."""

    def __init__(self, stack: Stack, name: str, token: str, home: Path) -> None:
        self.stack, self.name, self.token, self.home = stack, name, token, home
        home.mkdir(parents=True)
        self.key = home / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(self.key)], check=True)
        self.env = {
            **os.environ,
            "YARD_URL": stack.url,
            "YARD_TOKEN": token,
            "XDG_CONFIG_HOME": str(home / "config"),
            "HOME": str(home),
        }

    def yard(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "yardcli", *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"yard {' '.join(args)} failed ({done.returncode}): {done.stdout}\n{done.stderr}")
        return done

    def api(self, path: str) -> Any:
        request = urllib.request.Request(self.stack.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def ssh_config(self, session: int) -> Path:
        text = self.yard("ssh", "--config", str(session)).stdout
        path = self.home / "ssh_config"
        path.write_text(text + f"    IdentityFile {self.key}\n    IdentitiesOnly yes\n    BatchMode yes\n")
        return path

    def ssh(self, config: Path, session: int, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-F", str(config), f"yard-{session}", *command],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip


def test_a_dev_session_over_real_ssh_through_the_portal_then_reaped_when_its_gpus_idle(tmp_path: Path) -> None:
    env = {**ENV, "YARD_RENDEZVOUS_PORTS": free_port_block(20, first=45000)}
    with Stack(nodes=1, fleets=1, nodes_file="2xH100", extra_env=env, asgi=True) as stack:
        tokens = dict(line.split() for line in stack.django(PEOPLE).strip().splitlines()[-2:])
        stack.wait_ready(timeout=120)
        dana = Person(stack, "dana", tokens["dana"], tmp_path / "dana")
        eve = Person(stack, "eve", tokens["eve"], tmp_path / "eve")
        dana.yard("ssh-key", "add", f"{dana.key}.pub", "--name", "laptop")
        eve.yard("ssh-key", "add", f"{eve.key}.pub", "--name", "laptop")
        launched = json.loads(dana.yard("dev", "launch", "--gpus", "1", "--gpu-type", "H100", "--team", "bench", "--json").stdout)
        session = int(launched["id"])
        wait_for(
            "the session's sshd reported",
            lambda: (dana.api(f"/api/v1/dev-sessions/{session}").get("ssh") or {}).get("host_key"),
            timeout=90,
        )

        # The owner: a shell with the session's GPU, a file up and back down.
        config = dana.ssh_config(session)
        shell = dana.ssh(config, session, "echo gpus=$CUDA_VISIBLE_DEVICES; whoami")
        assert shell.returncode == 0, shell.stderr
        assert "gpus=" in shell.stdout and shell.stdout.split("gpus=")[1].split()[0] != ""
        sent = tmp_path / "weights.bin"
        sent.write_bytes(os.urandom(200_000))
        up = subprocess.run(["scp", "-F", str(config), str(sent), f"yard-{session}:/tmp/yard-dev-{session}.bin"], env=dana.env,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert up.returncode == 0, up.stderr
        back = tmp_path / "back.bin"
        down = subprocess.run(["scp", "-F", str(config), f"yard-{session}:/tmp/yard-dev-{session}.bin", str(back)], env=dana.env,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert down.returncode == 0, down.stderr
        assert back.read_bytes() == sent.read_bytes()

        # Someone else: their key is not in the session's authorized keys; their token opens no tunnel.
        foreign = tmp_path / "eve-with-danas-config"
        foreign.write_text(config.read_text().replace(str(dana.key), str(eve.key)))
        refused = dana.ssh(foreign, session, "true")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr
        tunnel = eve.yard("ssh", "--proxy", str(session), check=False, timeout=30)
        assert tunnel.returncode != 0

        # An SSH connection held open does not keep the session: the GPU decides.
        held = subprocess.Popen(["ssh", "-F", str(config), f"yard-{session}", "sleep 600"], env=dana.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            status = wait_for("the connection counted", lambda: (s := dana.api(f"/api/v1/dev-sessions/{session}"))["ssh"]
                              and (s["ssh"].get("connections") or 0) >= 1 and s, timeout=90)  # fmt: skip
            assert status["ssh"]["last_activity"] is not None
            (endpoint,) = stack.sql("SELECT dev_endpoint FROM scheduling_task WHERE job_id = %s AND rank = 0", (session,))[0]
            warnings = "SELECT count(*) FROM scheduling_jobevent WHERE job_id = %s AND reason LIKE 'idle warning:%%'"
            warned = wait_for("the idle warning", lambda: stack.sql(warnings, (session,))[0][0], timeout=120)
            assert warned >= 1
            ended = ("CANCELLED", "COMPLETED", "FAILED")
            state = "SELECT state FROM scheduling_job WHERE id = %s"
            wait_for("the session stopped as idle", lambda: stack.sql(state, (session,))[0][0] in ended, timeout=120)
            (reason,) = stack.sql("SELECT stop_reason FROM scheduling_job WHERE id = %s", (session,))[0]
            assert reason == "IDLE_TIMEOUT"
            assert held.wait(timeout=30) is not None, "the open connection ends with the session"
        finally:
            if held.poll() is None:
                held.kill()
        host, port = endpoint.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    print(
        f"\ndev session {session}: ssh, scp both ways, a stranger's key and token refused, "
        "warned and reaped while a connection was open"
    )
