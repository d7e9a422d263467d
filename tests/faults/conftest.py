"""The fault suite reuses the end-to-end harness: the portal as pytest-django's live server, agents as
`python -m nodeagent` processes (tests/e2e/conftest.py)."""

from tests.e2e.conftest import harness  # noqa: F401  (the fixture)
