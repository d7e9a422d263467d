"""The quota tree editor: org admins edit their subtree, cluster admins the whole tree.

Every write goes through tenants.services (which validates the tree and writes the audit row);
an htmx edit swaps one cell, a plain POST (no JavaScript) redirects or re-renders the page.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from operator import or_
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.forms import QuotaForm, UnitCreateForm, UnitMoveForm
from portal.views.common import add_service_errors, signed_in
from scheduling.core.quota import guarantee_by_tier
from scheduling.models import Allocation
from scheduling.selectors import borrowed_beyond
from scheduling.whatif.selectors import drafts_visible
from tenants.models import AuditEntry, OrgUnit, Quota, UnitKind
from tenants.selectors import access_unit_admin, admin_roots, units_administered, units_visible
from tenants.services import guarantees_sum, quota_change_words, quota_set, unit_create, unit_delete, unit_move

HISTORY_LENGTH = 40


@dataclass
class Cell:
    unit: OrgUnit
    gpu_type: str
    quota: Quota | None
    editable: bool
    children_guaranteed: int = 0
    form: QuotaForm | None = None
    saved: bool = False
    in_use: int = 0  # GPUs of this type held now by the unit's teams (what a new limit is checked against)
    # A team's cell: how its guarantee is held now, claimed in tier order (Tier 1, 2, 3), and what it borrows.
    tiers: TierShare | None = None
    # A what-if draft's cell (portal/views/whatif.py): where its form posts, and its values in the draft.
    action: str = ""
    draft: bool = False
    values: tuple[int, int | None, float] | None = None

    @property
    def dom_id(self) -> str:
        return f"q-{self.unit.pk}-{self.gpu_type}"


@dataclass(frozen=True)
class TierShare:
    """A team's guarantee of one GPU type as the scheduler shares it between tiers (scheduling/core/quota.py),
    and what the team borrows: the GPUs it holds beyond the guarantee (``scheduling.selectors.borrowed_beyond``,
    the figure the API and ``yard quota`` show), not the GPUs of its jobs flagged borrowed."""

    tier_1: int
    tier_2: int
    tier_3: int
    borrowed: int

    @property
    def shown(self) -> bool:
        return bool(self.tier_1 or self.tier_2 or self.tier_3 or self.borrowed)


@dataclass
class Row:
    unit: OrgUnit
    depth: int
    editable: bool
    cells: list[Cell] = field(default_factory=list)


def _subtree(user: Any) -> QuerySet[OrgUnit]:
    """The units shown: the subtrees the user administers, else the units they can see (read-only)."""
    roots = admin_roots(user=user)
    if not roots:
        return units_visible(user=user)
    return OrgUnit.objects.filter(reduce(or_, [Q(path__startswith=r.path) for r in roots]))


def _quota_form(quota: Quota | None, data: Any = None) -> QuotaForm:
    initial = {"guaranteed": 0, "limit": None, "weight": 1.0}
    if quota is not None:
        initial = {"guaranteed": quota.guaranteed, "limit": quota.limit, "weight": quota.weight}
    return QuotaForm(data, initial=initial)


def _tree(user: Any, *, failed: Cell | None = None) -> tuple[list[Row], list[str]]:
    """Rows of the tree in path order; three queries (units, quotas, administered ids)."""
    units = list(_subtree(user).order_by("path"))
    ids = [u.pk for u in units]
    quotas = {(q.unit_id, q.gpu_type): q for q in Quota.objects.filter(unit_id__in=ids)}
    gpu_types = sorted({t for _, t in quotas} or {"H100"})
    editable_ids = set(units_administered(user=user).filter(pk__in=ids).values_list("pk", flat=True))
    in_use = _in_use(units)
    tiers = _tier_shares(units, quotas)
    children_sum: dict[tuple[int | None, str], int] = {}
    for unit in units:
        for t in gpu_types:
            q = quotas.get((unit.pk, t))
            children_sum[(unit.parent_id, t)] = children_sum.get((unit.parent_id, t), 0) + (q.guaranteed if q else 0)
    base_depth = min((u.depth for u in units), default=0)
    rows = []
    for unit in units:
        row = Row(unit, min(unit.depth - base_depth, 3), unit.pk in editable_ids)
        for t in gpu_types:
            if failed is not None and (failed.unit.pk, failed.gpu_type) == (unit.pk, t):
                row.cells.append(failed)
                continue
            q = quotas.get((unit.pk, t))
            cell = Cell(
                unit,
                t,
                q,
                row.editable,
                children_sum.get((unit.pk, t), 0),
                in_use=in_use.get((unit.pk, t), 0),
                tiers=tiers.get((unit.pk, t)),
            )
            cell.form = _quota_form(q) if row.editable else None
            row.cells.append(cell)
        rows.append(row)
    return rows, gpu_types


def _in_use(units: list[OrgUnit]) -> dict[tuple[int, str], int]:
    """(unit, GPU type) -> GPUs held now by the unit's subtree; one query over the live allocations."""
    ids = {u.pk for u in units}
    held: dict[tuple[int, str], int] = defaultdict(int)
    live = (
        Allocation.objects.filter(released_at__isnull=True)
        .values_list("job__team__path", "job__gpu_type")
        .annotate(n=Count("id"))
    )
    for path, gpu_type, n in live:
        for part in path.strip("/").split("/"):
            if part and int(part) in ids:
                held[(int(part), gpu_type)] += n
    return dict(held)


