"""What-if drafts of the quota tree and their replays: copy the live tree, edit the copy in the quota
editor, replay last month under both trees (a Celery task, its progress polled by htmx), read the answer
side by side, download it as CSV, apply the draft in one audited step.

Org admins see the drafts of their subtrees, cluster admins all; anyone else gets a 404, as for any
object they may not see. Every write goes through scheduling.whatif.services.
"""

from __future__ import annotations

import csv
from datetime import datetime, time, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.forms import QuotaForm
from portal.views.common import add_service_errors, signed_in
from portal.views.quotas import Cell, Row
from portal.views.whatif_plot import wait_plot
from scheduling.whatif.models import QuotaDraft, WhatIfRun
from scheduling.whatif.selectors import access_draft, access_run, draft_cells, runs_of, subtree_units
from scheduling.whatif.services import (
    default_window,
    draft_apply,
    draft_changes,
    draft_conflicts,
    draft_create,
    draft_quota_set,
    whatif_cancel,
    whatif_start,
)
from tenants.models import OrgUnit
from tenants.selectors import admin_roots, units_administered


class WindowForm(forms.Form):
    start = forms.DateField(label="From", help_text="First day replayed")
    end = forms.DateField(label="To", help_text="Last day replayed (included)")

    def window(self) -> tuple[datetime, datetime]:
        tz = timezone.get_current_timezone()
        start = datetime.combine(self.cleaned_data["start"], time.min, tzinfo=tz)
        end = datetime.combine(self.cleaned_data["end"] + timedelta(days=1), time.min, tzinfo=tz)
        return start, end


class NewTypeForm(forms.Form):
    gpu_type = forms.CharField(max_length=32, label="GPU type")
    guaranteed = forms.IntegerField(min_value=0, label="Guaranteed")


def _window_form(data: Any = None) -> WindowForm:
    start, end = default_window(now=timezone.now())
    return WindowForm(data, initial={"start": start.date(), "end": (end - timedelta(days=1)).date()})


def _cell_form(values: tuple[int, int | None, float] | None, data: Any = None) -> QuotaForm:
    g, lim, w = values or (0, None, 1.0)
    return QuotaForm(data, initial={"guaranteed": g, "limit": lim, "weight": w})


def _draft_cell(draft: QuotaDraft, unit: OrgUnit, gpu_type: str, values: Any, *, data: Any = None) -> Cell:
    cell = Cell(unit, gpu_type, None, editable=draft.applied_at is None, form=_cell_form(values, data))
    cell.action = reverse("draft-cell", args=[draft.pk, unit.pk, gpu_type])
    cell.draft = True
    cell.values = values
    return cell


def _draft_rows(draft: QuotaDraft, user: Any) -> tuple[list[Row], list[str]]:
    """The draft's subtree in the quota editor's rows; a unit is editable where its live quotas are
    (an org admin's own unit is their parent's admins' call, in a draft as in the live tree)."""
    units = subtree_units(root=draft.root)
    editable = set(units_administered(user=user).filter(pk__in=[u.pk for u in units]).values_list("pk", flat=True))
    cells = draft_cells(draft=draft)
    gpu_types = sorted({t for _, t in cells} or {"H100"})
    parent_of = {u.pk: u.parent_id for u in units}
    children: dict[tuple[int | None, str], int] = {}
    for (unit_id, t), (g, _, _) in cells.items():
        key = (parent_of.get(unit_id), t)
        children[key] = children.get(key, 0) + g
    base = min((u.depth for u in units), default=0)
    rows = []
    for unit in units:
        row = Row(unit, min(unit.depth - base, 3), draft.applied_at is None and unit.pk in editable)
        for t in gpu_types:
            cell = _draft_cell(draft, unit, t, cells.get((unit.pk, t)))
            cell.children_guaranteed = children.get((unit.pk, t), 0)
            cell.editable = row.editable
            if not cell.editable:
                cell.form = None
            row.cells.append(cell)
        rows.append(row)
    return rows, gpu_types


def _draft_page(request: HttpRequest, draft: QuotaDraft, *, status: int = 200, **extra: Any) -> HttpResponse:
    rows, gpu_types = _draft_rows(draft, request.user)
    changes = draft_changes(draft=draft)
    names = {u.pk: u.name for u in subtree_units(root=draft.root)}
    context = {
        "draft": draft,
        "rows": rows,
        "gpu_types": gpu_types,
        "changes": [(names.get(u, u), t, was, now) for (u, t), (was, now) in sorted(changes.items())],
        "conflicts": draft_conflicts(draft=draft) if draft.applied_at is None else [],
        "runs": runs_of(draft=draft)[:10],
        "window_form": extra.pop("window_form", None) or _window_form(),
        "type_form": extra.pop("type_form", None) or NewTypeForm(),
        "root_editable": units_administered(user=request.user).filter(pk=draft.root_id).exists(),
        **extra,
    }
    return render(request, "portal/whatif_draft.html", context, status=status)


@login_required
@require_POST
def draft_new(request: HttpRequest) -> HttpResponse:
    roots = {str(r.pk): r for r in admin_roots(user=request.user)}
    if not roots:
        raise Http404("No units to draft")
    asked = request.POST.get("root", "")
    if asked and asked not in roots:
        names = ", ".join(f"{r.name} ({pk})" for pk, r in roots.items())
        return HttpResponse(f"Pick one of the subtrees you administer: {names}", status=400, content_type="text/plain")
    root = roots[asked] if asked else next(iter(roots.values()))
    draft = draft_create(actor=signed_in(request), root=root, name=request.POST.get("name", ""))
    messages.success(request, f"Copied the live tree of {root.name} into {draft.name}")
    return HttpResponseRedirect(reverse("draft", args=[draft.pk]))


