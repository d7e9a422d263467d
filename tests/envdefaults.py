"""Test-run defaults: real PostgreSQL and Redis on this machine unless the environment says otherwise.

Loaded as a plugin (-p tests.envdefaults in pyproject) before pytest-django sets Django up,
so these reach portal/settings.py.
"""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/yardmaster")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production-7d1f0c9a8b6e5d4c3b2a1f0e9d8c7b6a")
os.environ.setdefault("YARD_VAR_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "test"))
