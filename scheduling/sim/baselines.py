"""Baseline policies, with the core's signature ``(snapshot, *, now) -> Plan``.

They are deliberately what the named systems do, not strawmen and not improved:

* ``fifo``: strict FIFO in submit order; the first job that does not fit blocks
  everything behind it. First-fit over nodes in name order, whole gang or nothing.
* ``KubeFirstFit``: a scheduler without gang or topology awareness (default
  kube-scheduler, one pod per replica). Pods are bound one at a time, first fit
  over nodes in name order, and jobs that do not fit are skipped. A gang whose
  pods are only partly bound holds those GPUs idle until its last pod is bound;
  the job starts only then. Without a gang plugin that can deadlock for ever, so
  (our choice, like the coscheduling plugin's schedule timeout) a partial gang
  older than ``timeout_s`` releases its pods and backs off for ``backoff_s``
  before it binds again. Being stateful, it is a callable object, not a function.
* ``easy_backfill`` (policy ``easy-blind``): EASY backfill blind to topology. Jobs in submit order start while
  they fit (best fit: the node left with the fewest free GPUs); the first one
  that does not fit gets one reservation at the earliest time the running jobs'
  time limits free enough GPUs for it; later jobs backfill if they end before
  that time or use only GPUs the reservation does not need. Nodes only: no leaf
  or spine awareness (Slurm without topology/tree; easy-topo is Slurm with it).
* ``easy_backfill_topo`` (policy ``easy-topo``): the same EASY backfill with Slurm's node selection under
  ``select/cons_tres`` and ``topology/tree``: a gang goes to the lowest switch that
  can hold it (one node, one leaf, one spine, the cluster) and, inside it, to leaf
  switches by best fit: a leaf that holds what is left of the gang, the one with
  the least room, else the leaf with the most room, again (``_eval_nodes_topo``);
  nodes inside a leaf by best fit too. Like Slurm without ``--switches`` it never
  waits for a leaf: it spans when no leaf has room now. Its reservation is found
  with the same selection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import chain
from operator import attrgetter, itemgetter

from scheduling.core.types import (
    PendingJob,
    Placement,
    Plan,
    Reservation,
    RunningJob,
    Snapshot,
    Topology,
)
from scheduling.sim.cluster import span


class _Index:
    """Per-topology lookups, built once per Topology object (the engine keeps one)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        nodes = sorted(topology.nodes, key=lambda n: n.name)
        self.names = [n.name for n in nodes if n.schedulable]
        self.gpus = {n.name: tuple(g.id for g in n.gpus) for n in nodes}
        self.type = {n.name: n.gpu_type for n in nodes}
        self.leaf = {n.name: n.leaf for n in nodes}
        self.spine = {n.name: n.spine for n in nodes}


_index_cache: list[_Index] = []


def _index(topology: Topology) -> _Index:
    if not _index_cache or _index_cache[0].topology is not topology:
        _index_cache[:] = [_Index(topology)]
    return _index_cache[0]


_by_id = attrgetter("job_id")
_by_submit = attrgetter("submit_time")
_replicas = attrgetter("replicas")
_first = itemgetter(0)


def free_gpus(snapshot: Snapshot, idx: _Index) -> dict[str, list[str]]:
    """Schedulable node -> its free GPU ids, in index order."""
    # Every running GPU id, gathered in C (a set.update per replica was most of this function).
    taken = set(chain.from_iterable(chain.from_iterable(map(_replicas, snapshot.running))))
    out: dict[str, list[str]] = {}
    for n in idx.names:
        gpus = idx.gpus[n]
        # A busy cluster's nodes are mostly all taken or all free: two set tests (in C) settle those
        # without testing each GPU; the same lists as testing each (speed only).
        if taken.isdisjoint(gpus):
            out[n] = list(gpus)
        elif taken.issuperset(gpus):
            out[n] = []
        else:
            out[n] = [g for g in gpus if g not in taken]
    return out