@login_required
def draft_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _draft_page(request, access_draft(user=request.user, pk=pk))


@login_required
@require_POST
def draft_cell(request: HttpRequest, pk: int, unit_id: int, gpu_type: str) -> HttpResponse:
    draft = access_draft(user=request.user, pk=pk)
    unit = units_administered(user=request.user).filter(pk=unit_id, path__startswith=draft.root.path).first()
    if unit is None:
        raise Http404("No such unit in this draft")
    cells = draft_cells(draft=draft)
    cell = _draft_cell(draft, unit, gpu_type, cells.get((unit.pk, gpu_type)), data=request.POST)
    form = cell.form
    assert form is not None
    if form.is_valid():
        try:
            saved = draft_quota_set(
                actor=signed_in(request),
                draft=draft,
                unit=unit,
                gpu_type=gpu_type,
                guaranteed=form.cleaned_data["guaranteed"],
                limit=form.cleaned_data["limit"],
                weight=form.cleaned_data["weight"],
            )
            cell = _draft_cell(draft, unit, gpu_type, (saved.guaranteed, saved.limit, saved.weight))
            cell.saved = True
        except ValidationError as error:
            add_service_errors(form, error)
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "portal/quotas.html#quota-cell", {"cell": cell})
    if cell.saved:
        messages.success(request, f"{unit.name} {gpu_type} saved in the draft")
        return HttpResponseRedirect(reverse("draft", args=[draft.pk]))
    return _draft_page(request, draft, status=400, failed=cell)


@login_required
@require_POST
def draft_add_type(request: HttpRequest, pk: int) -> HttpResponse:
    draft = access_draft(user=request.user, pk=pk)
    if not units_administered(user=request.user).filter(pk=draft.root_id).exists():
        raise Http404("Only the admins above this subtree may add a GPU type to it")
    form = NewTypeForm(request.POST)
    if form.is_valid():
        try:
            draft_quota_set(
                actor=signed_in(request),
                draft=draft,
                unit=draft.root,
                gpu_type=form.cleaned_data["gpu_type"],
                guaranteed=form.cleaned_data["guaranteed"],
            )
            return HttpResponseRedirect(reverse("draft", args=[draft.pk]))
        except ValidationError as error:
            add_service_errors(form, error)
    return _draft_page(request, draft, status=400, type_form=form)


@login_required
@require_POST
def draft_apply_view(request: HttpRequest, pk: int) -> HttpResponse:
    draft = access_draft(user=request.user, pk=pk)
    try:
        changed = draft_apply(actor=signed_in(request), draft=draft)
    except ValidationError as error:
        return _draft_page(request, draft, status=400, apply_error=" ".join(error.messages))
    messages.success(request, f"Applied {draft.name}: {changed} quota(s) changed in the live tree")
    return HttpResponseRedirect(reverse("quotas"))


@login_required
@require_POST
def run_new(request: HttpRequest, pk: int) -> HttpResponse:
    draft = access_draft(user=request.user, pk=pk)
    form = _window_form(request.POST)
    if form.is_valid():
        start, end = form.window()
        try:
            run = whatif_start(actor=signed_in(request), draft=draft, start=start, end=end)
            return HttpResponseRedirect(reverse("whatif-run", args=[run.pk]))
        except ValidationError as error:
            add_service_errors(form, error)
    return _draft_page(request, draft, status=400, window_form=form)


def _run_context(run: WhatIfRun) -> dict[str, Any]:
    result = run.result or {}
    return {"run": run, "result": result, "plot": wait_plot(result.get("series")) if result else None}


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = access_run(user=request.user, pk=pk)
    if request.htmx:  # type: ignore[attr-defined]
        response = render(request, "portal/whatif_run.html#progress", _run_context(run))
        if run.finished:
            # The whole page once it is done: the table, the plot and the caveats replace the bar.
            response["HX-Refresh"] = "true"
        return response
    return render(request, "portal/whatif_run.html", _run_context(run))


@login_required
@require_POST
def run_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    run = access_run(user=request.user, pk=pk)
    if whatif_cancel(run=run):
        messages.success(request, "Cancelling the what-if run")
    else:
        messages.error(request, "This run has already finished")
    return HttpResponseRedirect(reverse("whatif-run", args=[run.pk]))


CSV_FIELDS = ("p50_wait_h", "p95_wait_h", "avg_jct_h", "gpu_hours", "guaranteed_gpu_hours", "preemptions")


@login_required
def run_csv(request: HttpRequest, pk: int) -> HttpResponse:
    run = access_run(user=request.user, pk=pk)
    if not run.result:
        raise Http404("This run has no result yet")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="whatif-{run.pk}.csv"'
    writer = csv.writer(response)
    writer.writerow(["unit", "kind", "jobs", *(f"{side}_{f}" for f in CSV_FIELDS for side in ("live", "draft", "change"))])
    for row in run.result["units"]:
        values = []
        for f in CSV_FIELDS:
            values += [row["live"][f], row["draft"][f], row["delta"][f]]
        writer.writerow([row["name"], row["kind"], row["jobs"], *("" if v is None else v for v in values)])
    cluster = run.result["cluster"]
    writer.writerow([])
    writer.writerow(["cluster utilisation", "", "", cluster["live"]["utilisation"], cluster["draft"]["utilisation"]])
    return response
