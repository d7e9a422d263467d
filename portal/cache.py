"""Django's Redis cache, with one Redis client per connection pool instead of one per call.

Django's RedisCacheClient builds a ``redis.Redis`` for every cache operation (its constructor fills a
table of ~80 response callbacks); a job submission makes three (the bad-token lockout, the token's rate
counter, the cycle request), about 3 % of its CPU. A client over a pool is safe to reuse, and each
thread has its own cache object (Django's ``caches``) and so its own clients and pools anyway.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class _ClientPerPool(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)  # type: ignore[attr-defined]
        client = self._clients.get(index)
        if client is None:
            pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
            client = self._clients[index] = self._client(connection_pool=pool)  # type: ignore[attr-defined]
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _ClientPerPool
