"""Reservations and EASY backfill, and the pending reasons people read."""

from scheduling.core.plan import plan
from scheduling.core.reasons import relative
from scheduling.core.testing import cluster, gpu_ids, pending, running, snapshot
from scheduling.core.types import Config

TOPO = cluster(nodes_per_leaf=2)  # n000, n001
NOW = 1000.0


def busy_one_node_each(end0=NOW + 2400, end1=NOW + 4800):
    # n000 frees at end0, n001 at end1; 4 GPUs of n001 stay free meanwhile.
    return [
        running("long0", [gpu_ids(TOPO, "n000")], start=0.0, time_limit=end0),
        running("long1", [gpu_ids(TOPO, "n001", range(4))], start=0.0, time_limit=end1),
    ]


def test_first_blocked_job_gets_a_reservation_at_its_earliest_start():
    result = plan(snapshot(TOPO, running=busy_one_node_each(), pending=[pending("big", 1, 8)]), now=NOW)
    (res,) = result.reservations
    assert (res.job_id, res.domain, res.earliest_start) == ("big", "n000", NOW + 2400)
    assert result.estimated_start["big"] == NOW + 2400
    assert result.pending_reasons["big"].endswith("reserved n000, earliest in ~40 min")


def test_reservation_for_a_gang_names_its_leaf():
    topo = cluster(nodes_per_leaf=2, leaves_per_spine=2)
    busy = [running("r", [gpu_ids(topo, "n000")], time_limit=NOW + 600)]
    jobs = [pending("gang", 4, 8)]
    result = plan(snapshot(topo, running=busy, pending=jobs), now=NOW)
    assert result.reservations[0].domain == "spine-0"
    assert result.reservations[0].earliest_start == NOW + 600


def test_later_job_backfills_outside_the_reserved_gpus():
    jobs = [pending("big", 1, 8), pending("small", 1, 4, submit_time=1.0, time_limit=99_999.0)]
    result = plan(snapshot(TOPO, running=busy_one_node_each(), pending=jobs), now=NOW)
    assert [p.job_id for p in result.placements] == ["small"]
    assert set(result.placements[0].replicas[0]).isdisjoint(result.reservations[0].gpus)


def test_short_job_may_use_reserved_gpus_when_it_ends_before_the_reservation():
    # n001 is reserved (it frees first); a job ending before then may borrow its free half.
    busy = busy_one_node_each(end0=NOW + 9000, end1=NOW + 2400)
    busy.append(running("filler", [gpu_ids(TOPO, "n001", range(4, 6))], time_limit=NOW + 100))
    jobs = [pending("big", 1, 8), pending("short", 1, 2, submit_time=1.0, time_limit=600.0)]
    result = plan(snapshot(TOPO, running=busy, pending=jobs), now=NOW)
    assert result.reservations[0].domain == "n001"
    assert [p.job_id for p in result.placements] == ["short"]


def test_long_job_may_not_use_reserved_gpus():
    busy = busy_one_node_each(end0=NOW + 9000, end1=NOW + 2400)
    busy.append(running("filler", [gpu_ids(TOPO, "n001", range(4, 6))], time_limit=NOW + 100))
    jobs = [pending("big", 1, 8), pending("long", 1, 2, submit_time=1.0, time_limit=99_999.0)]
    result = plan(snapshot(TOPO, running=busy, pending=jobs), now=NOW)
    assert result.placements == ()
    assert result.pending_reasons["long"].startswith("waiting behind a reservation for job #big")


def test_only_max_reservations_jobs_get_one():
    jobs = [pending("a", 1, 8), pending("b", 1, 8, submit_time=1.0)]
    one = plan(snapshot(TOPO, running=busy_one_node_each(), pending=jobs), now=NOW)
    two = plan(snapshot(TOPO, running=busy_one_node_each(), pending=jobs, config=Config(max_reservations=2)), now=NOW)
    assert [r.job_id for r in one.reservations] == ["a"]
    assert [r.job_id for r in two.reservations] == ["a", "b"]
    assert two.reservations[1].earliest_start == NOW + 4800


def test_without_backfill_nothing_passes_the_first_blocked_job():
    jobs = [pending("big", 1, 8), pending("small", 1, 1, submit_time=1.0)]
    result = plan(snapshot(TOPO, running=busy_one_node_each(), pending=jobs, config=Config(backfill=False)), now=NOW)
    assert result.placements == ()
    assert "backfill is off" in result.pending_reasons["small"]


def test_every_pending_job_not_placed_has_a_reason():
    jobs = [pending(f"j{i}", 1, 8, submit_time=float(i)) for i in range(5)]
    result = plan(snapshot(TOPO, running=busy_one_node_each(), pending=jobs), now=NOW)
    placed = {p.job_id for p in result.placements}
    assert set(result.pending_reasons) == {j.job_id for j in jobs} - placed


def test_no_free_gpu_of_the_type_says_so():
    full = [running("r0", [gpu_ids(TOPO, "n000")]), running("r1", [gpu_ids(TOPO, "n001")])]
    result = plan(snapshot(TOPO, running=full, pending=[pending("j", 1, 8)], config=Config(backfill=False)), now=NOW)
    assert result.pending_reasons["j"] == "no free H100 on any READY node (8 needed)"


def test_relative_times_read_naturally():
    assert [relative(s) for s in (0, 30, 2400, 7800, 5 * 86400)] == [
        "now",
        "in ~30 s",
        "in ~40 min",
        "in ~2 h 10 min",
        "in ~5 d",
    ]
