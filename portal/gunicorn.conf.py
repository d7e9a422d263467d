"""gunicorn for the portal: `gunicorn -c portal/gunicorn.conf.py portal.wsgi`, in `make run` and in deployments.

Every value comes from the environment, with defaults for one small machine.
"""

import os


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SystemExit(f"{name}={value} must be at least {minimum}")
    return value


bind = [os.environ.get("YARD_BIND", "127.0.0.1:8000")]
# gthread: a fixed pool of threads per worker process. Each thread keeps at most one database
# connection (CONN_MAX_AGE, portal/settings.py), so the web tier opens at most workers x threads
# connections however many requests arrive (tests/demo/test_gunicorn.py counts them).
worker_class = "gthread"
workers = _int("YARD_WEB_WORKERS", 2)
# Eight, so a worker takes seven requests at once besides heartbeats: a CI system posts over a handful
# of keep-alive connections, each sticks to one worker, and at four threads (three taken) 8 clients on
# 2 workers were shed all along, each shed a client's 1 s wait (Retry-After). Threads cost a database
# connection each, not CPU: the GIL runs one at a time either way.
threads = _int("YARD_WEB_THREADS", 8)
# Each worker works on at most threads - 1 requests at once besides heartbeats and /healthz, and sheds
# the rest with a fast 503 (portal/middleware.py AdmissionMiddleware): a heartbeat always finds a thread.
os.environ.setdefault("YARD_WEB_INFLIGHT", str(max(threads - 1, 1)))
# A request that still runs after this is a hung worker: gunicorn replaces the process.
timeout = _int("YARD_WEB_TIMEOUT_S", 60)
# On SIGTERM, requests in flight get this long to finish: short enough for `make run`'s stop to
# end everything within 10 s.
graceful_timeout = _int("YARD_WEB_GRACEFUL_TIMEOUT_S", 5)
keepalive = 5
# Agents and browsers keep connections open; gthread parks idle keep-alive connections off the pool.
worker_connections = _int("YARD_WEB_CONNECTIONS", 1000)

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("YARD_WEB_LOG_LEVEL", "info")
# Agent heartbeats only when they failed or were slow (portal/weblog.py); people's requests always.
logger_class = "portal.weblog.AccessLogger"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms "%(a)s"'
# The workers import the app once in the master (a crash in settings shows before any worker forks).
preload_app = True
# Behind a TLS proxy (YARD_BEHIND_PROXY=1, see README) trust its X-Forwarded-* from these addresses.
forwarded_allow_ips = os.environ.get("YARD_FORWARDED_ALLOW_IPS", "127.0.0.1")
# gunicorn's control socket defaults to one path per user (~/.gunicorn/gunicorn.ctl): two servers on
# one machine (the demo and a test's, or two deployments) would fight over it. Nothing here uses it.
control_socket_disable = True
