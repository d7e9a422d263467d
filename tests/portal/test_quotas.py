"""The quota tree editor: who may edit what, messages next to the field, history, moves and units."""

from __future__ import annotations

from html import unescape

from django.test import Client
from django.urls import reverse

from tenants.models import AuditEntry, OrgUnit, Quota, UnitKind
from tests.factories import make_job

HTMX = {"HTTP_HX_REQUEST": "true"}


def _edit(client, unit, guaranteed, limit="", weight="1", **extra):
    url = reverse("quota-edit", args=[unit.pk, "H100"])
    return client.post(url, {"guaranteed": guaranteed, "limit": limit, "weight": weight}, **extra)


def test_org_admin_sees_an_edit_form_for_units_below_theirs(client, cast):
    client.force_login(cast.oli)
    body = client.get(reverse("quotas")).content.decode()
    assert reverse("quota-edit", args=[cast.org.team_a.pk, "H100"]) in body
    assert reverse("quota-edit", args=[cast.org.bu.pk, "H100"]) not in body  # their own unit: the parent's call
    assert "team-c" not in body  # another business unit


def test_invalid_edit_answers_htmx_with_the_message_next_to_the_field(client, cast):
    client.force_login(cast.oli)
    response = _edit(client, cast.org.team_a, 30, **HTMX)
    body = unescape(response.content.decode())
    assert response.status_code == 200 and "<html" not in body
    assert "Vision's children would hold 38 H100 of its 32" in body and 'data-field="guaranteed"' in body
    assert Quota.objects.get(unit=cast.org.team_a, gpu_type="H100").guaranteed == 16


def test_invalid_edit_without_javascript_re_renders_the_page_with_the_message(client, cast):
    client.force_login(cast.oli)
    response = _edit(client, cast.org.team_a, 30)
    assert response.status_code == 400 and "Vision's children would hold 38 H100" in unescape(response.content.decode())


def test_limit_below_guarantee_is_shown_on_the_limit_field(client, cast):
    client.force_login(cast.oli)
    response = _edit(client, cast.org.team_a, 16, limit=4, **HTMX)
    body = response.content.decode()
    assert 'data-field="limit"' in body and "must be at least the guarantee" in body
    # A refused edit writes no history, so it asks for no refresh: a refresh still in flight would make
    # htmx drop the one the next, valid, save asks for.
    assert "HX-Trigger" not in response


def test_valid_edit_is_saved_and_audited_in_the_history(client, cast):
    client.force_login(cast.oli)
    response = _edit(client, cast.org.team_a, 20, limit=40, **HTMX)
    assert "Saved" in response.content.decode() and response["HX-Trigger"] == "quota-history"
    assert Quota.objects.get(unit=cast.org.team_a, gpu_type="H100").guaranteed == 20
    history = client.get(reverse("quota-history")).content.decode()
    assert "team-a H100: guaranteed 16 → 20, limit 32 → 40" in history and "oli" in history


def test_history_leaves_out_other_subtrees(client, cast):
    client.force_login(cast.cat)
    _edit(client, cast.org.team_c, 4)
    client.force_login(cast.oli)
    assert "team-c" not in client.get(reverse("quota-history")).content.decode()


def test_member_cannot_edit_quotas(client, cast):
    client.force_login(cast.ann)
    assert _edit(client, cast.org.team_a, 10).status_code == 404


def test_org_admin_cannot_edit_another_business_unit(client, cast):
    client.force_login(cast.oli)
    assert _edit(client, cast.org.team_c, 4).status_code == 404


def test_org_admin_cannot_raise_their_own_units_guarantee(client, cast):
    client.force_login(cast.oli)
    assert _edit(client, cast.org.bu, 60).status_code == 404


def test_quota_edit_without_csrf_token_is_refused(cast):
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.oli)
    assert _edit(client, cast.org.team_a, 20, **HTMX).status_code == 403


