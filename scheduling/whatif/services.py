"""Writes of the what-if: copy the live tree into a draft, edit the draft under the live tree's rules,
apply it in one audited step, start, run and cancel a replay. Keyword-only, atomic."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from scheduling.selectors.config import scheduler_config, yard_number
from scheduling.whatif.models import DraftQuota, QuotaDraft, RunState, WhatIfRun
from scheduling.whatif.replay import Cancelled, replay_tree
from scheduling.whatif.results import compare
from scheduling.whatif.selectors import (
    Cell,
    Values,
    base_cells,
    cell_key,
    draft_cells,
    fleet,
    live_cells,
    quota_units,
    subtree_units,
    usage_before,
    window_jobs,
    window_jobs_count,
)
from tenants.dispatch import send_task
from tenants.models import OrgUnit, Quota
from tenants.services import audit, check_quota, quota_change_words, quota_set

log = logging.getLogger(__name__)

# The most a window may span: a replay's cost grows with its jobs, and the question is about a month.
MAX_WINDOW_DAYS = 62
# How often a running replay writes its progress (and reads whether it was cancelled).
PROGRESS_EVERY_S = 1.0

# --------------------------------------------------------------------------- drafts


@transaction.atomic
def draft_create(*, actor: User | None, root: OrgUnit, name: str = "") -> QuotaDraft:
    """A copy of the live quotas of ``root``'s subtree, remembered as they are now (``base``)."""
    cells = live_cells(root=root)
    name = name.strip() or f"Draft of {root.name}, {timezone.localtime():%Y-%m-%d %H:%M}"
    draft = QuotaDraft.objects.create(
        root=root,
        name=name[:100],
        created_by=actor if actor is not None and actor.pk else None,
        base={cell_key(u, t): list(v) for (u, t), v in sorted(cells.items())},
    )
    DraftQuota.objects.bulk_create(
        DraftQuota(draft=draft, unit_id=u, gpu_type=t, guaranteed=g, limit=lim, weight=w) for (u, t), (g, lim, w) in cells.items()
    )
    audit(
        actor=actor, action="draft.create", obj=draft, unit=root, message=f"copied {root.name}'s quotas into draft {draft.name}"
    )
    return draft


def _refuse_applied(draft: QuotaDraft) -> None:
    if draft.applied_at is not None:
        raise ValidationError(
            f"Draft {draft.name} was applied on {draft.applied_at:%Y-%m-%d %H:%M}; copy the live tree into a new draft"
        )


def _check_cell(draft: QuotaDraft, cells: Mapping[Cell, Values], unit: OrgUnit, gpu_type: str, values: Values) -> None:
    """The live tree's rules (tenants.services.check_quota) on the draft's figures; the draft's root
    against its parent as the live tree has it (the parent is outside the draft)."""
    guaranteed, limit, weight = values

    def g(unit_id: int) -> int:
        return cells.get((unit_id, gpu_type), (0, None, 1.0))[0]

    if unit.pk == draft.root_id:
        # The draft's root against its parent and siblings as the live tree has them: they are outside it.
        parent_g: int | None = None
        siblings = guaranteed
        if unit.parent_id is not None:
            parent_q = Quota.objects.filter(unit_id=unit.parent_id, gpu_type=gpu_type).first()
            parent_g = parent_q.guaranteed if parent_q else 0
            others = Quota.objects.filter(unit__parent_id=unit.parent_id, gpu_type=gpu_type).exclude(unit=unit)
            siblings += sum(others.values_list("guaranteed", flat=True))
    else:
        parent_g = g(unit.parent_id) if unit.parent_id is not None else None
        siblings = sum(
            g(pk) for pk in OrgUnit.objects.filter(parent_id=unit.parent_id).exclude(pk=unit.pk).values_list("pk", flat=True)
        )
        siblings += guaranteed
    children = sum(g(pk) for pk in OrgUnit.objects.filter(parent=unit).values_list("pk", flat=True))
    check_quota(
        unit=unit,
        gpu_type=gpu_type,
        guaranteed=guaranteed,
        limit=limit,
        weight=weight,
        parent_guaranteed=parent_g,
        siblings_guaranteed=siblings,
        children_guaranteed=children,
    )


