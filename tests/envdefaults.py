"""Test-run defaults: real PostgreSQL and Redis on this machine unless the environment says otherwise.

Loaded as a plugin (-p tests.envdefaults in pyproject) before pytest-django sets Django up,
so these reach portal/settings.py.

Under pytest-xdist (`make test` runs the suite on several workers) each worker gets its own of every
shared thing: pytest-django already suffixes the test database (test_<name>_gw1); here the worker gets
the Redis database after the run's one by its index (REDIS_URL .../5 -> gw0 5, gw1 6: broker, cache and
counters, and the bench stacks some tests start, which flush theirs), a folder of its own under
YARD_VAR_DIR, and a block of rendezvous ports of its own.
"""

import os
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/yardmaster")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production-7d1f0c9a8b6e5d4c3b2a1f0e9d8c7b6a")
os.environ.setdefault("YARD_VAR_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "test"))

REDIS_DATABASES = 16  # redis-server's default `databases`


def worker_index() -> int | None:
    """0 for xdist's gw0, 1 for gw1, ...; None outside xdist (the controller, or a run without -n)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def redis_url_for_worker(url: str, index: int) -> str:
    parts = urlsplit(url)
    path = parts.path.strip("/")
    base = int(path) if path.isdigit() else 0
    db = base + index
    if db >= REDIS_DATABASES:
        raise RuntimeError(f"xdist worker gw{index} would need Redis database {db} (REDIS_URL {url}): run fewer workers")
    return urlunsplit(parts._replace(path=f"/{db}"))


_index = worker_index()
if _index is not None:
    _redis = os.environ["REDIS_URL"]
    if _redis:  # empty: the file cache and broker under YARD_VAR_DIR, per worker below
        os.environ["REDIS_URL"] = redis_url_for_worker(_redis, _index)
    # bench/stack.py flushes its Redis database at start: a worker's stacks use that worker's database.
    os.environ["BENCH_REDIS"] = os.environ["REDIS_URL"] or os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/11")
    os.environ["YARD_VAR_DIR"] = os.path.join(os.environ["YARD_VAR_DIR"], f"gw{_index}")
    # Workloads that really bind their rendezvous port (tests/e2e, tests/faults) must not meet another
    # worker's there: gw0 keeps the default 29500-29999, gw1 gets 30000-30499, and so on.
    if "YARD_RENDEZVOUS_PORTS" not in os.environ:
        _low = 29500 + _index * 500
        os.environ["YARD_RENDEZVOUS_PORTS"] = f"{_low}-{_low + 499}"