def test_cluster_admin_moves_a_team_to_another_department(client, cast):
    client.force_login(cast.cat)
    quota = Quota.objects.get(unit=cast.org.team_b)
    quota.guaranteed = 0
    quota.save()
    response = client.post(reverse("unit-move"), {"unit": cast.org.team_b.pk, "parent": cast.org.other_dept.pk})
    assert response.status_code == 302
    assert OrgUnit.objects.get(pk=cast.org.team_b.pk).parent_id == cast.org.other_dept.pk
    assert AuditEntry.objects.filter(action="unit.move").exists()


def test_move_that_breaks_the_parents_guarantee_shows_why(client, cast):
    client.force_login(cast.cat)
    response = client.post(reverse("unit-move"), {"unit": cast.org.team_a.pk, "parent": cast.org.other_dept.pk})
    assert response.status_code == 400 and "Search's children would hold 24 H100 of its 16" in unescape(response.content.decode())


def test_org_admin_cannot_move_a_team_out_of_their_subtree(client, cast):
    client.force_login(cast.oli)
    response = client.post(reverse("unit-move"), {"unit": cast.org.team_b.pk, "parent": cast.org.other_dept.pk})
    assert response.status_code == 400
    assert OrgUnit.objects.get(pk=cast.org.team_b.pk).parent_id == cast.org.dept.pk


def test_org_admin_adds_and_removes_a_team(client, cast):
    client.force_login(cast.oli)
    client.post(reverse("unit-add"), {"name": "team-new", "kind": UnitKind.TEAM, "parent": cast.org.dept.pk})
    unit = OrgUnit.objects.get(name="team-new")
    client.post(reverse("unit-remove", args=[unit.pk]))
    assert not OrgUnit.objects.filter(name="team-new").exists()
    actions = AuditEntry.objects.filter(object_id=str(unit.pk), action__startswith="unit.").values_list("action", flat=True)
    assert list(actions) == ["unit.delete", "unit.create"]


def test_member_cannot_add_a_unit(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("unit-add"), {"name": "sneaky", "kind": UnitKind.TEAM, "parent": cast.org.dept.pk})
    assert response.status_code == 400 and not OrgUnit.objects.filter(name="sneaky").exists()


def test_removing_a_unit_with_children_says_why(client, cast):
    client.force_login(cast.cat)
    response = client.post(reverse("unit-remove", args=[cast.org.dept.pk]), follow=True)
    assert "still has units under it" in response.content.decode()


def test_saved_cell_still_says_what_the_children_hold(client, cast):
    client.force_login(cast.oli)
    body = _edit(client, cast.org.dept, 30, **HTMX).content.decode()
    assert "Saved" in body and "children hold 24" in body


def test_history_says_no_limit_rather_than_none(client, cast):
    client.force_login(cast.cat)
    _edit(client, cast.org.team_c, 4, limit="")  # limit 16 -> no limit
    _edit(client, cast.org.team_c, 4, limit=12)  # no limit -> 12
    history = client.get(reverse("quota-history")).content.decode()
    assert "limit 16 → no limit" in history and "limit no limit → 12" in history
    assert "None" not in history


def test_quota_editor_shows_what_each_unit_uses_now(client, cast):
    from scheduling.models import Allocation, Gpu, Task

    job = make_job(team=cast.org.team_a, user=cast.ann, state="RUNNING", replicas=1, gpus_per_replica=3)
    gpus = list(Gpu.objects.order_by("node__name", "index")[:3])
    task = Task.objects.create(job=job, attempt=1, rank=0, node=gpus[0].node, state="RUNNING")
    for gpu in gpus:
        Allocation.objects.create(gpu=gpu, task=task, job=job, attempt=1)
    client.force_login(cast.oli)
    body = client.get(reverse("quotas")).content.decode()
    cell = body[body.index(f'id="q-{cast.org.team_a.pk}-H100"') :]
    assert 'data-in-use="3"' in cell[: cell.index("</td>")]
    dept = body[body.index(f'id="q-{cast.org.dept.pk}-H100"') :]
    assert 'data-in-use="3"' in dept[: dept.index("</td>")]  # a department holds what its teams hold
    team_b = body[body.index(f'id="q-{cast.org.team_b.pk}-H100"') :]
    assert 'data-in-use="0"' in team_b[: team_b.index("</td>")]