def _placement(idx: _Index, job_id: str, replicas: list[tuple[str, ...]], nodes: list[str]) -> Placement:
    locality, leaves, spines = span(nodes, idx.leaf, idx.spine)
    return Placement(
        job_id=job_id,
        replicas=tuple(replicas),
        nodes=tuple(nodes),
        locality=locality,
        leaves=leaves,
        spines=spines,
        borrowed=False,
    )


def _submit_order(pending: Iterable[PendingJob]) -> list[PendingJob]:
    """By (submit time, job id). Two stable sorts on one attribute each give exactly that order, with
    the keys read and compared in C rather than a (time, id) tuple built per job per cycle."""
    return sorted(sorted(pending, key=_by_id), key=_by_submit)


def _take(free: dict[str, list[str]], nodes: list[str], per: int) -> list[tuple[str, ...]]:
    out = []
    for n in nodes:
        out.append(tuple(free[n][:per]))
        del free[n][:per]
    return out


def _first_fit_nodes(counts: dict[str, int], idx: _Index, job: PendingJob) -> list[str] | None:
    """Node of each replica, first fit in name order; ``counts`` is updated only on success."""
    chosen: list[str] = []
    left = dict.fromkeys(idx.names, 0)
    for _ in range(job.replicas):
        for n in idx.names:
            if idx.type[n] == job.gpu_type and counts[n] - left[n] >= job.gpus_per_replica:
                left[n] += job.gpus_per_replica
                chosen.append(n)
                break
        else:
            return None
    for n in chosen:
        counts[n] -= job.gpus_per_replica
    return chosen


def _best_fit_nodes(counts: dict[str, int], idx: _Index, job: PendingJob, cap: dict[str, int] | None = None) -> list[str] | None:
    """Node of each replica, the one left with the fewest free GPUs (ties: name order).

    ``cap``, if given, bounds what may be used per node. ``counts`` (and ``cap``)
    are decremented only when the whole gang fits.
    """
    per = job.gpus_per_replica
    used: dict[str, int] = {}
    chosen: list[str] = []
    for _ in range(job.replicas):
        best, best_free = None, 1 << 30
        for n in idx.names:
            c = counts[n] if cap is None else min(counts[n], cap[n])
            if used:
                c -= used.get(n, 0)
            if per <= c < best_free and idx.type[n] == job.gpu_type:
                best, best_free = n, c
                if c == per:
                    break
        if best is None:
            return None
        used[best] = used.get(best, 0) + per
        chosen.append(best)
    for n, u in used.items():
        counts[n] -= u
        if cap is not None:
            cap[n] -= u
    return chosen


