"""gunicorn's access log without the agents' chatter.

Forty simulated nodes heartbeat every few seconds: one access line each drowned the demo's console
(3,942 lines in 17 minutes) and a real cluster's log. Agent API requests are logged only when they
failed (4xx/5xx) or were slow; every request of a person or a CI pipeline is logged as before.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from gunicorn.glogging import Logger

AGENT_API_PREFIX = "/api/agent/"


def _slow_s() -> float:
    raw = os.environ.get("YARD_ACCESS_LOG_SLOW_S", "1.0")
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"YARD_ACCESS_LOG_SLOW_S={raw!r} is not a number of seconds") from None


SLOW_S = _slow_s()


def status_code(resp: Any) -> int:
    status = getattr(resp, "status_code", None)
    if isinstance(status, int):
        return status
    try:
        return int(str(resp.status).split(None, 1)[0])
    except (AttributeError, ValueError, IndexError):
        return 0


def worth_logging(path: str, status: int, request_time: timedelta) -> bool:
    if not path.startswith(AGENT_API_PREFIX):
        return True
    return status >= 400 or status == 0 or request_time.total_seconds() >= SLOW_S


class AccessLogger(Logger):  # type: ignore[misc]
    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta) -> None:
        if worth_logging(str(environ.get("PATH_INFO", "")), status_code(resp), request_time):
            super().access(resp, req, environ, request_time)
