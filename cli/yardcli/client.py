"""The portal's REST API over HTTP, and where `yard login` keeps the URL and token.

Errors are the API's own: a non-2xx answer becomes ApiError with the body as the server sent it
({"code", "message", "fields"}, or {"detail"} from the report endpoint), so the CLI prints exactly
what the API said.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from yardcli import __version__

CONFIG_NAME = "config.toml"
# A polite client for CI loops: a throttled (429) or briefly unavailable (503) answer is retried after
# the Retry-After the server gives, a few times, before it is reported.
RETRIES = 4
MAX_RETRY_WAIT_S = 30.0
# The creates the API deduplicates by Idempotency-Key (scheduling/api/submission.py): each submission sends
# one, the caller's or a fresh one, kept across its retries, so a retry whose first answer was lost
# (a timeout, a dropped connection) returns the job it made instead of making a second.
IDEMPOTENT_CREATES = frozenset({"/api/v1/jobs", "/api/v1/notebooks", "/api/v1/dev-sessions"})


class ApiError(Exception):
    """The API refused (4xx/5xx), or could not be reached (status 0)."""

    def __init__(self, status: int, body: Any, message: str) -> None:
        super().__init__(message)
        self.status, self.body, self.message = status, body, message

    @property
    def code(self) -> str:
        return str(self.body.get("code", "")) if isinstance(self.body, dict) else ""


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "yard"


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


def _toml_string(value: str) -> str:
    # TOML basic strings escape as JSON strings do (quotes, backslashes, control characters).
    return json.dumps(value, ensure_ascii=False)


def config_save(*, url: str, token: str) -> Path:
    """Write the URL and token, readable by the user alone (0600, in a 0700 directory), atomically."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    path = directory / CONFIG_NAME
    temporary = directory / f".{CONFIG_NAME}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"# yard login: the portal and your API token. Keep this file private.\nurl = {_toml_string(url)}\n")
        out.write(f"token = {_toml_string(token)}\n")
    os.replace(temporary, path)
    path.chmod(0o600)
    return path


def config_load() -> dict[str, str]:
    import tomllib

    path = config_path()
    if not path.exists():
        return {}
    with path.open("rb") as f:
        data = tomllib.load(f)
    return {k: str(v) for k, v in data.items() if k in ("url", "token")}


def credentials() -> tuple[str, str]:
    """YARD_URL / YARD_TOKEN (CI) before the saved login."""
    saved = config_load()
    url = os.environ.get("YARD_URL") or saved.get("url", "")
    token = os.environ.get("YARD_TOKEN") or saved.get("token", "")
    if not url or not token:
        raise ApiError(0, None, "Not signed in: run `yard login` (or set YARD_URL and YARD_TOKEN)")
    return url.rstrip("/"), token


def _message(response: httpx.Response, body: Any) -> str:
    if isinstance(body, dict):
        if body.get("message"):
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    text = response.text.strip()
    return text[:500] if text else f"HTTP {response.status_code}"


@dataclass
class Api:
    url: str
    token: str
    timeout: float = 30.0

    def __post_init__(self) -> None:
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}", "User-Agent": f"yard/{__version__}"},
            timeout=self.timeout,
        )

    @classmethod
    def from_environment(cls) -> Api:
        url, token = credentials()
        return cls(url, token)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        keyed = method == "POST" and path.rstrip("/") in IDEMPOTENT_CREATES
        if keyed:
            headers = dict(kwargs.get("headers") or {})
            if not any(name.lower() == "idempotency-key" for name in headers):
                headers["Idempotency-Key"] = f"yard-{uuid.uuid4()}"
            kwargs["headers"] = headers
        for attempt in range(RETRIES + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if keyed and attempt < RETRIES:  # safe: the key makes a second arrival a replay
                    time.sleep(min(2.0**attempt, MAX_RETRY_WAIT_S))
                    continue
                raise ApiError(0, None, f"Cannot reach {self.url}: {exc}") from None
            except httpx.HTTPError as exc:
                raise ApiError(0, None, f"Cannot reach {self.url}: {exc}") from None
            if response.status_code in (429, 503) and attempt < RETRIES:
                time.sleep(_retry_after(response, attempt))
                continue
            if response.is_success:
                return response
            try:
                body: Any = response.json()
            except ValueError:
                body = None
            raise ApiError(response.status_code, body, _message(response, body))
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs).json()


def _retry_after(response: httpx.Response, attempt: int) -> float:
    header = response.headers.get("Retry-After", "")
    try:
        wait = float(header)
    except ValueError:
        wait = 2.0**attempt
    return min(max(wait, 0.5), MAX_RETRY_WAIT_S)
