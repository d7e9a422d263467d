"""Each task held to the cores and memory it was given, and its real use measured: real workload
processes, agents in threads with the fake portal. This machine has no writable cgroup v2, so the
cgroup path runs against a fake cgroup directory tree (plain files) and the affinity fallback for real."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent import cgroups, launcher
from tests.nodeagent.conftest import RunningAgent, kill_group, task_spec
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]
CORES = sorted(os.sched_getaffinity(0))
log = logging.getLogger("nodeagent")

needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="pinning needs at least two cores to choose from")


def fake_cgroup_root(path: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    """A directory shaped like a delegated cgroup v2 (the kernel would fill a child's files itself)."""
    path.mkdir()
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text("")
    (path / "cgroup.procs").write_text("")
    return path


@pytest.fixture
def affinity_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Agents of this test limit by CPU affinity whatever the machine has (no cgroup at that root)."""
    monkeypatch.setenv(cgroups.ROOT_ENV, str(tmp_path / "no-cgroup-here"))


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], Path]]]:
    """Spawn workloads as the agent does, held by default: (wrapper, folder). Every group is killed at the end."""
    pids: list[int] = []

    def spawn(name: str, command: str, hold: bool = True) -> tuple[subprocess.Popen[bytes], Path]:
        folder = tmp_path / name
        folder.mkdir()
        child = launcher.spawn(
            command=command, env=dict(os.environ), cwd=folder, log_path=folder / "log", exit_file=folder / "exit", hold=hold
        )
        pids.append(child.pid)
        return child, folder

    yield spawn
    for pid in pids:
        kill_group(pid)


def wait_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return text
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


def allowed_list(text: str) -> set[int]:
    """Cpus_allowed_list ("0-3,6") as a set."""
    cores: set[int] = set()
    for part in text.split(":")[-1].strip().split(","):
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


# --------------------------------------------------------------------------- the affinity fallback


@needs_two_cores
def test_affinity_fallback_pins_the_workload_and_what_it_forks(spawned) -> None:
    limiter = cgroups.Limiter(base=None, reason="test", log=log)
    child, folder = spawned("a", "sh -c 'grep Cpus_allowed_list /proc/self/status' > allowed")
    held = limiter.apply((1, 1), child.pid, cgroups.Limits(cpus=1), others=[])
    launcher.release(child)
    assert held == f"cores {CORES[0]}"
    assert child.wait(timeout=10) == 0
    # A grandchild of the wrapper, forked after the release: born pinned, with no window before.
    assert allowed_list((folder / "allowed").read_text()) == {CORES[0]}
    assert limiter.mode == "affinity"


@needs_two_cores
def test_two_tasks_on_one_node_get_disjoint_cores(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path, affinity_only: None
) -> None:
    running = start_agent()
    each = len(CORES) // 2
    files = [tmp_path / f"allowed-{n}" for n in (1, 2)]
    command = "grep Cpus_allowed_list /proc/self/status > {}; sleep 30"
    portal.set_desired(
        "node-t1", [task_spec(n, command.format(f), cpus=each, memory_mb=256) for n, f in zip((1, 2), files, strict=True)]
    )
    first, second = (allowed_list(wait_file(f)) for f in files)
    assert len(first) == len(second) == each and not first & second
    assert running.agent.workloads.limiter.mode == "affinity"


def test_when_cores_run_out_the_least_shared_ones_are_given_again() -> None:
    assert cgroups.choose_cores([0, 1, 2, 3], [], 2) == [0, 1]
    assert cgroups.choose_cores([0, 1, 2, 3], [0, 1], 2) == [2, 3]
    assert cgroups.choose_cores([0, 1, 2, 3], [0, 1, 2], 2) == [0, 3]  # wraps around
    assert cgroups.choose_cores([0, 1, 2, 3], [0, 1, 2, 3, 0], 3) == [1, 2, 3]


def test_the_agent_says_at_start_how_it_limits_tasks(
    portal: FakePortal, start_agent: StartAgent, affinity_only: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="nodeagent"):
        running = start_agent()
    limiter = running.agent.workloads.limiter
    assert (limiter.mode, limiter.base) == ("affinity", None)
    lines = [r.getMessage() for r in caplog.records if "limited by affinity only" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("CPU limited by affinity only, memory not limited"), lines
    assert "no-cgroup-here" in lines[0]


# --------------------------------------------------------------------------- the cgroup v2 path


def test_detect_enables_the_controllers_of_a_delegated_cgroup(tmp_path: Path) -> None:
    root = fake_cgroup_root(tmp_path / "cg")
    assert cgroups.detect(root=root) == (root, "")
    assert set((root / "cgroup.subtree_control").read_text().split()) == {"+cpu", "+memory"}
    assert list(root.iterdir()) != [] and not (root / ".yard-probe").exists()


def test_detect_refuses_a_cgroup_without_the_memory_controller(tmp_path: Path) -> None:
    root = fake_cgroup_root(tmp_path / "cg", controllers="cpu io pids")
    base, reason = cgroups.detect(root=root)
    assert base is None and "memory" in reason and str(root) in reason


def test_detect_without_cgroup_v2_says_so(tmp_path: Path) -> None:
    base, reason = cgroups.detect(root=None, mount=tmp_path)
    assert base is None and "cgroup v2 is not mounted" in reason


def test_a_task_runs_in_its_own_cgroup_with_its_limits_which_goes_when_it_ends(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_cgroup_root(tmp_path / "cg")
    monkeypatch.setenv(cgroups.ROOT_ENV, str(root))
    release = tmp_path / "release"
    running = start_agent()
    assert running.agent.workloads.limiter.mode == "cgroup"
    portal.set_desired("node-t1", [task_spec(5, f"while [ ! -e {release} ]; do sleep 0.05; done", cpus=3, memory_mb=2048)])
    group = root / "yard-task-5-1"
    portal.wait_for(lambda: (group / "cgroup.procs").exists(), what="the task's cgroup")
    record = portal.wait_for(lambda: running.record(5) if running.record(5) and running.record(5).pid else None)
    assert (group / "cpu.max").read_text() == "300000 100000"
    assert (group / "memory.max").read_text() == str(2048 * 1024 * 1024)
    assert (group / "cgroup.procs").read_text() == str(record.pid)
    release.touch()
    status = portal.wait_for(lambda: portal.statuses_of(5, "exited"), what="task 5 exited")[-1]
    assert status["exit_code"] == 0
    assert not group.exists()


def test_a_limit_that_cannot_be_applied_never_fails_the_launch(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_cgroup_root(tmp_path / "cg")
    (root / "yard-task-6-1").write_text("in the way")  # the task's cgroup cannot be made
    monkeypatch.setenv(cgroups.ROOT_ENV, str(root))
    start_agent()
    portal.set_desired("node-t1", [task_spec(6, "echo ran", cpus=1, memory_mb=64)])
    status = portal.wait_for(lambda: portal.statuses_of(6, "exited"), what="task 6 exited")[-1]
    assert status["exit_code"] == 0
    assert portal.wait_for(lambda: portal.log_text(6)) == "ran\n"


def test_a_spec_without_limits_starts_unheld_and_unpinned(spawned) -> None:
    limiter = cgroups.Limiter(base=None, reason="test", log=log)
    child, folder = spawned("u", "grep Cpus_allowed_list /proc/self/status > allowed", hold=False)
    assert limiter.apply((2, 1), child.pid, cgroups.Limits.from_spec({"cpus": None}), others=[]) == "unlimited"
    assert child.wait(timeout=10) == 0
    assert allowed_list((folder / "allowed").read_text()) == set(CORES)


# --------------------------------------------------------------------------- real use


def test_a_busy_workload_shows_its_cores_used(spawned) -> None:
    """What a spinning workload really got of the CPU, measured by itself: on a loaded machine (the suite
    on several workers) it gets less than a core, so a fixed share (> 0.5 of a core) was a flake. It
    prints its CPU time (process_time) against time.monotonic, the meter's clock (CLOCK_MONOTONIC is one
    for the whole machine), every 50 ms of spinning."""
    spin = "while time.monotonic() - t < 0.05: pass"
    busy = (
        f"{sys.executable} -c 'import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end:\n"
        f"    t = time.monotonic()\n    {spin}\n    print(time.monotonic(), time.process_time(), flush=True)'"
    )
    child, folder = spawned("busy", busy)
    launcher.release(child)

    def said() -> list[tuple[float, float]]:
        """(monotonic, CPU seconds) of every whole line the workload has printed so far."""
        text = (folder / "log").read_text() if (folder / "log").exists() else ""
        return [(float(a), float(b)) for a, b in (line.split() for line in text.split("\n")[:-1])]

    def first_said(when: float, cpu_s: float = 0.0) -> tuple[float, float]:
        """The first line at or after `when` (and `cpu_s` of CPU), waited for."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if found := [r for r in said() if r[0] >= when and r[1] >= cpu_s]:
                return found[0]
            time.sleep(0.02)
        raise AssertionError(f"the workload said nothing after {when} (log: {said()[-5:]})")

    first_said(0.0)  # the interpreter is up and spinning
    meter = cgroups.UseMeter()
    t1 = time.monotonic()
    first = meter.measure([((1, 1), child.pid, None)])[(1, 1)]
    at_first = first_said(t1)
    first_said(t1, cpu_s=at_first[1] + 1.0)  # a CPU second more, however long the machine takes to give it
    t2 = time.monotonic()
    second = meter.measure([((1, 1), child.pid, None)])[(1, 1)]
    at_second = first_said(t2)
    got = (at_second[1] - at_first[1]) / (at_second[0] - at_first[0])
    assert first.cpu_used is None  # one reading is no interval
    assert second.cpu_used is not None and second.cpu_used > 0, second
    assert abs(second.cpu_used - got) <= 0.1 + 0.1 * got, (second, f"the workload had {got:.3f} of a core")


