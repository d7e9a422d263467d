import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.env import ImproperlyConfiguredEnv, database_from_url, env_bool, env_int, env_int_set
from tests.factories import make_org, make_user

ROOT = Path(__file__).resolve().parents[2]


def test_env_bool_rejects_a_typo(monkeypatch):
    monkeypatch.setenv("X_FLAG", "ture")
    with pytest.raises(ImproperlyConfiguredEnv, match="X_FLAG='ture' is not a boolean"):
        env_bool("X_FLAG", False)


def test_env_int_rejects_text(monkeypatch):
    monkeypatch.setenv("X_N", "ten")
    with pytest.raises(ImproperlyConfiguredEnv, match="X_N='ten' is not an integer"):
        env_int("X_N", 1)


def test_env_int_set_reads_codes_and_names_a_bad_one(monkeypatch):
    monkeypatch.setenv("X_CODES", " 48, 79,,95 ")
    assert env_int_set("X_CODES", frozenset()) == {48, 79, 95}
    monkeypatch.setenv("X_CODES", "")
    assert env_int_set("X_CODES", frozenset({1})) == frozenset()
    monkeypatch.setenv("X_CODES", "48,xid79")
    with pytest.raises(ImproperlyConfiguredEnv, match="'xid79' is not a non-negative integer; write codes like 48,79,95"):
        env_int_set("X_CODES", frozenset())


def test_database_url_with_unknown_scheme_says_what_to_write():
    with pytest.raises(ImproperlyConfiguredEnv, match="use postgres://"):
        database_from_url("mysql://x/y", base_dir=ROOT)


def test_database_url_postgres_is_parsed():
    db = database_from_url("postgres://u:p%40ss@db.example:6543/yard", base_dir=ROOT)
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == ("yard", "u", "p@ss", "db.example", "6543")


def test_each_process_names_itself_to_postgresql_unless_the_url_does():
    named = database_from_url("postgres://u@db.example/yard", base_dir=ROOT)["OPTIONS"]
    assert named["application_name"].startswith("yardmaster ") and str(os.getpid()) in named["application_name"]
    chosen = database_from_url("postgres://u@db.example/yard?application_name=portal-a", base_dir=ROOT)["OPTIONS"]
    assert chosen["application_name"] == "portal-a"


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # Not the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE either: no deployment sets it.
    unset = {"DEBUG", "YARD_HTTPS", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    full_env = {k: v for k, v in os.environ.items() if k not in unset} | env
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120
    )


def test_production_configuration_passes_check_deploy_with_no_warnings():
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        YARD_HTTPS="1",
        DEBUG="0",
        ALLOWED_HOSTS="yard.example.com",
        SECRET_KEY="a-very-long-random-production-secret-key-0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_debug_off_without_secret_key_refuses_to_start():
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


@pytest.mark.django_db
def test_login_page_signs_a_user_in_and_shows_the_dashboard(client):
    org = make_org()
    make_user("ann", unit=org.team_a, password="correct horse battery")
    page = client.get("/login/")
    assert page.status_code == 200 and b"Sign in" in page.content
    response = client.post("/login/", {"username": "ann", "password": "correct horse battery"}, follow=True)
    assert response.status_code == 200
    assert b"team-a" in response.content


@pytest.mark.django_db
def test_dashboard_requires_sign_in(client):
    response = client.get("/")
    assert response.status_code == 302 and "/login/" in response["Location"]


@pytest.mark.django_db
def test_seed_demo_builds_the_documented_org_and_cluster():
    from django.core.management import call_command

    from scheduling.models import Gpu, Node
    from tenants.models import OrgUnit, UnitKind

    call_command("seed_demo", verbosity=0)
    assert OrgUnit.objects.filter(kind=UnitKind.BUSINESS_UNIT).count() == 2
    assert OrgUnit.objects.filter(kind=UnitKind.DEPARTMENT).count() == 4
    assert OrgUnit.objects.filter(kind=UnitKind.TEAM).count() == 8
    assert Node.objects.filter(gpu_type="H100").count() == 32 and Node.objects.filter(gpu_type="A100").count() == 8
    node = Node.objects.first()
    gpus = Gpu.objects.filter(node=node)
    assert gpus.count() == 8
    assert gpus.values("nvlink_domain").distinct().count() == 1
    assert gpus.values("pcie_switch").distinct().count() == 2 and gpus.values("numa_node").distinct().count() == 2