def _tier_shares(units: list[OrgUnit], quotas: dict[tuple[int, str], Quota]) -> dict[tuple[int, str], TierShare]:
    """(team, GPU type) -> how its guarantee is held by tier now; one query over the live allocations.

    The guarantee is claimed in tier order (Tier 1 first), so a team's own spot work inside its
    guarantee is what its Tier 1 and Tier 2 jobs take back when they need it."""
    teams = {u.pk for u in units if u.kind == UnitKind.TEAM}
    held: dict[tuple[int, str], dict[int, int]] = defaultdict(dict)
    live = (
        Allocation.objects.filter(released_at__isnull=True, job__team_id__in=teams)
        .values_list("job__team_id", "job__gpu_type", "job__tier")
        .annotate(n=Count("id"))
    )
    for team_id, gpu_type, tier, n in live:
        held[(team_id, gpu_type)][tier] = n
    shares = {}
    for key in {*held, *(k for k in quotas if k[0] in teams)}:
        q = quotas.get(key)
        guaranteed, by_tier = (q.guaranteed if q else 0), held.get(key, {})
        (t1, t2, t3), _ = guarantee_by_tier(guaranteed, by_tier)
        shares[key] = TierShare(t1, t2, t3, borrowed_beyond(used=sum(by_tier.values()), guaranteed=guaranteed))
    return shares


@dataclass(frozen=True)
class HistoryLine:
    time: datetime
    actor_label: str
    text: str


def history_text(entry: AuditEntry) -> str:
    """A quota change as people say it ("limit no limit → 32", not "limit None → 32"), from the audit
    row's before and after; other entries as their message says."""
    data = entry.data if isinstance(entry.data, dict) else {}
    before, after = data.get("before"), data.get("after")
    if entry.action.startswith("quota.") and isinstance(before, dict) and isinstance(after, dict) and entry.unit is not None:
        words = quota_change_words(before, after, created=entry.action == "quota.create")
        return f"{entry.unit.name} {data.get('gpu_type', '')}: {words}"
    return entry.message or entry.action


def _history(user: Any) -> list[HistoryLine]:
    entries = (
        AuditEntry.objects.filter(unit__in=_subtree(user), action__regex=r"^(quota\.|unit\.|draft\.apply$)")
        .select_related("unit")
        .order_by("-time", "-id")[:HISTORY_LENGTH]
    )
    return [HistoryLine(e.time, e.actor_label, history_text(e)) for e in entries]


def _page(request: HttpRequest, *, status: int = 200, **extra: Any) -> HttpResponse:
    user = request.user
    rows, gpu_types = _tree(user, failed=extra.pop("failed", None))
    administered = units_administered(user=user)
    subtree = _subtree(user)
    context = {
        "rows": rows,
        "gpu_types": gpu_types,
        "can_edit": bool(admin_roots(user=user)),
        "history": _history(user),
        "drafts": drafts_visible(user=user)[:10],
        "draft_roots": admin_roots(user=user),
        "create_form": extra.pop("create_form", None) or UnitCreateForm(parents=subtree.exclude(kind=UnitKind.TEAM)),
        "move_form": extra.pop("move_form", None)
        or UnitMoveForm(movable=administered.exclude(kind=UnitKind.ROOT), parents=subtree.exclude(kind=UnitKind.TEAM)),
        **extra,
    }
    return render(request, "portal/quotas.html", context, status=status)


