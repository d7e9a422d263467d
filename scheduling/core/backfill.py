"""Reservations for EASY backfill: when and where the first blocked job will fit.

Running jobs end at the latest at start + time_limit (a terminating job within the
grace period); replaying those ends in time order over a copy of the free state finds
the earliest moment the gang fits, and the topology domain where it does. Feasibility
only grows as jobs end, so the moment is found by galloping then bisecting over the
end times instead of searching after every single end.
"""

from __future__ import annotations

from typing import NamedTuple

from scheduling.core.index import FreeState
from scheduling.core.placement import Fit, find

Loc = tuple[int, int]


class Release(NamedTuple):
    end: float
    job_id: str
    locs: tuple[Loc, ...]


def _apply(st: FreeState, releases: list[Release], start: int, stop: int, reserved: set[Loc]) -> None:
    for rel in releases[start:stop]:
        st.give_locs(loc for loc in rel.locs if loc not in reserved)


def earliest_fit(
    st: FreeState,
    releases: list[Release],
    reserved: set[Loc],
    gpu_type: str,
    replicas: int,
    per_replica: int,
    *,
    one_leaf: bool = False,
) -> tuple[float, Fit] | None:
    """The earliest release time after which the gang fits, with the placement then; None if never.

    ``releases`` must be sorted by end time. GPUs in ``reserved`` stay held for others.
    ``one_leaf``: only a placement under one leaf switch counts (``placement.keep_in_leaf``).
    """
    need = replicas * per_replica
    # cuts[i]: how many releases have happened by the i-th distinct end time.
    cuts: list[int] = [i + 1 for i in range(len(releases)) if i + 1 == len(releases) or releases[i + 1].end != releases[i].end]
    if not cuts:
        return None

    def fits(state: FreeState) -> Fit | None:
        if state.type_free.get(gpu_type, 0) < need:
            return None
        return find(state, gpu_type, replicas, per_replica, one_leaf=one_leaf)

    cur = st.clone()
    applied = 0
    last_fail: tuple[int, FreeState] | None = None  # (cut index, state there)
    probe = 0
    found: tuple[int, Fit] | None = None
    while probe < len(cuts):
        _apply(cur, releases, applied, cuts[probe], reserved)
        applied = cuts[probe]
        fit = fits(cur)
        if fit is not None:
            found = (probe, fit)
            break
        last_fail = (probe, cur.clone())
        probe = probe * 2 + 1 if probe else 1
        if probe >= len(cuts) and last_fail[0] < len(cuts) - 1:
            probe = len(cuts) - 1
    if found is None:
        return None
    # Bisect between the last failing cut and the first fitting one.
    lo_ix, lo_state = last_fail if last_fail is not None else (-1, st.clone())
    lo_applied = cuts[lo_ix] if lo_ix >= 0 else 0
    hi_ix, hi_fit = found
    while hi_ix - lo_ix > 1:
        mid = (lo_ix + hi_ix) // 2
        trial = lo_state.clone()
        _apply(trial, releases, lo_applied, cuts[mid], reserved)
        fit = fits(trial)
        if fit is not None:
            hi_ix, hi_fit = mid, fit
        else:
            lo_ix, lo_state, lo_applied = mid, trial, cuts[mid]
    return releases[cuts[hi_ix] - 1].end, hi_fit
