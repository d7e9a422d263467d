"""The job arrays' tests reuse the API tests' cast (two tenants, tokens) and the cluster as they are."""

from tests.api.conftest import _fresh_cache_and_roomy_throttle, cast, nodes  # noqa: F401
