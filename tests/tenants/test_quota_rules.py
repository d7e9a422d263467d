"""Each quota rule rejects a bad tree with a message that names the unit and the GPU type."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from tenants.models import Quota, UnitKind
from tenants.services import quota_set, unit_create, unit_move
from tests.factories import make_org

pytestmark = pytest.mark.django_db


def _message(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return " ".join(m for msgs in exc.value.message_dict.values() for m in msgs)


def test_negative_guarantee_is_rejected_naming_unit_and_type():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=None, unit=org.team_a, gpu_type="H100", guaranteed=-1)
    assert "team-a" in _message(exc) and "H100" in _message(exc) and "negative" in _message(exc)


def test_limit_below_guarantee_is_rejected():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=None, unit=org.team_a, gpu_type="H100", guaranteed=16, limit=8)
    assert "team-a H100" in _message(exc) and "at least the guarantee" in _message(exc)


def test_children_guarantees_cannot_exceed_parent():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=None, unit=org.team_a, gpu_type="H100", guaranteed=30)
    message = _message(exc)
    assert "Vision's children would hold 38 H100 of its 32" in message
    assert Quota.objects.get(unit=org.team_a, gpu_type="H100").guaranteed == 16  # nothing changed


def test_parent_cannot_drop_below_its_childrens_guarantees():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=None, unit=org.dept, gpu_type="H100", guaranteed=20)
    assert "Vision's children already hold 24 H100" in _message(exc)


def test_guarantee_for_a_type_the_parent_lacks_is_rejected():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        quota_set(actor=None, unit=org.team_a, gpu_type="A100", guaranteed=4)
    assert "A100" in _message(exc) and "Vision" in _message(exc)


def test_valid_change_is_saved_and_audited():
    org = make_org()
    quota_set(actor=None, unit=org.team_a, gpu_type="H100", guaranteed=20, limit=40, weight=2)
    quota = Quota.objects.get(unit=org.team_a, gpu_type="H100")
    assert (quota.guaranteed, quota.limit, quota.weight) == (20, 40, 2)
    from tenants.models import AuditEntry

    entry = AuditEntry.objects.filter(action="quota.update", unit=org.team_a).first()
    assert entry is not None and "16 → 20" in entry.message


def test_database_rejects_limit_below_guarantee_even_without_the_service():
    org = make_org()
    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.filter(unit=org.team_a, gpu_type="H100").update(limit=1)


def test_move_into_own_subtree_is_a_cycle_and_rejected():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        unit_move(actor=None, unit=org.bu, new_parent=org.dept)
    assert "inside its own subtree" in _message(exc)


def test_move_that_overfills_new_parent_is_rejected_naming_type():
    org = make_org()
    # other_dept holds 16 of 16 for team_c already? team_c holds 8; team_a brings 16 -> 24 > 16
    with pytest.raises(ValidationError) as exc:
        unit_move(actor=None, unit=org.team_a, new_parent=org.other_dept)
    assert "Search's children would hold 24 H100 of its 16" in _message(exc)


def test_valid_move_updates_paths_of_the_subtree():
    org = make_org()
    team = unit_create(actor=None, name="team-d", kind=UnitKind.TEAM, parent=org.dept)
    quota_set(actor=None, unit=team, gpu_type="H100", guaranteed=4)
    unit_move(actor=None, unit=team, new_parent=org.other_dept)
    team.refresh_from_db()
    assert team.parent == org.other_dept
    assert team.path == f"{org.other_dept.path}{team.pk}/"


def test_department_cannot_sit_under_a_team():
    org = make_org()
    with pytest.raises(ValidationError) as exc:
        unit_create(actor=None, name="odd", kind=UnitKind.DEPARTMENT, parent=org.team_a)
    assert "cannot sit under team-a" in _message(exc)