def _switch_fit_nodes(
    counts: dict[str, int], idx: _Index, job: PendingJob, cap: dict[str, int] | None = None
) -> list[str] | None:
    """Node of each replica as Slurm's topology/tree picks them: the lowest switch that holds the gang,
    leaves inside it by best fit, nodes inside each leaf by best fit (``_best_fit_nodes``' rule).

    ``counts`` (and ``cap``) are decremented only when the whole gang fits.
    """
    if job.replicas == 1:
        return _best_fit_nodes(counts, idx, job, cap)
    per, want = job.gpus_per_replica, job.replicas
    avail: dict[str, int] = {}
    room: dict[str, int] = {}  # leaf -> replicas it holds now
    nodes_of: dict[str, list[str]] = {}
    for n in idx.names:
        a = counts[n] if cap is None else min(counts[n], cap[n])
        if a >= per and idx.type[n] == job.gpu_type:
            avail[n] = a
            leaf = idx.leaf[n]
            room[leaf] = room.get(leaf, 0) + a // per
            nodes_of.setdefault(leaf, []).append(n)
    if sum(room.values()) < want:
        return None
    leaves = list(room)  # in node-name order, i.e. leaf order (cluster.py pads node names)
    spine_of = {leaf: idx.spine[nodes_of[leaf][0]] for leaf in leaves}
    # The lowest switch level with room for the whole gang: one leaf, else one spine, else the cluster;
    # at each level the switch with the least room that still holds it (best fit).
    fitting = [lf for lf in leaves if room[lf] >= want]
    if fitting:
        pool = [min(fitting, key=room.__getitem__)]
    else:
        spine_room: dict[str, int] = {}
        for lf in leaves:
            spine_room[spine_of[lf]] = spine_room.get(spine_of[lf], 0) + room[lf]
        spines = [sp for sp, r in spine_room.items() if r >= want]
        top = min(spines, key=lambda sp: (spine_room[sp], sp)) if spines else None
        pool = [lf for lf in leaves if top is None or spine_of[lf] == top]
    # Leaves in Slurm's order: one that holds what is left (the least room such), else the roomiest.
    chosen: list[str] = []
    left = want
    while left > 0:
        enough = [lf for lf in pool if room[lf] >= left]
        leaf = min(enough, key=room.__getitem__) if enough else max(pool, key=room.__getitem__)  # ties: name order
        pool.remove(leaf)
        take = min(left, room[leaf])
        # Nodes of the leaf by best fit: the fewest free GPUs first, several replicas on a node if it has room.
        for n in sorted(nodes_of[leaf], key=lambda n: (avail[n], n)):
            while avail[n] >= per and take > 0:
                chosen.append(n)
                avail[n] -= per
                take -= 1
                left -= 1
    for n in chosen:
        counts[n] -= per
        if cap is not None:
            cap[n] -= per
    return chosen


def _reasons(pending: Iterable[PendingJob], placed: set[str], reason: str) -> dict[str, str]:
    return {j.job_id: reason for j in pending if j.job_id not in placed}


# --------------------------------------------------------------------------- strict FIFO


def fifo(snapshot: Snapshot, *, now: float) -> Plan:
    idx = _index(snapshot.topology)
    free = free_gpus(snapshot, idx)
    counts = {n: len(g) for n, g in free.items()}
    placements = []
    for job in _submit_order(snapshot.pending):
        nodes = _first_fit_nodes(counts, idx, job)
        if nodes is None:
            break  # strict FIFO: the head blocks everyone behind it
        placements.append(_placement(idx, job.job_id, _take(free, nodes, job.gpus_per_replica), nodes))
    placed = {p.job_id for p in placements}
    return Plan(
        placements=tuple(placements),
        preemptions=(),
        reservations=(),
        pending_reasons=_reasons(snapshot.pending, placed, "waiting in FIFO order behind the queue head"),
    )


# --------------------------------------------------------------------------- kube first-fit


