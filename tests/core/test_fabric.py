"""Multi-node NVLink domains (fabric domains, ``Node.fabric``): a gang that one fabric domain holds goes
there first, best fit; ``one_fabric`` keeps it there or makes it wait, and reservations and reclaims
for it stay inside one domain too."""

from dataclasses import replace

from scheduling.core.free_state import FreeState
from scheduling.core.index import TopoIndex
from scheduling.core.placement import find
from scheduling.core.plan import plan
from scheduling.core.testing import gpu_ids, node, quota_tree, running, snapshot
from scheduling.core.testing import pending as any_pending
from scheduling.core.types import Config, Locality, PendingJob, Tier, Topology

# Two leaves of six 4-GPU trays. In each leaf the first two nodes are in no fabric domain and the last
# four form one (nvl-a in leaf-0, nvl-b in leaf-1): a leaf search alone would start on the first two.
FABRIC_OF = {f"n{i:03d}": "nvl-a" for i in range(2, 6)} | {f"n{i:03d}": "nvl-b" for i in range(8, 12)}
TOPO = Topology(
    nodes=tuple(
        replace(node(name, leaf=f"leaf-{i // 6}", gpus=4, pcie_switches=1, numa_nodes=1), fabric=FABRIC_OF.get(name, ""))
        for i, name in enumerate(f"n{i:03d}" for i in range(12))
    )
)
NVL_A = {"n002", "n003", "n004", "n005"}
NVL_B = {"n008", "n009", "n010", "n011"}


def pending(job_id: str, replicas: int = 4, gpus_per_replica: int = 4, *, one_fabric: bool = False, **kw: object) -> PendingJob:
    return replace(any_pending(job_id, replicas, gpus_per_replica, **kw), one_fabric=one_fabric)  # type: ignore[arg-type]


def nodes_of(gpus: tuple[str, ...]) -> set[str]:
    return {g.split("/")[0] for g in gpus}


def test_gang_that_one_fabric_domain_holds_lands_in_one():
    (p,) = plan(snapshot(TOPO, pending=[pending("g")]), now=0.0).placements
    assert p.locality == Locality.FABRIC
    assert set(p.nodes) == NVL_A
    assert (p.leaves, p.spines) == (1, 1)


def test_best_fit_picks_the_fabric_domain_left_with_fewest_free_gpus():
    busy = [running("r", [gpu_ids(TOPO, "n011", [0])], time_limit=7200.0)]
    (p,) = plan(snapshot(TOPO, running=busy, pending=[pending("g", 3)]), now=0.0).placements
    assert set(p.nodes) <= NVL_B
    assert p.locality == Locality.FABRIC


def test_fabric_fit_names_its_domain():
    ix = TopoIndex(TOPO)
    fit = find(FreeState(ix, ()), "H100", 4, 4)
    assert fit is not None and fit.domain == "nvl-a"


def one_gpu_busy_in_each_fabric(ends_a: float = 3600.0, ends_b: float = 3600.0) -> list:
    return [
        running("ra", [gpu_ids(TOPO, "n002", [0])], time_limit=ends_a),
        running("rb", [gpu_ids(TOPO, "n008", [0])], time_limit=ends_b),
    ]


def test_gang_without_one_fabric_spans_fabric_domains_in_one_leaf_when_none_has_room():
    (p,) = plan(snapshot(TOPO, running=one_gpu_busy_in_each_fabric(), pending=[pending("g")]), now=0.0).placements
    assert p.locality == Locality.LEAF


def test_one_fabric_gang_waits_rather_than_span_and_says_why():
    snap = snapshot(TOPO, running=one_gpu_busy_in_each_fabric(), pending=[pending("g", one_fabric=True)])
    result = plan(snap, now=0.0)
    assert result.placements == ()
    assert result.pending_reasons["g"].startswith(
        "needs 4 replicas of 4 H100 inside one NVLink fabric domain; best domain holds 3"
    )


def test_one_fabric_gang_that_fits_one_node_needs_no_fabric_domain():
    (p,) = plan(snapshot(TOPO, pending=[pending("g", 2, 2, one_fabric=True)]), now=0.0).placements
    assert len(set(p.nodes)) == 1


def test_one_fabric_gang_larger_than_any_domain_can_never_run():
    result = plan(snapshot(TOPO, pending=[pending("g", 5, one_fabric=True)]), now=0.0)
    assert result.pending_reasons["g"] == (
        "can never run: needs 5 replicas of 4 H100 inside one NVLink fabric domain; the largest domain holds 4"
    )


