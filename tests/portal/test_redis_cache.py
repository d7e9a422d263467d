"""The cache keeps its Redis clients (portal/cache.py): one per connection pool, not one per call."""

from django.core.cache import caches

from portal.cache import RedisCache


def test_the_cache_reuses_one_client_and_still_reads_what_it_wrote():
    cache = caches["default"]
    assert isinstance(cache, RedisCache)
    assert cache._cache.get_client(write=True) is cache._cache.get_client(write=True)
    cache.set("yard:test:reuse", {"n": 1}, timeout=10)
    assert cache.add("yard:test:reuse", 2, timeout=10) is False
    assert cache.get("yard:test:reuse") == {"n": 1}
    cache.delete("yard:test:reuse")
