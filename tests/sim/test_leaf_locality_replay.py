"""``--leaf-locality``: what every gang of a replay asks of a leaf switch, and the replay that crashed with it.

With ``--leaf-locality preferred`` at 25 % span slowdown, the seven-job trace below stopped with PlanError
at 7140 s: a due reservation (j4, beyond its guarantee) preempted the at-risk gang j7, and the guarantee
reclaim for j15 picked j7 again ("preempts j7, which is not running or already stopping"). It completes now.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduling.core.plan import plan
from scheduling.core.types import Config, LeafLocality, Plan, Snapshot
from scheduling.sim.cli import main
from scheduling.sim.cluster import ClusterShape
from scheduling.sim.engine import Replay
from scheduling.sim.replay_types import ReplayConfig
from scheduling.sim.trace import load_trace, time_limits

TRACE = """job_id,submit_time,duration_s,num_gpus,num_nodes,team,user,status,gpu_type
j0,1800,7200,2,1,b,u,completed,
j2,3600,3600,24,3,b,u,completed,
j3,3600,7200,8,1,a,u,completed,
j4,4200,20000,32,4,c,u,completed,
j5,4200,20000,8,1,c,u,completed,
j7,4320,7200,16,2,b,u,completed,
j15,7110,3600,8,1,c,u,completed,
"""
QUOTAS = "vc,node num\na,1\nb,1\nc,1\n"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    trace, quotas = tmp_path / "trace.csv", tmp_path / "quotas.csv"
    trace.write_text(TRACE)
    quotas.write_text(QUOTAS)
    return trace, quotas


def test_the_preferred_replay_that_crashed_completes(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    trace, quotas = files
    argv = [
        "--trace", str(trace), "--quotas", str(quotas), "--nodes", "8", "--nodes-per-leaf", "4",
        "--leaves-per-spine", "2", "--gang-heavy-nodes", "0", "--policies", "yardmaster",
        "--time-limits", "oracle", "--slowdowns", "0.25", "--leaf-locality", "preferred",
        "--busy-from", "0", "--jobs", "1",
    ]  # fmt: skip
    assert main(argv) == 0  # raised PlanError before the fix
    assert "| yardmaster (oracle) |" in capsys.readouterr().out


@pytest.mark.parametrize("locality", list(LeafLocality))
def test_every_pending_job_of_the_replay_asks_the_locality_given(files: tuple[Path, Path], locality: LeafLocality) -> None:
    jobs = load_trace(files[0])
    seen: set[LeafLocality] = set()
    stops: list[str] = []

    def policy(snapshot: Snapshot, *, now: float) -> Plan:
        seen.update(j.locality for j in snapshot.pending)
        result = plan(snapshot, now=now)
        stops.extend(p.job_id for p in result.preemptions)
        return result

    result = Replay(
        jobs,
        policy,
        shape=ClusterShape(nodes=8, gpus_per_node=8, nodes_per_leaf=4, leaves_per_spine=2),
        limits=time_limits(jobs, "oracle"),
        team_weights={"a": 1.0, "b": 1.0, "c": 1.0},
        config=ReplayConfig(span_slowdown=0.25, leaf_locality=locality, core=replace(Config(), backfill_at_risk=True)),
        name="yardmaster",
    ).run()
    assert seen == {locality}
    assert not result.unfinished
    assert len(stops) == len(set(stops))  # no job told to stop twice