class KubeFirstFit:
    def __init__(self, *, timeout_s: float = 600.0, backoff_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.bound: dict[str, list[tuple[str, tuple[str, ...]]]] = {}  # job -> (node, GPUs) per pod
        self.bound_since: dict[str, float] = {}
        self.backoff_until: dict[str, float] = {}
        self.last_now: float | None = None
        self.idle_gpu_s = 0.0  # GPU-seconds held idle by partial gangs
        self.timeouts = 0

    def extra_metrics(self) -> dict[str, float]:
        return {"partial_gang_idle_gpu_h": self.idle_gpu_s / 3600.0, "partial_gang_timeouts": self.timeouts}

    def _held_gpus(self) -> int:
        return sum(len(g) for pods in self.bound.values() for _, g in pods)

    def __call__(self, snapshot: Snapshot, *, now: float) -> Plan:
        if self.last_now is not None:
            self.idle_gpu_s += self._held_gpus() * (now - self.last_now)
        self.last_now = now
        idx = _index(snapshot.topology)
        free = free_gpus(snapshot, idx)
        pending_ids = {j.job_id for j in snapshot.pending}
        for job_id in list(self.bound):
            expired = now - self.bound_since[job_id] >= self.timeout_s
            if job_id not in pending_ids or expired:
                if expired:
                    self.timeouts += 1
                    self.backoff_until[job_id] = now + self.backoff_s
                del self.bound[job_id], self.bound_since[job_id]
        for pods in self.bound.values():
            for node, gpus in pods:
                held = set(gpus)
                if not held.issubset(free[node]):
                    raise RuntimeError("a partial gang's bound GPUs were given to another job")
                free[node] = [g for g in free[node] if g not in held]
        total_free = sum(len(g) for g in free.values())
        placements = []
        no_fit: dict[str, int] = {}
        for job in _submit_order(snapshot.pending):
            if total_free == 0:
                break
            if self.backoff_until.get(job.job_id, -1.0) > now:
                continue
            pods = self.bound.get(job.job_id, [])
            per = job.gpus_per_replica
            while len(pods) < job.replicas:
                # Free GPUs only shrink within a call: a pod size that found no node
                # finds none later either (speed only, same decisions).
                if per >= no_fit.get(job.gpu_type, 1 << 30):
                    break
                found = next((n for n in idx.names if len(free[n]) >= per and idx.type[n] == job.gpu_type), None)
                if found is None:
                    no_fit[job.gpu_type] = min(per, no_fit.get(job.gpu_type, 1 << 30))
                    break
                pods.append((found, tuple(free[found][:per])))
                del free[found][:per]
                total_free -= per
            if len(pods) == job.replicas:
                self.bound.pop(job.job_id, None)
                self.bound_since.pop(job.job_id, None)
                nodes = [n for n, _ in pods]
                placements.append(_placement(idx, job.job_id, [g for _, g in pods], nodes))
            elif pods and job.job_id not in self.bound:
                self.bound[job.job_id] = pods
                self.bound_since[job.job_id] = now
        placed = {p.job_id for p in placements}
        return Plan(
            placements=tuple(placements),
            preemptions=(),
            reservations=tuple(
                Reservation(
                    job_id=j,
                    domain="partial-gang",
                    earliest_start=now,
                    gpus=tuple(g for _, gs in pods for g in gs),
                )
                for j, pods in self.bound.items()
            ),
            pending_reasons=_reasons(snapshot.pending, placed, "not all pods fit on a node yet"),
        )


# --------------------------------------------------------------------------- EASY backfill


FitNodes = Callable[..., list[str] | None]


def _shadow(
    snapshot: Snapshot,
    idx: _Index,
    counts: dict[str, int],
    head: PendingJob,
    started: list[tuple[float, list[str], int]],
    now: float,
    fit_nodes: FitNodes = _best_fit_nodes,
) -> tuple[float, dict[str, int]]:
    """Earliest time the head fits by the running jobs' time limits, and per-node slack then.

    Slack on a node is what stays free at that time after the head takes its GPUs:
    a backfilled job that outlives the reservation may use no more than that.
    """
    ends: list[tuple[float, list[str], int]] = list(started)
    ends.extend((end if end > now else now, nodes, per) for end, nodes, per in map(_end_of(idx), snapshot.running))
    # Ends at one time are taken together below, so their order among themselves does not matter.
    ends.sort(key=_first)
    projected = dict(counts)
    # Both node choices (best fit; Slurm's switch fit) place a gang of R replicas of P GPUs whenever
    # R replica slots exist, a slot being P free GPUs on one node of its type (each replica placed
    # takes exactly one slot of its node), and fail otherwise. So the slots are counted as GPUs free
    # up and the node choice runs once, at the first time they suffice: the same time and the same
    # slack as trying it at every end time, without scanning every node at each.
    per_head, want, kind = head.gpus_per_replica, head.replicas, head.gpu_type
    slots = sum(c // per_head for n, c in projected.items() if idx.type[n] == kind)
    i = 0
    while i < len(ends):
        t = ends[i][0]
        while i < len(ends) and ends[i][0] == t:
            _, nodes, per = ends[i]
            for n in nodes:
                if n in projected:
                    before = projected[n]
                    projected[n] = before + per
                    if idx.type[n] == kind:
                        slots += (before + per) // per_head - before // per_head
            i += 1
        if slots < want:
            continue  # no layout holds it yet
        trial = dict(projected)
        if fit_nodes(trial, idx, head) is not None:
            return t, trial
    return float("inf"), dict.fromkeys(counts, 0)


_End = tuple[float, list[str], int]  # (end by the time limit, or -inf if stopping; node of each replica; GPUs per replica)
_end_cache: list[tuple[Topology, dict[str, str], dict[int, tuple[RunningJob, _End]]]] = []


def _end_of(idx: _Index) -> Callable[[RunningJob], _End]:
    """A running job's end (by its time limit; -inf for a stopping job, which ``_shadow`` clamps to now
    as it does every end already past), the node of each replica and its GPUs per replica. Kept per
    RunningJob object (the engine hands a running job to every cycle as the same object until it
    changes), checked by identity, so a reused id never answers wrongly."""
    if not _end_cache or _end_cache[0][0] is not idx.topology:
        _end_cache[:] = [(idx.topology, {g: n for n, gs in idx.gpus.items() for g in gs}, {})]
    _, lookup, seen = _end_cache[0]
    if len(seen) > 100_000:
        seen.clear()

    def end_of(r: RunningJob) -> _End:
        hit = seen.get(id(r))
        if hit is not None and hit[0] is r:
            return hit[1]
        end = -math.inf if r.terminating else r.start + r.time_limit
        found = seen[id(r)] = (r, (end, [lookup[rep[0]] for rep in r.replicas], len(r.replicas[0])))
        return found[1]

    return end_of


def easy_backfill(snapshot: Snapshot, *, now: float) -> Plan:
    return _easy(snapshot, now, _best_fit_nodes)


def easy_backfill_topo(snapshot: Snapshot, *, now: float) -> Plan:
    return _easy(snapshot, now, _switch_fit_nodes)


def _easy(snapshot: Snapshot, now: float, fit_nodes: FitNodes) -> Plan:
    idx = _index(snapshot.topology)
    free = free_gpus(snapshot, idx)
    counts = {n: len(g) for n, g in free.items()}
    total_free = sum(counts.values())
    placements: list[Placement] = []
    started: list[tuple[float, list[str], int]] = []  # (limit end, nodes, GPUs per replica)
    head: PendingJob | None = None
    shadow, slack = float("inf"), dict[str, int]()
    reservations: list[Reservation] = []
    # Free GPUs and slack only shrink during a cycle, so a gang shape that failed
    # once fails again: remember it instead of rescanning the nodes (speed only).
    failed: set[tuple[int, int, str, bool]] = set()
    for job in _submit_order(snapshot.pending):
        if total_free == 0:
            break
        short = head is None or now + job.time_limit <= shadow
        shape = (job.replicas, job.gpus_per_replica, job.gpu_type, short)
        nodes = None
        if job.gpu_count <= total_free and shape not in failed:
            nodes = fit_nodes(counts, idx, job, None if short else slack)
            if nodes is None:
                failed.add(shape)
        if nodes is None:
            if head is None:
                head = job
                shadow, slack = _shadow(snapshot, idx, counts, job, started, now, fit_nodes)
                reservations.append(Reservation(job_id=job.job_id, domain="cluster", earliest_start=shadow))
            continue
        total_free -= job.gpu_count
        started.append((now + job.time_limit, nodes, job.gpus_per_replica))
        placements.append(_placement(idx, job.job_id, _take(free, nodes, job.gpus_per_replica), nodes))
    placed = {p.job_id for p in placements}
    return Plan(
        placements=tuple(placements),
        preemptions=(),
        reservations=tuple(reservations),
        pending_reasons=_reasons(snapshot.pending, placed, "waiting for GPUs (EASY backfill)"),
        estimated_start={head.job_id: shadow} if head is not None and shadow != float("inf") else {},
    )
