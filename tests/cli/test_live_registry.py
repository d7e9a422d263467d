"""`yard registry-credential ls / set / rm` against a live portal: a team lead sets the team's registry
login with the password on stdin, lists it without the password, replaces and deletes it; a member may not;
the password is never an argument and never printed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scheduling.models import RegistryCredential
from scheduling.registry_credentials import credential_for_image
from tenants.models import Role
from tenants.services import token_create_personal
from tests.cli.conftest import Yard, yard_executable
from tests.e2e.conftest import Harness
from tests.factories import make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SECRET = "ngc-api-key-must-not-leak"


@pytest.fixture
def lead_yard(harness: Harness, yard: Yard, tmp_path: Path) -> Yard:
    lead = make_user("lena", unit=harness.org.team_a, role=Role.TEAM_LEAD)
    token = token_create_personal(user=lead, name="cli", expires_at=None).raw
    return Yard(url=yard.url, token=token, home=yard.home)


def run_with_stdin(yard: Yard, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([yard_executable(), *args], env=yard.env(), input=stdin, capture_output=True, text=True, timeout=60)


def test_a_team_lead_sets_lists_replaces_and_removes_a_credential(harness: Harness, lead_yard: Yard) -> None:
    team = harness.org.team_a.slug
    done = run_with_stdin(
        lead_yard, SECRET + "\n", "registry-credential", "set", team, "nvcr.io", "-u", "$oauthtoken", "--password-stdin"
    )
    assert done.returncode == 0, done.stderr
    assert "set credential" in done.stdout and f"$oauthtoken@nvcr.io for {team}" in done.stdout
    credential = RegistryCredential.objects.get()
    opened = credential_for_image(team_id=harness.org.team_a.pk, image="nvcr.io/nvidia/pytorch:24.05-py3")
    assert opened == {"username": "$oauthtoken", "password": SECRET}  # the newline echo adds is not part of it

    listed = lead_yard.run("registry-credential", "ls", check=True)
    assert "nvcr.io" in listed.stdout and "$oauthtoken" in listed.stdout and SECRET not in listed.stdout
    as_json = json.loads(lead_yard.run("registry-credential", "ls", "--json", check=True).stdout)
    assert [(c["registry"], c["username"]) for c in as_json] == [("nvcr.io", "$oauthtoken")]
    assert "password" not in json.dumps(as_json)

    again = run_with_stdin(
        lead_yard, "second\n", "registry-credential", "set", team, "nvcr.io", "-u", "$oauthtoken", "--password-stdin"
    )
    assert again.returncode == 0 and "replaced credential" in again.stdout, again.stderr
    assert credential_for_image(team_id=harness.org.team_a.pk, image="nvcr.io/x:1") == {
        "username": "$oauthtoken",
        "password": "second",
    }

    removed = lead_yard.run("registry-credential", "rm", str(credential.pk))
    assert removed.returncode == 0 and f"deleted credential {credential.pk}" in removed.stdout, removed.stderr
    assert not RegistryCredential.objects.exists()
    assert lead_yard.run("registry-credential", "rm", str(credential.pk)).returncode != 0  # gone: 404


def test_without_stdin_or_the_variable_it_refuses_and_a_member_may_not_set_one(
    harness: Harness, yard: Yard, lead_yard: Yard
) -> None:
    team = harness.org.team_a.slug
    no_password = run_with_stdin(lead_yard, "", "registry-credential", "set", team, "nvcr.io", "-u", "bot")
    assert no_password.returncode != 0 and "--password-stdin" in no_password.stderr
    member = run_with_stdin(yard, SECRET, "registry-credential", "set", team, "nvcr.io", "-u", "bot", "--password-stdin")
    assert member.returncode != 0
    assert "not one whose registry credentials you may manage" in member.stderr
    assert SECRET not in member.stderr + member.stdout
    assert not RegistryCredential.objects.exists()