@login_required
def quotas(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def quota_edit(request: HttpRequest, unit_id: int, gpu_type: str) -> HttpResponse:
    unit = access_unit_admin(user=request.user, pk=unit_id)
    quota = Quota.objects.filter(unit=unit, gpu_type=gpu_type).first()
    form = _quota_form(quota, request.POST)
    cell = Cell(
        unit,
        gpu_type,
        quota,
        editable=True,
        children_guaranteed=guarantees_sum(parent=unit, gpu_type=gpu_type),
        form=form,
        in_use=_in_use([unit]).get((unit.pk, gpu_type), 0),
    )
    quotas = {(unit.pk, gpu_type): quota} if quota is not None else {}
    if form.is_valid():
        try:
            cell.quota = quota_set(
                actor=signed_in(request),
                unit=unit,
                gpu_type=gpu_type,
                guaranteed=form.cleaned_data["guaranteed"],
                limit=form.cleaned_data["limit"],
                weight=form.cleaned_data["weight"],
            )
            cell.saved = True
            quotas = {(unit.pk, gpu_type): cell.quota}
        except ValidationError as error:
            add_service_errors(form, error)
    cell.tiers = _tier_shares([unit], quotas).get((unit.pk, gpu_type))
    if request.htmx:  # type: ignore[attr-defined]
        if cell.saved:
            cell.form = _quota_form(cell.quota)
        # A refused edit still answers 200 so htmx swaps the message in next to the field.
        response = render(request, "portal/quotas.html#quota-cell", {"cell": cell})
        if cell.saved:  # a refused edit writes no history
            response["HX-Trigger"] = "quota-history"
        return response
    if cell.saved:
        messages.success(request, f"{unit.name} {gpu_type} quota saved")
        return HttpResponseRedirect(reverse("quotas"))
    return _page(request, status=400, failed=cell)


@login_required
def quota_history(request: HttpRequest) -> HttpResponse:
    return render(request, "portal/quotas.html#history", {"history": _history(request.user)})


@login_required
@require_POST
def unit_add(request: HttpRequest) -> HttpResponse:
    subtree = _subtree(request.user)
    # Org admins may add units inside their subtree, their own unit included.
    form = UnitCreateForm(
        request.POST, parents=subtree.exclude(kind=UnitKind.TEAM) if admin_roots(user=request.user) else subtree.none()
    )
    if form.is_valid():
        try:
            unit = unit_create(
                actor=signed_in(request),
                name=form.cleaned_data["name"],
                kind=form.cleaned_data["kind"],
                parent=form.cleaned_data["parent"],
            )
            messages.success(request, f"Added {unit.get_kind_display().lower()} {unit.name}")
            return HttpResponseRedirect(reverse("quotas"))
        except ValidationError as error:
            add_service_errors(form, error)
    return _page(request, status=400, create_form=form)


@login_required
@require_POST
def unit_relocate(request: HttpRequest) -> HttpResponse:
    subtree = _subtree(request.user) if admin_roots(user=request.user) else OrgUnit.objects.none()
    form = UnitMoveForm(
        request.POST,
        movable=units_administered(user=request.user).exclude(kind=UnitKind.ROOT),
        parents=subtree.exclude(kind=UnitKind.TEAM),
    )
    if form.is_valid():
        try:
            unit = unit_move(actor=signed_in(request), unit=form.cleaned_data["unit"], new_parent=form.cleaned_data["parent"])
            messages.success(request, f"Moved {unit.name} under {form.cleaned_data['parent'].name}")
            return HttpResponseRedirect(reverse("quotas"))
        except ValidationError as error:
            add_service_errors(form, error)
    return _page(request, status=400, move_form=form)


@login_required
@require_POST
def unit_remove(request: HttpRequest, unit_id: int) -> HttpResponse:
    unit = access_unit_admin(user=request.user, pk=unit_id)
    try:
        unit_delete(actor=signed_in(request), unit=unit)
        messages.success(request, f"Removed {unit.name}")
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    return HttpResponseRedirect(reverse("quotas"))
