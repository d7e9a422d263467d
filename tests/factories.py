"""Small builders shared by the Django tests: an org, users with roles, a cluster, jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model

from scheduling.management.commands.seed_demo import build_cluster
from scheduling.models import Job, Node, NodeState
from tenants.models import OrgUnit, Role, UnitKind
from tenants.services import membership_set, quota_set, unit_create


@dataclass
class Org:
    root: OrgUnit
    bu: OrgUnit
    dept: OrgUnit
    team_a: OrgUnit
    team_b: OrgUnit
    other_bu: OrgUnit
    other_dept: OrgUnit
    team_c: OrgUnit


def make_org(*, gpu_type: str = "H100", total: int = 64) -> Org:
    """root(total) -> bu(48) -> dept(32) -> team_a(16), team_b(8); other_bu(16) -> other_dept(16) -> team_c(8)."""
    root = unit_create(actor=None, name="Cluster", kind=UnitKind.ROOT, parent=None)
    quota_set(actor=None, unit=root, gpu_type=gpu_type, guaranteed=total)
    bu = unit_create(actor=None, name="Research", kind=UnitKind.BUSINESS_UNIT, parent=root)
    quota_set(actor=None, unit=bu, gpu_type=gpu_type, guaranteed=48)
    dept = unit_create(actor=None, name="Vision", kind=UnitKind.DEPARTMENT, parent=bu)
    quota_set(actor=None, unit=dept, gpu_type=gpu_type, guaranteed=32)
    team_a = unit_create(actor=None, name="team-a", kind=UnitKind.TEAM, parent=dept)
    quota_set(actor=None, unit=team_a, gpu_type=gpu_type, guaranteed=16, limit=32)
    team_b = unit_create(actor=None, name="team-b", kind=UnitKind.TEAM, parent=dept)
    quota_set(actor=None, unit=team_b, gpu_type=gpu_type, guaranteed=8, limit=16)
    other_bu = unit_create(actor=None, name="Products", kind=UnitKind.BUSINESS_UNIT, parent=root)
    quota_set(actor=None, unit=other_bu, gpu_type=gpu_type, guaranteed=16)
    other_dept = unit_create(actor=None, name="Search", kind=UnitKind.DEPARTMENT, parent=other_bu)
    quota_set(actor=None, unit=other_dept, gpu_type=gpu_type, guaranteed=16)
    team_c = unit_create(actor=None, name="team-c", kind=UnitKind.TEAM, parent=other_dept)
    quota_set(actor=None, unit=team_c, gpu_type=gpu_type, guaranteed=8, limit=16)
    return Org(root, bu, dept, team_a, team_b, other_bu, other_dept, team_c)


def make_user(username: str, *, unit: OrgUnit | None = None, role: str = Role.MEMBER, password: str = "pw-for-tests-1") -> Any:
    user = get_user_model().objects.create_user(username=username, password=password)
    if unit is not None:
        membership_set(actor=None, user=user, unit=unit, role=role)
    return user


def make_cluster(
    *, nodes: int = 8, gpu_type: str = "H100", spines: int = 1, leaves_per_spine: int = 2, ready: bool = True
) -> list[Node]:
    return build_cluster(
        spines=spines,
        leaves_per_spine=leaves_per_spine,
        layout=((gpu_type, nodes),),
        state=NodeState.READY if ready else NodeState.NOT_READY,
    )


def make_job(*, team: OrgUnit, user: Any, **fields: Any) -> Job:
    defaults: dict[str, Any] = {"name": "train", "gpu_type": "H100", "replicas": 1, "gpus_per_replica": 1, "command": "true"}
    defaults.update(fields)
    return Job.objects.create(team=team, user=user, **defaults)


def make_shared_cluster(nodes: int = 200, *, teams: int = 4) -> list[tuple[Any, OrgUnit]]:
    """``nodes`` READY H100 nodes of 8 GPUs over 2 spines x 5 leaves, and ``teams`` teams sharing them
    (each guaranteed an equal part, limited to the whole). Returns (user, team) per team."""
    build_cluster(spines=2, leaves_per_spine=5, layout=(("H100", nodes),), state=NodeState.READY)
    total = nodes * 8
    root = unit_create(actor=None, name="Cluster", kind=UnitKind.ROOT, parent=None)
    quota_set(actor=None, unit=root, gpu_type="H100", guaranteed=total)
    bu = unit_create(actor=None, name="Research", kind=UnitKind.BUSINESS_UNIT, parent=root)
    quota_set(actor=None, unit=bu, gpu_type="H100", guaranteed=total)
    users = []
    for i in range(teams):
        team = unit_create(actor=None, name=f"team-{i}", kind=UnitKind.TEAM, parent=bu)
        quota_set(actor=None, unit=team, gpu_type="H100", guaranteed=total // teams, limit=total)
        users.append((make_user(f"user{i}", unit=team), team))
    return users
