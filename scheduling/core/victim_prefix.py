"""A victim prefix: victims freed in preference order until the gang fits (where one node's victims do not).

The plain prefix gives each victim's GPUs back in turn and searches; the counted ones (a gang that must
stay under one leaf, and one of whole nodes) free victims in counts per node and leaf and search only
where a leaf fits, and fall back to the plain one where the counts and the search disagree.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE
from scheduling.core.placement import find_job
from scheduling.core.types import PendingJob
from scheduling.core.victims import Candidate, Loc, Reclaim, VictimSearch


class PrefixSearch(VictimSearch):
    """The prefix searches of ``Reclaimer`` (``preemption``), over the state ``VictimSearch`` holds."""

    # False runs the plain victim prefix for every gang (the reference of tests/property/test_fast_paths.py).
    count_in_one_leaf = True

    def _prefix(self, st: FreeState, job: PendingJob, usable: list[Candidate], one_leaf: bool) -> Reclaim | None:
        """Free victims in preference order until the gang fits somewhere; keep those the fit uses."""
        if (
            one_leaf
            and self.count_in_one_leaf
            and not job.one_fabric
            and not job.spread
            and not job.needs
            and job.gpu_count > self.ix.type_max_node.get(job.gpu_type, 0)
        ):
            return self._prefix_in_one_leaf(st, job, usable)
        return self._prefix_plain(st, job, usable, one_leaf)

    def _prefix_whole_nodes(self, st: FreeState, job: PendingJob) -> Reclaim | None:
        """``_prefix_in_one_leaf`` for a gang of whole (largest) nodes, from when each node comes free.

        A replica takes a whole node, so a leaf fits once ``replicas`` of its nodes are entirely free,
        and a node is entirely free from its last victim in preference order on (when every GPU busy on
        it is a victim's). So each leaf's first fitting prefix is the victim at which its ``replicas``-th
        node comes free, read from the nodes' victims (``on_node``) and their places in the preemptor's
        order, and the prefix ends at the first check (where ``_prefix`` checks) at or after the earliest
        of them. Only the victims up to there are walked, for the checks' count of free GPUs; a Tier 1
        gang of 256 GPUs would otherwise count, GPU by GPU, thousands of small victims over the cluster.
        """
        if self.shared_gpus:  # a GPU named by two running jobs: counts by node would count it twice
            return self._prefix_in_one_leaf(st, job, self.usable(job, own_first=False))
        ix, t, per, replicas = self.ix, job.gpu_type, job.gpus_per_replica, job.replicas
        order = self._may_take_all(job, own_first=False)
        pos = self._positions(order)
        taken, reserved, reserved_nodes = self.taken, self.reserved, self.reserved_nodes
        gone = sorted(pos[j] for j in taken if j in pos)  # places in ``order`` that ``usable`` leaves out
        leaf_of, free_of, dfree = self._ready_leaf(t), st.free, st.dfree[NODE]

        def place(job_id: str) -> int:  # the victim's index in ``usable``
            at = pos[job_id]
            return at - bisect_left(gone, at)

        free_from: dict[int, list[int]] = {}  # leaf -> for each node that can come free, from which victim on
        already: dict[int, int] = {}  # leaf -> its nodes free now
        for li in range(len(st.leaf_tfree)):
            hist = st.leaf_hist[li].get(t)
            if hist is not None and per < len(hist) and hist[per]:
                already[li] = hist[per]
                free_from[li] = [-1] * hist[per]
        cover, version = self.cover, self.version
        lasts = self._last_cache.setdefault(id(order), {})  # node -> (its version, its last victim's place)
        for li, nodes in self._freeable(order, pos, st, per).items():
            if len(nodes) + already.get(li, 0) < replicas:
                continue  # even with all of them free, the leaf holds too few replicas
            for ni in nodes:
                busy = per - dfree[ni]
                # Most nodes hold GPUs no preemptor may take (Tier 1, young jobs, this plan's placements):
                # their victims' GPUs fall short of the busy ones, and the node is passed over unread.
                if busy == 0 or cover[ni] != busy or ni in reserved_nodes:
                    continue
                seen = lasts.get(ni)
                if seen is None or seen[0] != version[ni]:  # a claim on the node changed its victims
                    last = -1
                    for c, _ in self.on_node[ni]:
                        job_id = c.job.job_id
                        if job_id in taken or job_id not in pos:
                            last = -2  # a busy GPU this job may not have: the node never comes free for it
                            break
                        last = max(last, pos[job_id])
                    seen = lasts[ni] = (version[ni], last)
                if seen[1] >= 0:
                    free_from.setdefault(li, []).append(seen[1] - bisect_left(gone, seen[1]))
        fits_from = {li: sorted(at)[replicas - 1] for li, at in free_from.items() if len(at) >= replicas}
        if not fits_from:
            return None
        first = min(fits_from.values())
        for i in self._checks(st, job, order, gone):
            if i < first:
                continue
            # The GPUs the plain prefix would have given back in the leaves that fit: the search picks
            # among those leaves as it would (the others fit in neither).
            given = sorted(
                loc
                for li, at in fits_from.items()
                if at <= i
                for ni in ix.leaf_nodes[li]
                if leaf_of[ni] >= 0
                for c, _ in self.on_node.get(ni, ())
                if c.job.job_id not in taken and c.job.job_id in pos and place(c.job.job_id) <= i
                for loc in c.locs
                if loc[0] == ni and not free_of[ni][loc[1]] and not (ni in reserved_nodes and loc in reserved)
            )
            st.give_locs(given)
            fit = find_job(st, job, one_leaf=True)
            st.take_locs(given)
            if fit is None:  # the counts and the search disagree: let the plain prefix decide
                return self._prefix_plain(st, job, self.usable(job, own_first=False), True)
            # The victims of the prefix whose GPUs the fit uses, in preference order: all on its nodes.
            used = {(ni, p) for ni, positions in fit.replicas for p in positions}
            on_fit = {
                c.job.job_id: c.job
                for ni, _ in fit.replicas
                for c, _ in self.on_node.get(ni, ())
                if c.job.job_id not in taken and c.job.job_id in pos and place(c.job.job_id) <= i and not used.isdisjoint(c.locs)
            }
            waits_on = tuple(sorted(on_fit.values(), key=lambda j: pos[j.job_id]))
            return Reclaim(fit, tuple(j for j in waits_on if not j.terminating), waits_on)
        return None

    def _checks(self, st: FreeState, job: PendingJob, order: list[Candidate], gone: list[int]) -> Iterator[int]:
        """The indexes in ``usable`` (``order`` less the places in ``gone``) at which ``_prefix`` checks.

        After each victim it checks if the type has GPUs enough and it is the last of its class or
        ``step`` victims have gone by since the last check (1, doubling after 16 checks, up to 64). Once
        the type has GPUs enough (a busy cluster has more free GPUs than most gangs from the start) the
        places follow from the class boundaries alone: only the victims before that are walked.
        """
        t, need, taken, reserved, reserved_nodes = job.gpu_type, job.gpu_count, self.taken, self.reserved, self.reserved_nodes
        count = len(order) - len(gone)
        ends = sorted({b - bisect_left(gone, b) - 1 for b in self._class_ends(order)} - {-1})
        checks, step, since, at = 0, 1, 0, -1
        type_free = st.type_free.get(t, 0)
        if type_free < need:
            leaf_of, free_of, last_of_class = self._ready_leaf(t), st.free, set(ends)
            for at, cand in enumerate(c for c in order if c.job.job_id not in taken):
                for loc in cand.locs:
                    if (
                        leaf_of[loc[0]] >= 0
                        and not free_of[loc[0]][loc[1]]
                        and not (loc[0] in reserved_nodes and loc in reserved)
                    ):
                        type_free += 1
                since += 1
                if type_free < need:
                    continue
                if since >= step or at in last_of_class:
                    since, checks = 0, checks + 1
                    yield at
                break
            else:
                return
        while at < count - 1:
            later = ends[bisect_left(ends, at + 1)]
            at, since = min(at + step - since, later), 0
            if checks >= 16:
                step = min(step * 2, 64)
            checks += 1
            yield at

    def _prefix_plain(self, st: FreeState, job: PendingJob, usable: list[Candidate], one_leaf: bool) -> Reclaim | None:
        """``_prefix`` on the live state: each victim's GPUs given back in turn, all taken back at the end."""
        need = job.gpu_count
        freed: list[Loc] = []
        found: Reclaim | None = None
        checks = 0
        step = 1
        since_check = 0
        for i, cand in enumerate(usable):
            mine = [(ni, p) for ni, p in cand.locs if (ni, p) not in self.reserved and not st.free[ni][p]]
            st.give_locs(mine)
            freed.extend(mine)
            since_check += 1
            last_of_class = i + 1 == len(usable) or usable[i + 1].cls != cand.cls
            if st.type_free.get(job.gpu_type, 0) < need or (since_check < step and not last_of_class):
                continue
            fit = find_job(st, job, one_leaf=one_leaf)
            since_check = 0
            checks += 1
            # Check after every victim at first, then less often: the search stays cheap when
            # thousands of small jobs would have to go, at the price of a slightly longer prefix.
            if checks > 16:
                step = min(step * 2, 64)
            if fit is not None:
                used = {(ni, p) for ni, positions in fit.replicas for p in positions}
                waits_on = tuple(c.job for c in usable[: i + 1] if any(loc in used for loc in c.locs))
                found = Reclaim(fit, tuple(j for j in waits_on if not j.terminating), waits_on)
                break
        st.take_locs(freed)
        return found

    def _prefix_in_one_leaf(self, st: FreeState, job: PendingJob, usable: list[Candidate]) -> Reclaim | None:
        """``_prefix`` for a gang larger than a node that must stay under one leaf, in counts.

        Such a gang fits exactly when some leaf has, on its READY nodes of the type, as many free GPUs
        as the gang and room for its replicas (``placement_span._multi_node``), and freeing victims only
        raises those counts. So victims are freed in counts (free GPUs per touched node and leaf, replica
        room per leaf), checked where ``_prefix`` checks, and only at the first check where a leaf fits
        are their GPUs in fitting leaves given back for the real search: it sees those leaves exactly as
        ``_prefix`` would (the others fit in neither) and picks the same placement. A large gang could
        otherwise free thousands of small victims one by one over the whole cluster, then take them back.
        """
        ix, t, per, replicas, need = self.ix, job.gpu_type, job.gpus_per_replica, job.replicas, job.gpu_count
        nodes, dfree, reserved = ix.nodes, st.dfree[NODE], self.reserved
        type_free = st.type_free.get(t, 0)
        fitting = {
            li for li, free in enumerate(st.leaf_tfree) if free.get(t, 0) >= need and st.leaf_capacity(li, t, per) >= replicas
        }
        node_free: dict[int, int] = {}
        leaf_free: dict[int, int] = {}
        leaf_room: dict[int, int] = {}
        freed: set[Loc] = set()  # a GPU named by two running jobs is freed once
        checks = 0
        step = 1
        since_check = 0
        leaf_of = self._ready_leaf(t)
        free_of = st.free
        for i, cand in enumerate(usable):
            for loc in cand.locs:
                ni, p = loc
                li = leaf_of[ni]
                # What giving it back would change for this job: a busy, unreserved GPU of its type on a
                # READY node (other GPUs change nothing its search reads).
                if li < 0 or free_of[ni][p] or loc in reserved or loc in freed:
                    continue
                freed.add(loc)
                type_free += 1
                old = node_free.get(ni, dfree[ni])
                node_free[ni] = old + 1
                if li not in leaf_free:
                    leaf_free[li], leaf_room[li] = st.leaf_tfree[li].get(t, 0), st.leaf_capacity(li, t, per)
                leaf_free[li] += 1
                leaf_room[li] += (old + 1) // per - old // per
                if leaf_free[li] >= need and leaf_room[li] >= replicas:
                    fitting.add(li)
            since_check += 1
            last_of_class = i + 1 == len(usable) or usable[i + 1].cls != cand.cls
            if type_free < need or (since_check < step and not last_of_class):
                continue
            since_check = 0
            checks += 1
            if checks > 16:
                step = min(step * 2, 64)
            if not fitting:
                continue
            given = sorted(loc for loc in freed if nodes[loc[0]].leaf in fitting)
            st.give_locs(given)
            fit = find_job(st, job, one_leaf=True)
            st.take_locs(given)
            if fit is None:  # the counts and the search disagree: let the plain prefix decide
                return self._prefix_plain(st, job, usable, True)
            used = {(ni, p) for ni, positions in fit.replicas for p in positions}
            waits_on = tuple(c.job for c in usable[: i + 1] if any(loc in used for loc in c.locs))
            return Reclaim(fit, tuple(j for j in waits_on if not j.terminating), waits_on)
        return None
