"""nodeagent.shutdown: every process of a workload goes, even one that ignores SIGTERM or left its group."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nodeagent import launcher
from nodeagent.shutdown import stop_workloads
from tests.demo.helpers import wait_for

MARK = "YARD_TEST_SHUTDOWN"


def _marked(mark: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat[stat.rfind(")") + 2] not in "ZX":
                    found.add(int(entry.name))
        except OSError:
            continue
    return found


def _workload(tmp_path: Path, command: str, mark: str) -> Any:
    process = launcher.spawn(
        command=command,
        env={**os.environ, MARK: mark},
        cwd=tmp_path,
        log_path=tmp_path / f"{uuid.uuid4().hex}.log",
        exit_file=tmp_path / f"{uuid.uuid4().hex}.exit",
    )
    return process, SimpleNamespace(live=True, pid=process.pid, start_ticks=launcher.start_ticks(process.pid))


def test_a_stubborn_workload_and_a_child_in_its_own_session_are_all_stopped(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    # One that exits on SIGTERM; one that ignores it and has a child in a session of its own (as
    # Jupyter starts its kernels), which a signal to the group alone would miss.
    polite, polite_record = _workload(tmp_path, "sleep 600", mark)
    stubborn, stubborn_record = _workload(tmp_path, "trap '' TERM; setsid sleep 600 & sleep 600 & wait", mark)
    agents = [SimpleNamespace(records={(1, 1): polite_record}), SimpleNamespace(records={(2, 1): stubborn_record})]
    wait_for("the workloads' processes", lambda: len(_marked(mark)) >= 6)

    found = stop_workloads(agents, grace_s=1.0)  # type: ignore[arg-type]

    assert found >= 6
    for process in (polite, stubborn):
        process.wait(timeout=10)
    assert _marked(mark) == set()


def test_nothing_to_stop_returns_at_once() -> None:
    record = SimpleNamespace(live=False, pid=None, start_ticks=None)
    assert stop_workloads([SimpleNamespace(records={(1, 1): record})], grace_s=5.0) == 0  # type: ignore[list-item]


def test_a_workload_that_ended_already_is_left_alone(tmp_path: Path) -> None:
    process, record = _workload(tmp_path, "true", uuid.uuid4().hex)
    process.wait(timeout=10)
    assert stop_workloads([SimpleNamespace(records={(1, 1): record})], grace_s=5.0) == 0  # type: ignore[list-item]
