"""A notebook server's token stays off its command line and out of files other local users can read."""

from __future__ import annotations

import stat
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.nodeagent.conftest import RunningAgent, task_spec
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]


def _cmdlines_of_tree(pid: int) -> list[str]:
    """The command lines of ``pid`` and its descendants (Jupyter's kernels too)."""
    lines, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            lines.append(Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return lines


def test_the_token_is_in_the_environment_not_on_the_command_line(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    start_agent()
    portal.set_desired("node-t1", [task_spec(31, "", kind="notebook", grace_s=10)])
    running = portal.wait_for(lambda: portal.statuses_of(31, "running"), what="notebook started")[0]
    base, token = running["notebook_url"].split("?token=")
    assert base.endswith("/notebooks/131/lab/")  # the portal's path for job 131: its proxy forwards it unchanged

    def answers() -> object:
        try:
            return urllib.request.urlopen(
                urllib.request.Request(base + "api/status", headers={"Authorization": f"token {token}"})
            )
        except OSError:
            return None

    portal.wait_for(answers, timeout=60, what="jupyter answers the token from its environment")
    pid = int(running["pid"])
    assert all(token not in line for line in _cmdlines_of_tree(pid)), "the token is visible in ps"
    assert f"JUPYTER_TOKEN={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    journal = tmp_path / "node-t1" / "journal.json"
    assert token in journal.read_text()  # the agent keeps it to probe the server after a restart ...
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600  # ... where only the agent's user reads it
    log = next((tmp_path / "node-t1" / "tasks").glob("31-*/output.log")).read_text()
    assert token not in log  # Jupyter logs the URL with "token=..." when the token came from outside
