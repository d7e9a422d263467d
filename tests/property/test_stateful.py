"""A cluster over time: submit, plan (apply placements and preemptions), finish, cancel, lose a node,
change a quota; the plan invariants hold after every step."""

from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduling.core.plan import plan
from scheduling.core.types import Config, PendingJob, RunningJob, Snapshot, Topology
from tests.property.invariants import check_plan
from tests.property.strategies import TEAMS, pending_job, quota_trees, topologies


class ClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.running: dict[str, RunningJob] = {}
        self.pending: dict[str, PendingJob] = {}
        self.next_id = 0
        self.tier1_ids: set[str] = set()

    @initialize(topo=topologies(), quotas=quota_trees(), max_res=st.integers(1, 2))
    def setup(self, topo, quotas, max_res):
        self.topo = topo
        self.quotas = quotas
        self.config = Config(max_reservations=max_res, min_runtime_s=300.0)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.topo,
            tuple(self.running[k] for k in sorted(self.running)),
            tuple(self.pending[k] for k in sorted(self.pending)),
            self.quotas,
            self.config,
        )

    @rule(data=st.data())
    def submit(self, data):
        job = pending_job(f"j{self.next_id}", data.draw)
        self.next_id += 1
        self.pending[job.job_id] = replace(job, submit_time=self.now)

    @rule(advance=st.floats(0, 5000))
    def plan_and_apply(self, advance):
        self.now += advance
        snap = self.snapshot()
        result = plan(snap, now=self.now)
        check_plan(snap, result, self.now)
        assert plan(snap, now=self.now) == result, "plan is not deterministic"
        for pr in result.preemptions:
            assert pr.job_id not in self.tier1_ids, "a Tier 1 job was preempted"
            del self.running[pr.job_id]  # the victim ends within its grace period
        for p in result.placements:
            job = self.pending.pop(p.job_id)
            self.running[p.job_id] = RunningJob(
                job_id=job.job_id,
                team=job.team,
                tier=job.tier,
                gpu_type=job.gpu_type,
                replicas=p.replicas,
                start=self.now,
                time_limit=job.time_limit,
            )
            if job.tier == 1:
                self.tier1_ids.add(job.job_id)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        del self.running[data.draw(st.sampled_from(sorted(self.running)))]

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data):
        del self.pending[data.draw(st.sampled_from(sorted(self.pending)))]

    @rule(data=st.data())
    def lose_node(self, data):
        name = data.draw(st.sampled_from([n.name for n in self.topo.nodes]))
        self.topo = Topology(nodes=tuple(replace(n, schedulable=False) if n.name == name else n for n in self.topo.nodes))
        lost = {g.id for n in self.topo.nodes if n.name == name for g in n.gpus}
        for job_id in [j for j, job in self.running.items() if lost & {g for r in job.replicas for g in r}]:
            del self.running[job_id]  # its gang is requeued by the portal; here it simply ends

    @rule(data=st.data())
    def change_quota(self, data):
        team = data.draw(st.sampled_from(TEAMS))
        guaranteed = data.draw(st.integers(0, 24))
        limit = data.draw(st.none() | st.integers(0, 48))
        self.quotas = tuple(
            replace(u, guaranteed={"H100": guaranteed}, limit={} if limit is None else {"H100": limit}) if u.name == team else u
            for u in self.quotas
        )

    @invariant()
    def running_jobs_never_share_a_gpu(self):
        gpus = [g for job in self.running.values() for r in job.replicas for g in r]
        assert len(gpus) == len(set(gpus))


TestCluster = ClusterMachine.TestCase
TestCluster.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
