"""A real OpenID Connect provider for the SSO tests: panva's certified `oidc-provider` run by Node on
127.0.0.1 (tests/sso/idp/), installed with `npm ci` from the committed lock file when node_modules is
missing, and the portal's OIDC settings pointed at it."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.cache import cache

from sso.config import parse_group_map

IDP_DIR = Path(__file__).resolve().parent / "idp"
CLIENT_ID = "yardmaster-test"
CLIENT_SECRET = "test-client-secret-1b9f"
GROUP_MAP = {
    "ml-team-a": {"unit": "team-a", "role": "member"},
    "ml-leads-b": {"unit": "team-b", "role": "team_lead"},
    "research-admins": {"unit": "research", "role": "org_admin"},
    "platform": {"role": "cluster_admin"},
}

# Playwright's sync API runs an event loop in the test's thread (see tests/browser/conftest.py).
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _installed(marker: Path, want: str) -> bool:
    """Whether node_modules is a whole install of the committed lock file: its marker names the lock's
    hash (written only after `npm ci` finished) and Node can load the provider and its dependencies. A
    copy cut short (an interrupted install, a truncated file in a copied tree) fails the second check."""
    if not marker.exists() or marker.read_text().strip() != want:
        return False
    check = subprocess.run(
        ["node", "--input-type=module", "-e", "await import('oidc-provider')"],
        cwd=IDP_DIR,
        capture_output=True,
        timeout=60,
    )
    return check.returncode == 0


def _node_modules() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed (apt-get install nodejs npm): the SSO tests run a real OIDC provider on it")
    modules = IDP_DIR / "node_modules"
    marker = modules / ".yard-installed"
    want = hashlib.sha256((IDP_DIR / "package-lock.json").read_bytes()).hexdigest()
    with (IDP_DIR / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pytest processes never install over each other
        if _installed(marker, want):
            return
        shutil.rmtree(modules, ignore_errors=True)
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=IDP_DIR, check=True, timeout=600, capture_output=True)
        marker.write_text(want)
        if not _installed(marker, want):
            raise RuntimeError(f"`npm ci` in {IDP_DIR} finished but Node cannot load oidc-provider from it")


@dataclass
class IdP:
    issuer: str
    accounts_file: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def set_accounts(self, accounts: dict[str, dict[str, Any]]) -> None:
        """What the provider says about each account at its next sign-in (an admin editing groups)."""
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(accounts))
        tmp.replace(self.accounts_file)


@pytest.fixture(scope="session")
def idp(live_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdP]:
    _node_modules()
    root = tmp_path_factory.mktemp("idp")
    accounts = root / "accounts.json"
    accounts.write_text("{}")
    port = free_port()
    log = root / "idp.log"
    env = {
        **os.environ,
        "IDP_PORT": str(port),
        "IDP_CLIENT_ID": CLIENT_ID,
        "IDP_CLIENT_SECRET": CLIENT_SECRET,
        "IDP_REDIRECT_URI": f"{live_server.url}/oidc/callback/",
        "IDP_ACCOUNTS": str(accounts),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(["node", "idp.mjs"], cwd=IDP_DIR, env=env, stdout=out, stderr=subprocess.STDOUT)
    issuer = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the test IdP did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    yield IdP(issuer=issuer, accounts_file=accounts, proc=proc, log=log)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def configure(settings: Any, *, issuer: str, secret: str = CLIENT_SECRET, local_login: bool = True) -> None:
    """Point the portal at ``issuer``, as the YARD_OIDC_* variables would (portal/settings.py)."""
    settings.OIDC_OP_ISSUER = issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = secret
    settings.OIDC_RP_SCOPES = "openid email profile groups"
    settings.OIDC_TIMEOUT = 3
    settings.YARD_OIDC_PROVIDER_NAME = "Test IdP"
    settings.YARD_OIDC_GROUP_MAP = parse_group_map(GROUP_MAP)
    settings.YARD_LOCAL_LOGIN = local_login
    settings.AUTHENTICATION_BACKENDS = [
        *(["django.contrib.auth.backends.ModelBackend"] if local_login else []),
        "sso.backend.YardOidcBackend",
    ]
    cache.delete(f"yard:oidc:discovery:{issuer}")