@transaction.atomic
def draft_quota_set(
    *,
    actor: User | None,
    draft: QuotaDraft,
    unit: OrgUnit,
    gpu_type: str,
    guaranteed: int,
    limit: int | None = None,
    weight: float = 1.0,
) -> DraftQuota:
    """Edit one cell of the draft, validated as the live tree's editor validates (the draft's own figures)."""
    QuotaDraft.objects.select_for_update().filter(pk=draft.pk).exists()
    draft.refresh_from_db()
    _refuse_applied(draft)
    gpu_type = gpu_type.strip()
    if not gpu_type:
        raise ValidationError({"gpu_type": "Name a GPU type, e.g. H100"})
    if len(gpu_type) > 32:
        raise ValidationError({"gpu_type": "A GPU type has at most 32 characters"})
    if not unit.path.startswith(draft.root.path):
        raise ValidationError({"unit": f"{unit.name} is not in this draft (it copies {draft.root.name}'s subtree)"})
    cells = draft_cells(draft=draft)
    cells[(unit.pk, gpu_type)] = (guaranteed, limit, weight)
    _check_cell(draft, cells, unit, gpu_type, (guaranteed, limit, weight))
    cell, _ = DraftQuota.objects.update_or_create(
        draft=draft, unit=unit, gpu_type=gpu_type, defaults={"guaranteed": guaranteed, "limit": limit, "weight": weight}
    )
    return cell


def draft_changes(*, draft: QuotaDraft) -> dict[Cell, tuple[Values | None, Values]]:
    """Cells the draft changed since its copy: cell -> (value at the copy or None, draft's value)."""
    base, mine = base_cells(draft=draft), draft_cells(draft=draft)
    return {cell: (base.get(cell), v) for cell, v in mine.items() if base.get(cell) != v}


def draft_conflicts(*, draft: QuotaDraft) -> list[str]:
    """What changed in the live tree since the copy, in cells the draft changes too (or units gone).

    Decision: a live edit in a cell the draft leaves alone is no conflict (apply keeps it: only the
    draft's own changes are written); a live edit in a cell the draft also changes is, since applying
    would silently undo it."""
    base, live = base_cells(draft=draft), live_cells(root=draft.root)
    units = {u.pk: u for u in subtree_units(root=draft.root)}
    out = []
    for (unit_id, gpu_type), (_, _) in sorted(draft_changes(draft=draft).items()):
        unit = units.get(unit_id)
        if unit is None:
            out.append(f"unit #{unit_id} was removed or moved out of {draft.root.name}")
            continue
        if live.get((unit_id, gpu_type)) != base.get((unit_id, gpu_type)):
            now_ = live.get((unit_id, gpu_type))
            was = base.get((unit_id, gpu_type))
            out.append(f"{unit.name} {gpu_type} was {_words(was)} when copied and is {_words(now_)} now")
    return out


def _words(values: Values | None) -> str:
    if values is None:
        return "unset"
    g, lim, w = values
    return f"guaranteed {g}, limit {'none' if lim is None else lim}, weight {w:g}"


@transaction.atomic
def draft_apply(*, actor: User | None, draft: QuotaDraft) -> int:
    """Write the draft's changes to the live tree in one transaction and one audit step (a quota row per
    cell, as the editor writes, and one ``draft.apply`` row); refused if the live tree changed since the
    copy in a cell the draft changes too. Returns how many cells changed."""
    QuotaDraft.objects.select_for_update().filter(pk=draft.pk).exists()
    draft.refresh_from_db()
    _refuse_applied(draft)
    # Serialise with live edits: quota_set locks units the same way.
    OrgUnit.objects.select_for_update().filter(path__startswith=draft.root.path).exists()
    conflicts = draft_conflicts(draft=draft)
    if conflicts:
        raise ValidationError(
            "The live tree changed since this draft was copied: "
            + "; ".join(conflicts)
            + ". Copy the live tree into a new draft and redo your edits."
        )
    changes = draft_changes(draft=draft)
    units = {u.pk: u for u in subtree_units(root=draft.root)}
    # Lowering first, deepest first; then raising, shallowest first: each step then keeps the tree valid
    # (the draft as a whole already is), so the live tree's own checks pass cell by cell.
    lower = sorted(
        (c for c, (was, v) in changes.items() if v[0] < (was or (0, None, 1.0))[0]), key=lambda c: (-units[c[0]].depth, c)
    )
    rest = sorted((c for c in changes if c not in set(lower)), key=lambda c: (units[c[0]].depth, c))
    for unit_id, gpu_type in [*lower, *rest]:
        g, lim, w = changes[(unit_id, gpu_type)][1]
        quota_set(actor=actor, unit=units[unit_id], gpu_type=gpu_type, guaranteed=g, limit=lim, weight=w)
    words = [
        f"{units[u].name} {t}: {quota_change_words(_named(was), _named(v), created=was is None)}"
        for (u, t), (was, v) in sorted(changes.items())
    ]
    draft.applied_at = timezone.now()
    draft.applied_by = actor if actor is not None and actor.pk else None
    draft.save(update_fields=["applied_at", "applied_by"])
    audit(
        actor=actor,
        action="draft.apply",
        obj=draft,
        unit=draft.root,
        message=f"applied draft {draft.name}: " + ("; ".join(words) or "no changes"),
        data={"changes": {cell_key(u, t): {"before": was, "after": v} for (u, t), (was, v) in changes.items()}},
    )
    return len(changes)


