"""DEBUG only for the SQLite demo, a generated key for it, and no serving with a weak or missing key."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from portal.secret_key import DEV_SECRET, demo_secret_key, weakness
from tests.demo.helpers import REPO, free_port, server_env

STRONG = "a-very-long-random-production-secret-key-0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("lint", "4 characters long"),
        ("x" * 60, "fewer than 5 different characters"),
        ("django-insecure-" + "q" * 50, "django-insecure"),
        (DEV_SECRET, "development key"),
    ],
)
def test_a_weak_key_is_named_for_what_is_wrong_with_it(key: str, problem: str) -> None:
    assert problem in (weakness(key) or "")


def test_a_long_random_key_is_not_weak() -> None:
    assert weakness(STRONG) is None


def test_the_demo_key_is_generated_once_and_readable_only_by_its_owner(tmp_path: Path) -> None:
    first = demo_secret_key(tmp_path)
    assert weakness(first) is None
    assert demo_secret_key(tmp_path) == first
    assert stat.S_IMODE((tmp_path / "secret-key").stat().st_mode) == 0o600


def test_a_truncated_demo_key_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "secret-key").write_text("")
    assert weakness(demo_secret_key(tmp_path)) is None


def test_gunicorn_refuses_to_start_with_a_weak_key_when_debug_is_off(tmp_path: Path) -> None:
    env = server_env(tmp_path, SECRET_KEY="short", YARD_BIND=f"127.0.0.1:{free_port()}")
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "portal/gunicorn.conf.py", "portal.wsgi"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "SECRET_KEY is 5 characters long" in result.stdout + result.stderr
    assert "set SECRET_KEY to a long random string" in result.stdout + result.stderr


def test_the_web_app_loads_with_a_weak_key_when_debug_is_on(tmp_path: Path) -> None:
    env = server_env(tmp_path, SECRET_KEY="short", DEBUG="1")
    subprocess.run([sys.executable, "-c", "import portal.wsgi"], cwd=REPO, env=env, check=True, timeout=120)


def test_make_run_with_a_database_url_keeps_debug_off(tmp_path: Path) -> None:
    # Were DEBUG forced on, the development key would do and migrate would try the (absent) server.
    env = server_env(tmp_path, DATABASE_URL="postgres://nobody@127.0.0.1:9/nowhere", REDIS_URL="redis://127.0.0.1:9/0")
    result = subprocess.run(
        ["bash", "scripts/run-demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_the_sqlite_demo_runs_with_debug_off_and_no_secret_key(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    assert "DEBUG" not in env and "SECRET_KEY" not in env
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG, settings.ALLOWED_HOSTS)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**env, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert out.split(maxsplit=1)[0] == "False" and "127.0.0.1" in out
    assert (tmp_path / "secret-key").exists()
