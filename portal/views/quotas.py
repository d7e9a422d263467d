"""The quota tree editor: org admins edit their subtree, cluster admins the whole tree.

Every write goes through tenants.services (which validates the tree and writes the audit row);
an htmx edit swaps one cell, a plain POST (no JavaScript) redirects or re-renders the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from operator import or_
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.forms import QuotaForm, UnitCreateForm, UnitMoveForm
from portal.views.common import add_service_errors, signed_in
from tenants.models import AuditEntry, OrgUnit, Quota, UnitKind
from tenants.selectors import access_unit_admin, admin_roots, units_administered, units_visible
from tenants.services import guarantees_sum, quota_set, unit_create, unit_delete, unit_move

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

    @property
    def dom_id(self) -> str:
        return f"q-{self.unit.pk}-{self.gpu_type}"


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
            cell = Cell(unit, t, q, row.editable, children_sum.get((unit.pk, t), 0))
            cell.form = _quota_form(q) if row.editable else None
            row.cells.append(cell)
        rows.append(row)
    return rows, gpu_types


def _history(user: Any) -> QuerySet[AuditEntry]:
    return (
        AuditEntry.objects.filter(unit__in=_subtree(user), action__regex=r"^(quota|unit)\.")
        .select_related("unit")
        .order_by("-time", "-id")[:HISTORY_LENGTH]
    )


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
        unit, gpu_type, quota, editable=True, children_guaranteed=guarantees_sum(parent=unit, gpu_type=gpu_type), form=form
    )
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
        except ValidationError as error:
            add_service_errors(form, error)
    if request.htmx:  # type: ignore[attr-defined]
        if cell.saved:
            cell.form = _quota_form(cell.quota)
        # A refused edit still answers 200 so htmx swaps the message in next to the field.
        response = render(request, "portal/quotas.html#quota-cell", {"cell": cell})
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