def _named(values: Values | None) -> dict[str, object]:
    if values is None:
        return {}
    return {"guaranteed": values[0], "limit": values[1], "weight": values[2]}


# --------------------------------------------------------------------------- runs


def default_window(*, now: datetime) -> tuple[datetime, datetime]:
    """The last calendar month, in the portal's time zone."""
    local = timezone.localtime(now)
    this_month = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    return last_month, this_month


@transaction.atomic
def whatif_start(*, actor: User | None, draft: QuotaDraft, start: datetime, end: datetime) -> WhatIfRun:
    if end <= start:
        raise ValidationError({"end": "The window must end after it starts"})
    if (end - start).days > MAX_WINDOW_DAYS:
        raise ValidationError({"end": f"A window spans at most {MAX_WINDOW_DAYS} days; pick a shorter one"})
    count = window_jobs_count(start=start, end=end)
    if count == 0:
        raise ValidationError(
            {
                "start": f"No jobs ran that were submitted between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M}: "
                "nothing to replay; pick another window"
            }
        )
    run = WhatIfRun.objects.create(
        draft=draft, created_by=actor if actor is not None and actor.pk else None, window_start=start, window_end=end, jobs=count
    )
    transaction.on_commit(lambda: send_task("scheduling.whatif.tasks.run_whatif", (run.pk,)))
    return run


@transaction.atomic
def whatif_cancel(*, run: WhatIfRun) -> bool:
    """Stop a run: a queued one at once, a running one at its next progress report. True if it was live."""
    if WhatIfRun.objects.filter(pk=run.pk, state=RunState.QUEUED).update(
        state=RunState.CANCELLED, finished_at=timezone.now(), message="cancelled before it started"
    ):
        return True
    return bool(WhatIfRun.objects.filter(pk=run.pk, state=RunState.RUNNING).update(state=RunState.CANCELLING))


class _Progress:
    """Writes a run's progress at most every PROGRESS_EVERY_S and stops the replay once it is cancelled."""

    def __init__(self, run_id: int, low: float, high: float) -> None:
        self.run_id, self.low, self.high = run_id, low, high
        self.last = 0.0

    def __call__(self, fraction: float) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        value = self.low + (self.high - self.low) * fraction
        if not WhatIfRun.objects.filter(pk=self.run_id, state=RunState.RUNNING).update(progress=value):
            raise Cancelled


def whatif_run(*, run_id: int) -> str:
    """Replay the run's window under the live tree, then under the draft, and store the comparison.
    Claimed by one conditional update, so a redelivered task does nothing. Returns the final state."""
    if not WhatIfRun.objects.filter(pk=run_id, state=RunState.QUEUED).update(state=RunState.RUNNING, started_at=timezone.now()):
        return "not queued"
    run = WhatIfRun.objects.select_related("draft", "draft__root").get(pk=run_id)
    try:
        result = _replay_both(run)
    except Cancelled:
        WhatIfRun.objects.filter(pk=run_id).update(state=RunState.CANCELLED, finished_at=timezone.now(), message="cancelled")
        return RunState.CANCELLED
    except Exception as error:
        log.exception("what-if run %s failed", run_id)
        WhatIfRun.objects.filter(pk=run_id).update(
            state=RunState.FAILED, finished_at=timezone.now(), message=f"the replay failed: {error}"
        )
        return RunState.FAILED
    done = WhatIfRun.objects.filter(pk=run_id, state=RunState.RUNNING).update(
        state=RunState.DONE, progress=1.0, finished_at=timezone.now(), result=result
    )
    if not done:
        WhatIfRun.objects.filter(pk=run_id).update(state=RunState.CANCELLED, finished_at=timezone.now(), message="cancelled")
        return RunState.CANCELLED
    return RunState.DONE


def _replay_both(run: WhatIfRun) -> dict[str, object]:
    draft = run.draft
    topology = fleet()
    window = window_jobs(start=run.window_start, end=run.window_end, fleet=topology)
    if not window.jobs:
        raise ValueError("none of the window's jobs can be replayed on today's fleet")
    config, cycle_s = scheduler_config(), yard_number("CYCLE_INTERVAL_S")
    initial = usage_before(start=run.window_start, half_life_s=config.half_life_s)
    live_tree = quota_units()
    draft_tree = quota_units(draft=draft)
    outcomes = []
    for n, tree in enumerate((live_tree, draft_tree)):
        outcomes.append(
            replay_tree(
                jobs=window.jobs,
                fleet=topology,
                quotas=tree,
                config=config,
                cycle_s=cycle_s,
                progress=_Progress(run.pk, n / 2, (n + 1) / 2),
                initial_usage=initial,
            )
        )
    return compare(
        live=outcomes[0],
        draft=outcomes[1],
        window=window,
        units=subtree_units(root=draft.root),
        trees=(live_tree, draft_tree),
        span_s=(run.window_end - run.window_start).total_seconds(),
    )
