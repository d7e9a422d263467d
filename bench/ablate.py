"""Ablations of Yardmaster's policy through scheduling.sim's own replay (issue 30 part 2; the tables in
docs/scheduler-core.md, "Aging", were printed by this script).

    python bench/ablate.py --rows philly:192:0 philly:160:0.25 gang-heavy:100:0 \
        --policies "ym;no-reclaim;no-fairshare;cfg:age_first_s=43200;easy-topo" --jobs 2

Each row is workload:nodes:slowdown; each policy a Yardmaster variant (CFG: a Config change; ORDER: the
queue's order without fair share or without the in-guarantee split; cfg:KEY=VALUE,...: any Config field)
or a replay policy name (the baselines). "ym" is the replay's default Yardmaster (backfill at risk off, as
deployed, since the replay's default was corrected; the tables were measured with it on). Appends one
JSON line per replay to --out and prints a table. Not part of `make bench`: it measures quality, not speed.
"""

import argparse
import gc
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dataclasses import replace

from scheduling.core.fairshare import team_order
from scheduling.core.plan import _Planner
from scheduling.core.types import id_order
from scheduling.sim import cli
from scheduling.sim.policies import make_policy as base_make_policy

CFG = {
    "ym": {},
    "no-reclaim": {"preemption": False},
    "resv-0": {"max_reservations": 0},
    "resv-4": {"max_reservations": 4},
    "no-at-risk": {"backfill_at_risk": False},
    "at-risk": {"backfill_at_risk": True},
    "leaf-required": {"span_slowdown": math.inf},
    "no-backfill": {"backfill": False},
}
ORDER = {  # (fair share rank on?, in-guarantee-first split on?)
    "no-fairshare": (False, True),
    "fifo-order": (False, False),
    "no-split": (True, False),
}


class AblPlanner(_Planner):
    fair = True
    split = True

    def _ordered(self):
        rank = team_order(self.snap.quotas, self.ix.share_capacity())
        last = len(rank)

        def wt(j):
            return (j.tier, -j.priority, j.submit_time, id_order(j.job_id))

        in_team = sorted(self.snap.pending, key=wt)
        ing, queued = set(), {}
        for j in in_team:
            k = (j.team, j.gpu_type)
            queued[k] = queued.get(k, 0) + j.gpu_count
            if self.quota.within_guarantee(j.team, j.gpu_type, queued[k], j.tier):
                ing.add(j.job_id)

        def key(j):
            return (
                j.tier,
                (j.job_id not in ing) if self.split else False,
                rank.get(j.team, last) if self.fair else 0,
                j.team if self.fair else "",
                -j.priority,
                j.submit_time,
                id_order(j.job_id),
            )

        return sorted(in_team, key=key)


class Pol:
    def __init__(self, changes, order=None):
        self.changes, self.order = changes, order

    def __call__(self, snapshot, *, now):
        snap = replace(snapshot, config=replace(snapshot.config, **self.changes)) if self.changes else snapshot
        if self.order is None:
            from scheduling.core.plan import plan

            return plan(snap, now=now)
        cls = type("P", (AblPlanner,), {"fair": self.order[0], "split": self.order[1]})
        on = gc.isenabled()
        gc.disable()
        try:
            return cls(snap, now).run()
        finally:
            if on:
                gc.enable()


def parse_changes(name):
    # "cfg:key=val,key=val" e.g. cfg:age_first_s=86400
    out = {}
    for part in name[4:].split(","):
        k, v = part.split("=")
        out[k] = float(v) if k.endswith("_s") or "." in v or v in ("inf",) else int(v)
    return out


def make_policy(name):
    if name in CFG:
        return Pol(CFG[name])
    if name in ORDER:
        return Pol({}, ORDER[name])
    if name.startswith("cfg:"):
        return Pol(parse_changes(name))
    return base_make_policy(name)


cli.make_policy = make_policy


def row(s):
    g = s.queue_by_gang
    return {
        "workload": s.workload,
        "nodes": s.nodes,
        "slowdown": s.slowdown,
        "policy": s.policy,
        "mode": s.time_limits,
        "jct": s.jct_mean,
        "p95": s.queue.p95,
        "p95_1": g["1"].p95,
        "p95_2_8": g["2-8"].p95,
        "p95_gt8": g[">8"].p95,
        "mean_2_8": g["2-8"].mean,
        "util": s.utilisation,
        "min_g": s.min_honoured,
        "teams": {t.team: t.honoured for t in s.teams},
        "preempt": s.preemptions,
        "one_leaf": s.multinode_one_leaf,
        "wall": s.wall_s,
        "plan_s": s.plan_s,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", required=True)
    ap.add_argument("--policies", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tag", default="")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", default="ablate-results.jsonl", help="JSON lines, one per replay, appended")
    a = ap.parse_args()
    tasks = []
    for r in a.rows:
        wl, nodes, sd = r.split(":")
        args = cli.parser().parse_args(["--time-limits", "estimate"] + (["--limit", str(a.limit)] if a.limit else []))
        if wl == cli.GANG_HEAVY:
            args.gang_heavy_nodes = int(nodes)
        for p in a.policies.split(";"):
            mode = "-" if p in ("fifo", "first-fit") else "estimate"
            tasks.append(cli.Task(wl, p, int(nodes), mode, float(sd), args))
    tasks.sort(
        key=lambda t: (
            t.policy.startswith("easy") or t.policy in ("fifo", "first-fit"),
            -t.nodes if t.workload != "gang-heavy" else 0,
        )
    )
    t0 = time.time()
    res = []
    with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
        for s in pool.imap_unordered(cli._replay, tasks, chunksize=1):
            res.append(s)
            with open(a.out, "a") as f:
                d = row(s)
                d["tag"] = a.tag
                f.write(json.dumps(d) + "\n")
    print(f"wall {time.time() - t0:.0f} s")
    print("| workload | nodes | slow | policy | avg JCT | p95 | p95 1 | p95 2-8 | p95 >8 | util | min guar | preempt | wall |")
    for s in res:
        d = row(s)
        print(
            f"| {d['workload']} | {d['nodes']} | {d['slowdown']:g} | {d['policy']} | {d['jct']:,.0f} | {d['p95']:,.0f} | {d['p95_1']:,.0f} | "
            f"{d['p95_2_8']:,.0f} | {d['p95_gt8']:,.0f} | {100 * d['util']:.1f} | {100 * d['min_g']:.1f} | {d['preempt']} | {d['wall']:.0f} |"
        )


if __name__ == "__main__":
    main()
