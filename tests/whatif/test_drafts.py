"""Drafts of the quota tree and what-if runs through the portal: who may see and run them, the live tree's
rules on a draft, applying in one audited step (refused on a conflicting live edit), a run's page, its
cancel and its CSV."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from scheduling.core.fairshare import accrue, decay
from scheduling.models import Allocation, Task
from scheduling.whatif.models import DraftQuota, QuotaDraft, RunState, WhatIfRun
from scheduling.whatif.selectors import quota_units, usage_before
from scheduling.whatif.services import draft_apply, draft_create, draft_quota_set, whatif_run
from tenants.models import AuditEntry, Quota, Role, UnitKind
from tenants.services import quota_set, unit_create
from tests.factories import Org, make_cluster, make_job, make_org, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def org() -> Org:
    return make_org()


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _cell(draft: QuotaDraft, unit: Any) -> tuple[int, int | None, float]:
    q = DraftQuota.objects.get(draft=draft, unit=unit, gpu_type="H100")
    return q.guaranteed, q.limit, q.weight


def test_a_member_can_neither_see_nor_make_nor_run_drafts(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.root)
    member = _client(make_user("ann", unit=org.team_a))
    assert "What-if drafts" not in member.get(reverse("quotas")).content.decode()
    assert member.post(reverse("draft-new")).status_code == 404
    assert member.get(reverse("draft", args=[draft.pk])).status_code == 404
    assert member.post(reverse("whatif-new", args=[draft.pk]), {"start": "2026-10-01", "end": "2026-10-31"}).status_code == 404
    assert not WhatIfRun.objects.exists() and QuotaDraft.objects.count() == 1


def test_an_org_admin_drafts_their_subtree_only(org: Org) -> None:
    oli = _client(make_user("oli", unit=org.bu, role=Role.ORG_ADMIN))
    refused = oli.post(reverse("draft-new"), {"root": org.other_bu.pk})
    assert refused.status_code == 400 and "Pick one of the subtrees you administer: Research" in refused.content.decode()
    response = oli.post(reverse("draft-new"))
    draft = QuotaDraft.objects.get()
    assert response.status_code == 302 and draft.root == org.bu
    page = oli.get(reverse("draft", args=[draft.pk])).content.decode()
    assert "team-a" in page and "team-c" not in page
    # A unit outside the subtree is not in the draft: 404, and nothing is written.
    url = reverse("draft-cell", args=[draft.pk, org.team_c.pk, "H100"])
    assert oli.post(url, {"guaranteed": 1, "limit": "", "weight": 1}).status_code == 404
    # Another subtree's admin cannot see this draft or its runs.
    other = _client(make_user("pia", unit=org.other_bu, role=Role.ORG_ADMIN))
    assert other.get(reverse("draft", args=[draft.pk])).status_code == 404
    run = WhatIfRun.objects.create(draft=draft, window_start=timezone.now() - timedelta(days=1), window_end=timezone.now())
    assert other.get(reverse("whatif-run", args=[run.pk])).status_code == 404
    assert other.post(reverse("whatif-cancel", args=[run.pk])).status_code == 404


def test_a_draft_edit_is_checked_by_the_live_trees_rules_and_leaves_the_live_tree_alone(org: Org) -> None:
    oli_user = make_user("oli", unit=org.bu, role=Role.ORG_ADMIN)
    oli = _client(oli_user)
    draft = draft_create(actor=oli_user, root=org.bu)
    url = reverse("draft-cell", args=[draft.pk, org.team_a.pk, "H100"])
    # Vision has 32 guaranteed and team-b holds 8: team-a may hold at most 24.
    refused = oli.post(url, {"guaranteed": 30, "limit": "", "weight": 1}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 200 and "lower team-a&#x27;s guarantee to at most 24" in refused.content.decode()
    plain = oli.post(url, {"guaranteed": 30, "limit": "", "weight": 1})
    assert plain.status_code == 400
    assert _cell(draft, org.team_a) == (16, 32, 1.0)
    saved = oli.post(url, {"guaranteed": 24, "limit": "40", "weight": 2}, HTTP_HX_REQUEST="true")
    assert saved.status_code == 200 and "Saved" in saved.content.decode()
    assert _cell(draft, org.team_a) == (24, 40, 2.0)
    assert Quota.objects.get(unit=org.team_a, gpu_type="H100").guaranteed == 16
    # Their own unit's quota is their parent's admins' call, in a draft as in the live tree.
    assert oli.post(reverse("draft-cell", args=[draft.pk, org.bu.pk, "H100"]), {"guaranteed": 40, "weight": 1}).status_code == 404
    assert oli.post(reverse("draft-add-type", args=[draft.pk]), {"gpu_type": "A100", "guaranteed": 0}).status_code == 404


def test_a_cluster_admin_adds_a_gpu_type_to_a_draft(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.root)
    client = _client(admin)
    assert client.post(reverse("draft-add-type", args=[draft.pk]), {"gpu_type": "A100", "guaranteed": 16}).status_code == 302
    assert DraftQuota.objects.get(draft=draft, unit=org.root, gpu_type="A100").guaranteed == 16
    assert ">A100 <span" in client.get(reverse("draft", args=[draft.pk])).content.decode()
    url = reverse("draft-cell", args=[draft.pk, org.bu.pk, "A100"])
    assert client.post(url, {"guaranteed": 20, "limit": "", "weight": 1}).status_code == 400  # more than the root's 16
    assert client.post(url, {"guaranteed": 12, "limit": "", "weight": 1}).status_code == 302


def test_apply_writes_the_drafts_changes_in_one_audited_step(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.root)
    # Move 8 of Vision's guarantee from team-a to team-b: a lowering and a raising, applied in an order
    # the live tree's own checks accept.
    draft_quota_set(actor=admin, draft=draft, unit=org.team_a, gpu_type="H100", guaranteed=8, limit=32)
    draft_quota_set(actor=admin, draft=draft, unit=org.team_b, gpu_type="H100", guaranteed=16, limit=16)
    # A live edit since the copy in a cell the draft leaves alone is kept.
    quota_set(actor=admin, unit=org.team_c, gpu_type="H100", guaranteed=4, limit=16)
    response = _client(admin).post(reverse("draft-apply", args=[draft.pk]))
    assert response.status_code == 302
    live = {q.unit_id: q.guaranteed for q in Quota.objects.filter(gpu_type="H100")}
    assert (live[org.team_a.pk], live[org.team_b.pk], live[org.team_c.pk]) == (8, 16, 4)
    entry = AuditEntry.objects.get(action="draft.apply")
    assert "team-a H100: guaranteed 16 → 8" in entry.message and "team-b H100" in entry.message
    assert AuditEntry.objects.filter(action="quota.update", unit=org.team_a).count() == 1
    history = _client(admin).get(reverse("quota-history")).content.decode()
    assert f"applied draft {draft.name}" in history and "team-a H100: guaranteed 16 → 8" in history
    draft.refresh_from_db()
    assert draft.applied_at is not None
    # Applied: read-only, and not applied twice.
    again = _client(admin).post(reverse("draft-apply", args=[draft.pk]))
    assert again.status_code == 400 and "was applied" in again.content.decode()


def test_apply_is_refused_when_the_live_tree_changed_the_same_cell(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.root)
    draft_quota_set(actor=admin, draft=draft, unit=org.team_a, gpu_type="H100", guaranteed=10, limit=32)
    quota_set(actor=admin, unit=org.team_a, gpu_type="H100", guaranteed=12, limit=32)
    response = _client(admin).post(reverse("draft-apply", args=[draft.pk]))
    body = response.content.decode()
    assert response.status_code == 400
    assert "team-a H100 was guaranteed 16, limit 32, weight 1 when copied and is guaranteed 12" in body
    assert Quota.objects.get(unit=org.team_a, gpu_type="H100").guaranteed == 12
    with pytest.raises(Exception, match="changed since this draft was copied"):
        draft_apply(actor=admin, draft=draft)


def test_a_run_over_a_window_without_jobs_is_refused(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.root)
    response = _client(admin).post(reverse("whatif-new", args=[draft.pk]), {"start": "2026-10-01", "end": "2026-10-31"})
    assert response.status_code == 400
    assert "No jobs ran that were submitted between 2026-10-01" in response.content.decode()
    bad = _client(admin).post(reverse("whatif-new", args=[draft.pk]), {"start": "2026-10-31", "end": "2026-10-01"})
    assert bad.status_code == 400 and "must end after it starts" in bad.content.decode()
    assert not WhatIfRun.objects.exists()


def _small_history(org: Org, user: Any) -> None:
    nodes = make_cluster(nodes=2)
    start = timezone.now() - timedelta(days=3)
    for i in range(6):
        submitted = start + timedelta(hours=i)
        job = make_job(
            team=org.team_a if i % 2 else org.team_b,
            user=user,
            gpus_per_replica=8,
            submitted_at=submitted,
            started_at=submitted,
            ended_at=submitted + timedelta(hours=2),
            state="COMPLETED",
            time_limit_s=4 * 3600,
        )
        Task.objects.create(
            job=job, attempt=1, rank=0, node=nodes[0], started_at=submitted, ended_at=submitted + timedelta(hours=2)
        )


def test_a_run_is_queued_shows_its_progress_and_answers_in_a_table_and_a_csv(
    org: Org, django_capture_on_commit_callbacks: Any
) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    _small_history(org, admin)
    draft = draft_create(actor=admin, root=org.root)
    client = _client(admin)
    today = timezone.localdate()
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(
            reverse("whatif-new", args=[draft.pk]), {"start": str(today - timedelta(days=5)), "end": str(today)}
        )
    assert len(callbacks) == 1  # the task, sent once the run is committed
    run = WhatIfRun.objects.get()
    assert response.status_code == 302 and run.jobs == 6 and run.state == RunState.QUEUED
    polled = client.get(reverse("whatif-run", args=[run.pk]), HTTP_HX_REQUEST="true")
    assert 'hx-trigger="every 1s"' in polled.content.decode() and "HX-Refresh" not in polled
    assert client.get(reverse("whatif-csv", args=[run.pk])).status_code == 404
    assert whatif_run(run_id=run.pk) == RunState.DONE
    assert whatif_run(run_id=run.pk) == "not queued"  # a redelivered task does nothing
    done = client.get(reverse("whatif-run", args=[run.pk]), HTTP_HX_REQUEST="true")
    assert done["HX-Refresh"] == "true" and "every 1s" not in done.content.decode()
    page = client.get(reverse("whatif-run", args=[run.pk])).content.decode()
    assert 'id="whatif-units"' in page and "team-a" in page and "Caveats" in page
    csv = client.get(reverse("whatif-csv", args=[run.pk]))
    lines = csv.content.decode().splitlines()
    assert csv["Content-Type"].startswith("text/csv") and lines[0].startswith("unit,kind,jobs,live_p50_wait_h")
    assert any(line.startswith("team-a,Team,3,") for line in lines)


def test_cancel_stops_a_queued_run_and_a_running_one_at_its_next_report(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.root)
    now = timezone.now()
    queued = WhatIfRun.objects.create(draft=draft, window_start=now - timedelta(days=1), window_end=now)
    _client(admin).post(reverse("whatif-cancel", args=[queued.pk]))
    queued.refresh_from_db()
    assert queued.state == RunState.CANCELLED
    assert whatif_run(run_id=queued.pk) == "not queued"
    running = WhatIfRun.objects.create(draft=draft, window_start=now - timedelta(days=1), window_end=now, state=RunState.RUNNING)
    _client(admin).post(reverse("whatif-cancel", args=[running.pk]))
    running.refresh_from_db()
    assert running.state == RunState.CANCELLING
    from scheduling.whatif.replay import Cancelled
    from scheduling.whatif.services import _Progress

    with pytest.raises(Cancelled):
        _Progress(running.pk, 0.0, 0.5)(0.3)


def test_a_run_whose_jobs_cannot_run_on_todays_fleet_fails_saying_so(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    node = make_cluster(nodes=1)[0]
    submitted = timezone.now() - timedelta(days=1)
    job = make_job(team=org.team_a, user=admin, gpu_type="B200", submitted_at=submitted, started_at=submitted)
    Task.objects.create(job=job, attempt=1, rank=0, node=node, started_at=submitted, ended_at=submitted + timedelta(hours=1))
    draft = draft_create(actor=admin, root=org.root)
    run = WhatIfRun.objects.create(draft=draft, window_start=submitted - timedelta(hours=1), window_end=timezone.now())
    assert whatif_run(run_id=run.pk) == RunState.FAILED
    run.refresh_from_db()
    assert "none of the window's jobs can be replayed on today's fleet" in run.message
    page = _client(admin).get(reverse("whatif-run", args=[run.pk])).content.decode()
    assert "Failed" in page and "today&#x27;s fleet" in page


def test_the_draft_tree_replaces_the_units_the_draft_copied_and_keeps_a_unit_added_since(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    draft = draft_create(actor=admin, root=org.bu)
    draft_quota_set(actor=admin, draft=draft, unit=org.team_a, gpu_type="H100", guaranteed=8, limit=None)
    team_d = unit_create(actor=admin, name="team-d", kind=UnitKind.TEAM, parent=org.dept)
    quota_set(actor=admin, unit=team_d, gpu_type="H100", guaranteed=4)
    live = {u.name: u for u in quota_units()}
    drafted = {u.name: u for u in quota_units(draft=draft)}
    assert live[org.team_a.slug].guaranteed == {"H100": 16} and live[org.team_a.slug].limit == {"H100": 32}
    assert drafted[org.team_a.slug].guaranteed == {"H100": 8} and drafted[org.team_a.slug].limit == {}
    assert drafted[team_d.slug].guaranteed == {"H100": 4}  # added since the copy: the draft says nothing about it
    assert drafted[org.team_c.slug] == live[org.team_c.slug]  # outside the draft's subtree


def test_usage_before_a_window_counts_what_teams_held_before_it_decayed_to_its_start(org: Org) -> None:
    admin = make_user("root-admin", unit=org.root, role=Role.CLUSTER_ADMIN)
    node = make_cluster(nodes=1)[0]
    gpus = list(node.gpus.order_by("index"))
    start = timezone.now() - timedelta(days=3)
    job = make_job(team=org.team_a, user=admin, submitted_at=start - timedelta(days=2))
    task = Task.objects.create(job=job, attempt=1, rank=0, node=node)
    spans = [
        (gpus[0], start - timedelta(days=2), start - timedelta(days=1)),  # a day, ended a day before the window
        (gpus[1], start - timedelta(hours=1), None),  # still held: counted up to the window's start
        (gpus[2], start + timedelta(hours=1), start + timedelta(hours=2)),  # inside the window: not before it
    ]
    for gpu, began, ended in spans:
        Allocation.objects.create(gpu=gpu, task=task, job=job, attempt=1, allocated_at=began, released_at=ended)
    half_life = 7 * 86400.0
    expected = decay(accrue(0.0, 1, 86400, half_life), 86400, half_life) + accrue(0.0, 1, 3600, half_life)
    assert usage_before(start=start, half_life_s=half_life) == {org.team_a.slug: {"H100": pytest.approx(expected)}}
