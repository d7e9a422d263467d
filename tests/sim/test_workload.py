"""The gang-heavy generator honours its mix: the GPU-time share of gangs, the gang-size tilt, the bursts."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace

import pytest

from scheduling.sim.trace import TraceJob, load_trace
from scheduling.sim.workload import MIXES, PHILLY, GangHeavy, gang_gpu_share, gang_heavy

GPN = 8


@pytest.fixture(scope="module")
def philly() -> list[TraceJob]:
    return load_trace(PHILLY)


def gangs_of(jobs: list[TraceJob]) -> list[TraceJob]:
    return [j for j in jobs if j.num_gpus > GPN]


@pytest.mark.parametrize("share", [0.5, 0.65, 0.8])
@pytest.mark.parametrize("bias", [0.0, 2.0])
def test_gangs_hold_the_share_of_gpu_time_asked(philly: list[TraceJob], share: float, bias: float) -> None:
    # The share is an expectation over random draws; 11,000 jobs put it within a few points.
    jobs = gang_heavy(GangHeavy(seed=7, gang_share=share, gang_size_bias=bias), philly)
    assert gang_gpu_share(jobs, GPN) == pytest.approx(share, abs=0.04)


def test_the_size_bias_draws_gangs_in_proportion_to_size_to_the_power_asked(philly: list[TraceJob]) -> None:
    bias = 2.0
    pool = [j for j in philly if j.num_gpus > GPN and j.duration_s > 0]
    weight = {g: n * float(g) ** bias for g, n in Counter(j.num_gpus for j in pool).items()}
    expected = {g: w / sum(weight.values()) for g, w in weight.items()}
    drawn = Counter(j.num_gpus for j in gangs_of(gang_heavy(GangHeavy(seed=3, gang_size_bias=bias), philly)))
    total = sum(drawn.values())
    for g in (16, 32):  # the sizes drawn often enough to measure
        assert drawn[g] / total == pytest.approx(expected[g], abs=0.04), g
    # Against the uniform draw (bias 0) the larger gangs come several times as often.
    flat = Counter(j.num_gpus for j in gangs_of(gang_heavy(GangHeavy(seed=3), philly)))
    assert drawn[32] / total > 2.5 * flat[32] / sum(flat.values())


def test_bursts_submit_the_mean_number_of_jobs_together_at_the_same_offered_load(philly: list[TraceJob]) -> None:
    alone = gang_heavy(GangHeavy(seed=5), philly)
    bursty = gang_heavy(GangHeavy(seed=5, burst=4.0), philly)
    per_second = Counter(j.submit_time for j in bursty)
    assert statistics.fmean(per_second.values()) == pytest.approx(4.0, rel=0.1)
    assert len(set(j.submit_time for j in alone)) > 0.99 * len(alone)  # without bursts, one job a second
    for jobs in (alone, bursty):
        offered = sum(j.num_gpus * j.duration_s for j in jobs) / (800 * jobs[-1].submit_time)
        assert offered == pytest.approx(GangHeavy().load, abs=0.08)


def test_a_burst_below_one_job_is_refused(philly: list[TraceJob]) -> None:
    with pytest.raises(ValueError, match="burst"):
        gang_heavy(GangHeavy(jobs=10, burst=0.5), philly)


def test_the_evaluations_two_workloads_differ_in_seed_and_mix() -> None:
    first, second = MIXES["gang-heavy"], MIXES["gang-heavy-b"]
    assert first == GangHeavy()  # the first is the generator's defaults, the workload of before
    assert second.seed != first.seed
    assert replace(second, seed=first.seed) != first  # not only another seed


def test_the_second_workload_is_measured_to_have_its_mix(philly: list[TraceJob]) -> None:
    mix = MIXES["gang-heavy-b"]
    jobs = gang_heavy(mix, philly)
    first = gang_heavy(MIXES["gang-heavy"], philly)
    assert gang_gpu_share(jobs, GPN) == pytest.approx(mix.gang_share, abs=0.04)
    assert statistics.fmean(j.num_gpus for j in gangs_of(jobs)) > statistics.fmean(j.num_gpus for j in gangs_of(first)) + 3
    assert len(jobs) / len(set(j.submit_time for j in jobs)) == pytest.approx(mix.burst, rel=0.1)