def test_reservation_for_one_fabric_gang_is_inside_one_domain():
    # Every node busy; at t=100 leaf-0 has five whole nodes (one leaf would do), but nvl-a only frees at
    # 5000 and nvl-b at 3000.
    late = {"n005": 5000.0, "n011": 3000.0}
    busy = [running(f"r{i}", [gpu_ids(TOPO, f"n{i:03d}")], time_limit=late.get(f"n{i:03d}", 100.0)) for i in range(12)]
    cfg = Config(preemption=False)
    loose = plan(snapshot(TOPO, running=busy, pending=[pending("g")], config=cfg), now=0.0)
    assert loose.reservations[0].earliest_start == 100.0
    result = plan(snapshot(TOPO, running=busy, pending=[pending("g", one_fabric=True)], config=cfg), now=0.0)
    (res,) = result.reservations
    assert (res.domain, res.earliest_start) == ("nvl-b", 3000.0)
    assert nodes_of(res.gpus) == NVL_B


def test_reclaim_for_tier1_one_fabric_gang_frees_gpus_in_one_domain():
    # A spot job per node; those outside any fabric domain lose least (just checkpointed), then nvl-b's.
    lost = {n: 10.0 for n in ("n000", "n001", "n006", "n007")} | {n: 500.0 for n in NVL_B} | {n: 900.0 for n in NVL_A}
    busy = [
        running(
            f"s-{n}",
            [gpu_ids(TOPO, n)],
            team="spot",
            tier=Tier.SPOT,
            start=-10_000.0,
            time_limit=100_000.0,
            last_checkpoint=-lost[n],
        )
        for n in sorted(lost)
    ]
    quotas = quota_tree({"prod": {"H100": 48}, "spot": {}})
    job = pending("g", one_fabric=True, team="prod", tier=Tier.PRODUCTION)
    result = plan(snapshot(TOPO, running=busy, pending=[job], quotas=quotas), now=0.0)
    assert {p.job_id for p in result.preemptions} == {f"s-{n}" for n in NVL_B}
    (res,) = result.reservations
    assert nodes_of(res.gpus) == NVL_B
    assert res.domain == "nvl-b"


def test_fabric_domain_across_leaves_keeps_only_the_nodes_under_its_first_leaf():
    stray = replace(TOPO.nodes[6], fabric="nvl-a")  # n006, in leaf-1
    ix = TopoIndex(Topology(nodes=(*TOPO.nodes[:6], stray, *TOPO.nodes[7:])))
    assert ix.fabric_names == ["nvl-a", "nvl-b"]
    assert {ix.nodes[ni].name for ni in ix.fabric_nodes[0]} == NVL_A
    assert ix.nodes[6].fabric == -1


def test_free_counts_per_fabric_domain_follow_takes_and_gives():
    ix = TopoIndex(TOPO)
    st = FreeState(ix, ())
    assert [d["H100"] for d in st.fab_tfree] == [16, 16]
    st.take(5, [0, 1])
    assert st.fab_tfree[0]["H100"] == 14
    assert st.fabric_capacity(0, "H100", 4) == 3
    st.clone().give(5, [0, 1])
    assert st.fab_tfree[0]["H100"] == 14  # a clone changes apart
    st.give(5, [0, 1])
    assert st.fabric_capacity(0, "H100", 4) == 4


def test_cluster_without_fabric_domains_keeps_no_fabric_counts():
    topo = Topology(nodes=tuple(replace(n, fabric="") for n in TOPO.nodes))
    st = FreeState(TopoIndex(topo), ())
    assert st.fab_tfree == [] and st.fab_hist == []
    result = plan(snapshot(topo, pending=[pending("g", one_fabric=True)]), now=0.0)
    assert result.pending_reasons["g"].startswith("can never run: needs one NVLink fabric domain")


def test_the_fast_admission_check_refuses_one_fabric_gangs_as_admit_does():
    from scheduling.core.admission import admit
    from scheduling.core.capacity import capacity_of, refusal

    plain = Topology(nodes=tuple(replace(n, fabric="") for n in TOPO.nodes))
    for topo in (TOPO, plain):
        snap = snapshot(topo, pending=[])
        quotas = quota_tree({"team-a": {"H100": 48}})
        snap = replace(snap, quotas=quotas)
        for replicas, one_fabric in ((4, True), (5, True), (5, False), (1, True)):
            job = pending("new", replicas, one_fabric=one_fabric)
            verdict = admit(snap, job, now=0.0)
            fast = refusal(capacity_of(topo), quotas, job)
            assert (fast is None) == verdict.ok
            assert verdict.ok or fast == verdict.reason
