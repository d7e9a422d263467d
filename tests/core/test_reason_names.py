"""Pending and stop reasons name the job they speak of by its name and number: 'notebook-alice (#471)'."""

from dataclasses import replace

from scheduling.core import reasons
from scheduling.core.eta import with_estimates
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot

TOPO = cluster(nodes_per_leaf=2)  # n000, n001: 16 H100
NOW = 100_000.0


def named(job, name):
    return replace(job, name=name)


def test_job_label_is_name_and_number_or_the_number_alone():
    assert reasons.job_label("471", "notebook-alice") == "notebook-alice (#471)"
    assert reasons.job_label("471") == "#471"


def test_a_quota_wait_names_the_job_whose_end_frees_it():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 8}})
    busy = [named(running("471", [gpu_ids(TOPO, "n000")], team="vision", time_limit=600), "notebook-alice")]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=quotas)
    out = with_estimates(snap, plan(snap, now=0.0), now=0.0)
    assert out.pending_reasons["j"].endswith("; frees up when job notebook-alice (#471) ends")


def test_a_reclaim_names_the_job_it_reclaims_for():
    quotas = quota_tree({"owner": {"H100": 8}, "borrower": {"H100": 0}})
    busy = [
        running("x", [gpu_ids(TOPO, "n000")], team="borrower", start=0.0),
        running("y", [gpu_ids(TOPO, "n001")], team="borrower", start=1.0),
    ]
    result = plan(
        snapshot(TOPO, running=busy, pending=[named(pending("493", 1, 8, team="owner"), "train-bob")], quotas=quotas), now=NOW
    )
    assert "reclaimed for job train-bob (#493) (team owner within guarantee)" in result.preemptions[0].reason


def test_a_wait_behind_a_reservation_names_the_reserving_job():
    busy = [
        running("long0", [gpu_ids(TOPO, "n000")], start=0.0, time_limit=NOW + 9000),
        running("long1", [gpu_ids(TOPO, "n001", range(4))], start=0.0, time_limit=NOW + 2400),
        running("filler", [gpu_ids(TOPO, "n001", range(4, 6))], time_limit=NOW + 100),
    ]
    jobs = [named(pending("487", 1, 8), "big-run"), pending("long", 1, 2, submit_time=1.0, time_limit=99_999.0)]
    result = plan(snapshot(TOPO, running=busy, pending=jobs), now=NOW)
    assert result.pending_reasons["long"].startswith("waiting behind a reservation for job big-run (#487)")


def test_a_limit_not_yet_reached_is_not_said_to_be_reached():
    quotas = quota_tree({"vision": {"H100": 0}}, limits={"vision": {"H100": 8}})
    busy = [running("r", [gpu_ids(TOPO, "n000", range(1))], team="vision")]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=quotas)
    why = plan(snap, now=NOW).pending_reasons["j"]
    assert "limit 8 H100, 1 in use, 7 free; the job needs 8" in why
    assert "reached" not in why
