import pytest
from django.core.cache import cache

from tests.factories import make_cluster, make_org, make_user


@pytest.fixture
def org(db):
    return make_org()


@pytest.fixture
def ann(org):
    """A member of team_a."""
    return make_user("ann", unit=org.team_a)


@pytest.fixture
def nodes(db):
    return make_cluster(nodes=8, leaves_per_spine=2)


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()  # decayed usage and the cycle's debounce key live in the (test) Redis db