def test_a_workload_holding_200_mb_shows_it_resident(spawned) -> None:
    hold = f'{sys.executable} -c \'import time\nx = b"y" * (200 * 1024 * 1024)\nprint("held", flush=True)\ntime.sleep(30)\''
    child, folder = spawned("mem", hold)
    launcher.release(child)
    wait_file(folder / "log")
    use = cgroups.UseMeter().measure([((1, 1), child.pid, None)])[(1, 1)]
    assert use.memory_used_mb is not None and use.memory_used_mb > 150, use
    assert use.memory_peak_mb is not None and use.memory_peak_mb >= use.memory_used_mb


def test_use_is_read_from_the_cgroup_when_the_task_has_one(tmp_path: Path) -> None:
    group = tmp_path / "yard-task-1-1"
    group.mkdir()
    (group / "memory.current").write_text(str(300 * 1024 * 1024))
    (group / "memory.peak").write_text(str(512 * 1024 * 1024))
    now = [100.0]
    meter = cgroups.UseMeter(clock=lambda: now[0])
    (group / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 900000\nsystem_usec 100000\n")
    assert meter.measure([((1, 1), 0, group)])[(1, 1)] == cgroups.TaskUse(None, 300.0, 512.0)
    now[0] += 10.0
    (group / "cpu.stat").write_text("usage_usec 33000000\nuser_usec 30000000\nsystem_usec 3000000\n")
    assert meter.measure([((1, 1), 0, group)])[(1, 1)].cpu_used == 3.2


def test_heartbeats_report_each_running_tasks_real_use(portal: FakePortal, start_agent: StartAgent, affinity_only: None) -> None:
    start_agent()
    busy = f"{sys.executable} -c 'import time\nt = time.time()\nwhile time.time() - t < 20: pass'"
    portal.set_desired("node-t1", [task_spec(3, busy, cpus=1, memory_mb=1024)])

    # Some CPU, not a share of a core: on a loaded machine the spinning task gets what it gets (that the
    # reading is what the workload really had is test_a_busy_workload_shows_its_cores_used's).
    def busy_report() -> dict[str, object] | None:
        for beat in portal.heartbeats("node-t1"):
            for task in beat["tasks"]:
                if task["task_id"] == 3 and (task.get("cpu_used") or 0) > 0:
                    return task  # type: ignore[no-any-return]
        return None

    report = portal.wait_for(busy_report, what="a heartbeat showing the busy task")
    assert report["memory_used_mb"] > 1 and report["memory_peak_mb"] >= report["memory_used_mb"]


def test_a_fleets_agents_share_one_pass_over_proc_a_second(spawned, monkeypatch: pytest.MonkeyPatch) -> None:
    # nodeagent.fleet: hundreds of agents on one host read one /proc; a pass each per heartbeat
    # starved the fleet's heartbeats. A pass younger than max_age_s serves every meter of the process.
    child, _folder = spawned("shared", "exec sleep 30")
    launcher.release(child)
    # Until the wrapper has exec'd sleep the tree may show no resident pages (a loaded machine can hold it
    # mid-exec for a while): wait for the process itself, with a deadline, before counting passes.
    deadline = time.monotonic() + 15.0
    while not (cgroups.UseMeter().measure([((1, 1), child.pid, None)])[(1, 1)].memory_used_mb or 0) > 0:
        assert time.monotonic() < deadline, "the child never showed resident memory in /proc"
        time.sleep(0.05)
    passes = []
    real = cgroups.scan_proc
    monkeypatch.setattr(cgroups, "scan_proc", lambda: passes.append(1) or real())
    now = [50.0]
    shared = cgroups.SharedProcPasses(max_age_s=1.0, clock=lambda: now[0])
    monkeypatch.setattr(cgroups, "_shared_passes", shared)
    meters = [cgroups.UseMeter(clock=shared.clock) for _ in range(3)]
    uses = [m.measure([((1, 1), child.pid, None)])[(1, 1)] for m in meters]
    assert len(passes) == 1 and all(u.memory_used_mb and u.memory_used_mb > 0 for u in uses), uses
    now[0] += 1.5  # older than max_age_s: the next reading takes a new pass, and its time is the pass's
    second = meters[0].measure([((1, 1), child.pid, None)])[(1, 1)]
    assert len(passes) == 2 and second.cpu_used is not None and second.cpu_used >= 0.0
    assert cgroups.UseMeter().measure([((1, 1), child.pid, None)]) and len(passes) == 3  # another clock: its own pass
