"""The agent's own view of its disk and clock (nodeagent/health.py), and a stop of a task that never started."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent import journal
from nodeagent.health import ClockOffset, DiskCheck, low_water_bytes
from nodeagent.journal import TaskRecord
from nodeagent.launch import node_fault
from tests.nodeagent.conftest import RunningAgent, task_spec
from tests.nodeagent.fakeportal import FakePortal


def test_the_low_water_mark_scales_with_small_file_systems() -> None:
    assert low_water_bytes(2 * 1024 * 1024) == 256 * 1024  # a 2 MiB tmpfs: the floor
    assert low_water_bytes(100 * 1024 * 1024) == 5 * 1024 * 1024  # 5 %
    assert low_water_bytes(10 * 1024**4) == 64 * 1024 * 1024  # a big disk: the ceiling


def test_a_roomy_disk_has_no_problem_and_a_failed_write_is_one_until_a_write_succeeds(tmp_path: Path) -> None:
    disk = DiskCheck(tmp_path)
    assert disk.problem() is None
    assert disk.wrote(OSError(errno.ENOSPC, "No space left on device")) is True  # a run of failures begins
    assert disk.wrote(OSError(errno.ENOSPC, "No space left on device")) is False  # logged once, not again
    assert disk.problem() == f"cannot write the journal: No space left on device ({tmp_path})"
    assert disk.wrote(None) is False
    assert disk.problem() is None


def test_a_nearly_full_disk_is_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Full:
        f_bavail, f_frsize, f_blocks = 3, 4096, 512  # 12 KiB free of 2 MiB

    monkeypatch.setattr(os, "statvfs", lambda path: Full)
    assert DiskCheck(tmp_path).problem() == f"{tmp_path} has 12.0 KiB free of 2.0 MiB"


def test_the_clock_offset_is_taken_from_the_fastest_round_trip() -> None:
    clock = ClockOffset(keep=3)
    assert clock.estimate is None
    clock.add(sent=1000.0, received=1004.0, portal_time=1302.5)  # slow: 2 s each way, offset 300.5 ± 2
    clock.add(sent=1010.0, received=1010.2, portal_time=1310.1)  # fast: offset 300.0 ± 0.1
    clock.add(sent=1020.0, received=1023.0, portal_time="later")  # ignored: not a number
    offset, error = clock.estimate  # type: ignore[misc]
    assert offset == pytest.approx(300.0) and error == pytest.approx(0.1)
    for start in (1030.0, 1040.0, 1050.0):  # the fast one ages out of the window
        clock.add(sent=start, received=start + 1.0, portal_time=start + 0.5 - 7.0)
    offset, error = clock.estimate  # type: ignore[misc]
    assert offset == pytest.approx(-7.0) and error == pytest.approx(0.5)


def test_errors_of_the_nodes_disk_are_the_nodes_fault_not_the_jobs() -> None:
    assert node_fault(OSError(errno.ENOSPC, "full")) == "node_fault"
    assert node_fault(OSError(errno.EROFS, "read-only")) == "node_fault"
    assert node_fault(OSError(errno.ENOENT, "no such file")) is None


def test_a_launch_the_journal_cannot_record_starts_nothing_and_ends_as_the_nodes_fault(
    portal: FakePortal, start_agent: Callable[..., RunningAgent], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agent = start_agent()
    portal.wait_for(lambda: portal.heartbeats("node-t1"), what="a first heartbeat")
    real_save = journal.save

    def full(path: Path, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal, "save", full)
    marker = tmp_path / "started"
    portal.set_desired("node-t1", [task_spec(7, f"touch {marker}; exec sleep 60")])
    (status,) = portal.wait_for(lambda: portal.statuses_of(7, "exited"), what="the refused launch's end")
    assert status["stop_cause"] == "node_fault" and status["exit_code"] is None
    assert not marker.exists()  # nothing started
    beats = portal.heartbeats("node-t1")
    assert "cannot write the journal: No space left on device" in (beats[-1].get("disk_problem") or "")
    monkeypatch.setattr(journal, "save", real_save)
    portal.wait_for(lambda: portal.heartbeats("node-t1")[-1].get("disk_problem") is None, what="the disk problem cleared")
    assert agent.agent.disk.write_error is None


def test_a_stop_of_a_task_that_never_started_ends_it_at_once(
    start_agent: Callable[..., RunningAgent], portal: FakePortal
) -> None:
    running = start_agent()
    portal.wait_for(lambda: portal.heartbeats("node-t1"), what="a first heartbeat")
    agent = running.agent
    record = TaskRecord(
        task_id=9,
        attempt=1,
        job_id=9,
        kind="batch",
        launch_id="never-started",
        workdir=str(agent.state_dir / "t9"),
        checkpoint_dir="",
    )
    agent.records[record.key] = record  # as a launch that died between the journal and the fork left it
    agent.stopping.request_stop(record, cause="stop", grace_s=30.0, reason="cancelled")
    assert record.state == "exited" and record.stop_cause == "stop" and record.pid is None
