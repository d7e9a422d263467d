"""`yard serve` against a live portal: create (and a bad field said as its option), status of one and the
list, logs, scale, rollout (a new revision, --wait's exits), tokens (shown once, listed by prefix, revoked),
delete, and a name two teams use.

No agents: the test plays the controller (reconcile, in-process) so the replicas exist as queued jobs, and
asserts on what the API answers; the replicas never become ready, and need not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.utils import timezone

from scheduling.models import Job, Service, ServiceToken
from scheduling.serving.controller import reconcile
from tenants.models import Role
from tenants.services import membership_set
from tests.cli.conftest import Yard
from tests.e2e.conftest import Harness, wait_for
from tests.factories import make_cluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cluster(harness: Harness) -> None:
    make_cluster(nodes=2)


def _create(yard: Yard, team: str, *extra: str) -> dict:
    done = yard.run(
        "serve", "create", "chat", "--team", team, "--gpu-type", "H100", "--command", "python -m http.server $PORT",
        "--json", *extra, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def test_create_status_logs_scale_and_delete(harness: Harness, yard: Yard, cluster: None) -> None:
    team = harness.org.team_a.slug
    made = yard.run(
        "serve", "create", "chat", "--team", team, "--gpu-type", "H100", "--replicas", "2", "--tier", "1",
        "--command", "python -m http.server $PORT", "-e", "MODEL=m1", "-e", "LOG=info", "--readiness-path", "/health",
        "--progress-deadline", "10m", check=True,
    )  # fmt: skip
    service = Service.objects.get()
    assert f"Created service {service.pk} chat (team {team}): 2 × 1 H100, tier 1" in made.stdout
    assert f"endpoint: {yard.url}/services/{team}/chat/" in made.stdout
    assert (service.replicas, service.readiness_path, service.progress_deadline_s) == (2, "/health", 600)
    reconcile(service_id=service.pk)  # the controller's beat: the two replicas are queued jobs now
    replicas = list(Job.objects.filter(service=service).order_by("id").values_list("id", flat=True))
    assert len(replicas) == 2

    status = yard.run("serve", "status", "chat", check=True).stdout
    assert "0/2 replicas" in status
    assert "progressing to revision 1: 0/2 ready (2 replicas of it)" in status
    assert f"{yard.url}/services/{team}/chat/" in status
    assert "req/s, p50 -, p99 -" in status
    for job_id in replicas:
        assert f"{job_id}  " in status
    assert "PENDING" in status and "CRASH-LOOPING" in status
    one = json.loads(yard.run("serve", "status", "chat", "--json", check=True).stdout)
    assert [rep["job"] for rep in one["replica_list"]] == replicas
    assert {rep["ready"] for rep in one["replica_list"]} == {False}
    assert one["stats"]["requests"] == 0 and one["env"] == {"MODEL": "m1", "LOG": "info"}
    assert json.loads(yard.run("serve", "status", str(service.pk), "--json", check=True).stdout)["id"] == service.pk

    listed = yard.run("serve", "status", check=True).stdout
    assert "chat" in listed and team in listed and "0/2" in listed and "progressing" in listed
    assert [s["id"] for s in json.loads(yard.run("serve", "status", "--team", team, "--json", check=True).stdout)] == [service.pk]

    logs = yard.run("serve", "logs", "chat", "--tail", "20", "--json", check=True)
    assert json.loads(logs.stdout)["replica"] == replicas[0]  # the first live replica; nothing written yet
    stranger = yard.run("serve", "logs", "chat", "--replica", "987654")
    assert stranger.returncode == 1
    assert "replica: Not a replica of chat" in stranger.stderr
    quiet = yard.run("serve", "logs", "chat", check=True)
    assert quiet.stdout == "" and f"service chat: replica {replicas[0]} has written nothing yet" in quiet.stderr
    following = yard.start("serve", "logs", "chat", "--follow", "--replica", str(replicas[1]))
    Job.objects.filter(pk=replicas[1]).update(state="CANCELLED", ended_at=timezone.now())
    _, errs = following.communicate(timeout=60)
    assert following.returncode == 0 and f"-- replica {replicas[1]} has ended --" in errs

    scaled = yard.run("serve", "scale", "chat", "3", check=True)
    assert f"service chat (team {team}): 3 replicas wanted" in scaled.stdout
    assert Service.objects.get().replicas == 3

    deleted = yard.run("serve", "delete", "chat", check=True)
    assert "deleting" in deleted.stdout
    assert Service.objects.get().state == "deleting"
    again = yard.run("serve", "scale", "chat", "2")
    assert again.returncode == 1 and "Service chat is being deleted" in again.stderr


def test_a_bad_field_is_said_as_the_option_and_a_missing_service_as_missing(harness: Harness, yard: Yard, cluster: None) -> None:
    team = harness.org.team_a.slug
    bad_path = yard.run("serve", "create", "chat", "--team", team, "--gpu-type", "H100", "--command", "serve",
                        "--readiness-path", "health")  # fmt: skip
    assert bad_path.returncode == 1
    assert "error: --readiness-path:" in bad_path.stderr
    bad_name = yard.run("serve", "create", "Chat_Bot", "--team", team, "--gpu-type", "H100", "--command", "serve", "--json")
    assert bad_name.returncode == 1 and "name" in json.loads(bad_name.stdout)["fields"]
    never = yard.run("serve", "create", "chat", "--team", team, "--gpu-type", "B200", "--command", "serve")
    assert never.returncode == 1 and "B200" in never.stderr
    assert not Service.objects.exists()
    missing = yard.run("serve", "status", "nosuch")
    assert missing.returncode == 1 and "No service called nosuch" in missing.stderr
    assert json.loads(yard.run("serve", "scale", "nosuch", "2", "--json").stdout)["code"] == "not_found"


def test_a_spec_file_creates_the_service_and_flags_beside_it_are_refused(
    harness: Harness, yard: Yard, cluster: None, tmp_path: Path
) -> None:
    spec = tmp_path / "chat.yaml"
    spec.write_text(
        "apiVersion: yardmaster.io/v1\nkind: Service\nname: chat\ngpu_type: H100\nreplicas: 2\n"
        "command: python -m http.server $PORT\nenv:\n  MODEL: m1\nliveness_path: /live\n"
    )
    both = yard.run("serve", "create", "-f", str(spec), "--team", harness.org.team_a.slug, "--replicas", "3")
    assert both.returncode == 2 and "--replicas: with -f, say it in the file" in both.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: chat\ngpu_type: H100\ncommand: serve\nreadines_path: /health\n")
    refused = yard.run("serve", "create", "-f", str(typo))
    assert refused.returncode == 2 and "unknown field(s) readines_path" in refused.stderr
    made = json.loads(yard.run("serve", "create", "-f", str(spec), "--json", check=True).stdout)  # alice's only team
    assert (made["name"], made["team"]["slug"], made["replicas"]) == ("chat", harness.org.team_a.slug, 2)
    assert (made["env"], made["liveness_path"]) == ({"MODEL": "m1"}, "/live")


def test_rollout_makes_a_new_revision_rolls_back_and_wait_exits_on_the_outcome(
    harness: Harness, yard: Yard, cluster: None
) -> None:
    svc = _create(yard, harness.org.team_a.slug, "-e", "MODEL=m1", "-e", "LOG=info")
    rolled = yard.run("serve", "rollout", "chat", "-e", "MODEL=m2", "--unset-env", "LOG", check=True)
    assert "progressing to revision 2 from 1" in rolled.stdout
    service = Service.objects.get(pk=svc["id"])
    assert service.revision == 2 and service.revisions.count() == 2
    assert service.revisions.get(number=2).env == {"MODEL": "m2"}  # the named one changed, the unset one gone
    status = json.loads(yard.run("serve", "status", "chat", "--json", check=True).stdout)
    assert (status["revision"], status["rollout"]["state"], status["rollout"]["from_revision"]) == (2, "progressing", 1)

    nothing = yard.run("serve", "rollout", "chat")
    assert nothing.returncode == 1 and "Name what changes" in nothing.stderr
    back = json.loads(yard.run("serve", "rollout", "chat", "--to-revision", "1", "--json", check=True).stdout)
    assert (back["revision"], back["env"]) == (3, {"MODEL": "m1", "LOG": "info"})
    too_far = yard.run("serve", "rollout", "chat", "--to-revision", "9")
    assert too_far.returncode == 1 and "No earlier revision 9" in too_far.stderr

    # No agents: the rollout never completes, and --wait says so when its time is up.
    timed_out = yard.run("serve", "rollout", "chat", "--command", "serve v4", "--wait", "--wait-timeout", "1")
    assert timed_out.returncode == 125, timed_out.stderr
    assert "the rollout to revision 4 is still progressing" in timed_out.stderr

    # The controller rolls it back (played here): --wait exits non-zero and says why.
    waiting = yard.start("serve", "rollout", "chat", "--command", "serve v5", "--wait")
    wait_for("revision 5", lambda: Service.objects.filter(pk=svc["id"], revision=5).exists())
    Service.objects.filter(pk=svc["id"]).update(rollout_state="rolled_back", rollout_message="revision 5 missed its deadline")
    _, errs = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, errs
    assert "error: the rollout to revision 5 was rolled back: revision 5 missed its deadline" in errs

    done = yard.start("serve", "rollout", "chat", "--command", "serve v6", "--wait")
    wait_for("revision 6", lambda: Service.objects.filter(pk=svc["id"], revision=6).exists())
    Service.objects.filter(pk=svc["id"]).update(rollout_state="complete")
    _, errs = done.communicate(timeout=60)
    assert done.returncode == 0, errs
    assert "rollout complete: revision 6" in errs


def test_a_token_is_shown_once_listed_by_prefix_and_revoked(harness: Harness, yard: Yard, cluster: None) -> None:
    svc = _create(yard, harness.org.team_a.slug)
    made = yard.run("serve", "token", "create", "chat", "--token-name", "frontend", check=True)
    raw = made.stdout.strip()
    assert raw.startswith("ysvc_") and "\n" not in raw  # alone on stdout, for TOKEN=$(yard serve token create …)
    assert "shown this once" in made.stderr
    token = ServiceToken.objects.get(service_id=svc["id"])
    assert token.name == "frontend" and raw.startswith(token.prefix)

    listed = yard.run("serve", "token", "list", "chat", check=True).stdout
    assert "frontend" in listed and f"{token.prefix}…" in listed and raw not in listed
    as_json = json.loads(yard.run("serve", "token", "list", "chat", "--json", check=True).stdout)
    assert [(t["id"], t["prefix"], t["revoked_at"]) for t in as_json] == [(token.pk, token.prefix, None)]
    assert raw not in json.dumps(as_json)

    revoked = yard.run("serve", "token", "revoke", "chat", str(token.pk), check=True)
    assert f"revoked token {token.pk} (frontend" in revoked.stdout
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert json.loads(yard.run("serve", "token", "list", "chat", "--json", check=True).stdout)[0]["revoked_at"]
    unknown = yard.run("serve", "token", "revoke", "chat", "987654")
    assert unknown.returncode == 1 and "Not found: no such object" in unknown.stderr


def test_a_name_two_teams_use_asks_for_the_team(harness: Harness, yard: Yard, cluster: None) -> None:
    org = harness.org
    membership_set(actor=None, user=harness.user, unit=org.team_b, role=Role.MEMBER)
    in_a = _create(yard, org.team_a.slug)
    in_b = _create(yard, org.team_b.slug)
    ambiguous = yard.run("serve", "status", "chat")
    assert ambiguous.returncode == 2
    assert f"chat is a service of several teams ({org.team_a.slug}, {org.team_b.slug}): say which with --team" in (
        ambiguous.stderr.replace("\n", " ")
    )
    assert yard.run("serve", "scale", "chat", "2").returncode == 2
    assert Service.objects.get(pk=in_a["id"]).replicas == 1

    chosen = json.loads(yard.run("serve", "status", "chat", "--team", org.team_b.slug, "--json", check=True).stdout)
    assert chosen["id"] == in_b["id"]
    yard.run("serve", "scale", "chat", "2", "--team", org.team_b.slug, check=True)
    assert Service.objects.get(pk=in_b["id"]).replicas == 2 and Service.objects.get(pk=in_a["id"]).replicas == 1
    by_id = json.loads(yard.run("serve", "status", str(in_a["id"]), "--json", check=True).stdout)
    assert by_id["team"]["slug"] == org.team_a.slug
