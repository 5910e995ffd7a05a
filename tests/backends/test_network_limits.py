"""The documented limits of a shared network store (issue 20, item 11), on real servers:

- a replayed older entry (encrypted, or signed under a secret) is served until it expires,
  because it authenticates: that is the limit docs/network-security.md states;
- its expiry is authenticated: an expired replay is a miss, and one whose header was given a
  later expiry fails authentication;
- a forged chunk manifest (a huge chunk count or size, a strange version) is a quick miss that
  allocates and fetches next to nothing.
"""

from __future__ import annotations

import base64
import os
import struct
import time
import tracemalloc
from typing import Any

import msgpack
import pytest
import redis
from pymemcache.client.base import Client as MemcacheClient

import arrowstash
from arrowstash.backends._chunks import MANIFEST, MAX_CHUNKS
from arrowstash.backends.memcached import MemcachedBackend
from arrowstash.backends.redis import RedisBackend
from servers import MemcachedServer, RedisServer

KEY = base64.b64encode(os.urandom(32)).decode()


def _protected(kind: str) -> dict[str, Any]:
    return {"encrypt": True, "encryption_key": KEY} if kind == "encrypted" \
        else {"secret": b"replay-secret"}


def _entry_name(client: Any, prefix: str, hexdigest: str) -> bytes:
    (name,) = [n for n in client.scan_iter(f"{prefix}:*")
               if n.decode().endswith(f"{{{hexdigest}}}")]
    return name  # type: ignore[no-any-return]


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["encrypted", "signed"])
def test_a_replayed_entry_is_served_until_it_expires(redis_server: RedisServer,
                                                     unique_prefix: str, kind: str) -> None:
    runs: list[int] = []
    backend = RedisBackend(redis_server.url, prefix=unique_prefix)

    @arrowstash.cache(backend=backend, l1=False, ttl=1.5, **_protected(kind))
    def version(x: int) -> int:
        runs.append(x)
        return len(runs)

    client = redis.Redis.from_url(redis_server.url)
    assert version(1) == 1
    name = _entry_name(client, unique_prefix, version.cache_key(1).hex)
    old = client.get(name)
    assert old is not None
    assert version.refresh(1) == 2 and version(1) == 2
    client.set(name, old)  # a writer to the store puts the older entry back
    assert version(1) == 1, "the replayed entry authenticates: served (the documented limit)"
    later = bytearray(old)
    struct.pack_into("<d", later, 40, time.time() + 3600)  # give it a later expiry
    client.set(name, bytes(later))
    assert version(1) == 3, "a changed expiry fails authentication: recomputed"
    errors = version.cache_info().errors
    time.sleep(1.6)
    client.set(name, old)  # replayed after its expiry, without Redis' TTL
    assert version(1) == 4, "an expired replay is a miss"
    assert version.cache_info().errors == errors  # expired: a plain miss, not an error
    client.close()


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("memcached", marks=pytest.mark.memcached)])
def store(request: pytest.FixtureRequest, unique_prefix: str) -> Any:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        client = redis.Redis.from_url(server.url)
        yield RedisBackend(server.url, prefix=unique_prefix), client.set
        client.close()
    else:
        mc: MemcachedServer = request.getfixturevalue("memcached_server")
        mclient = MemcacheClient(mc.address)
        yield MemcachedBackend(mc.url, prefix=unique_prefix), \
            lambda name, value: mclient.set(name, value, noreply=False)
        mclient.close()


@pytest.mark.parametrize("manifest", [
    {"v": "00112233aabbccdd", "n": 10**9, "size": 10**12},
    {"v": "00112233aabbccdd", "n": MAX_CHUNKS + 1, "size": 1 << 40},
    {"v": "00112233aabbccdd", "n": 2, "size": 1 << 60},
    {"v": "00112233aabbccdd", "n": 5, "size": 3},
    {"v": "}{evil", "n": 1, "size": 10},
    {"v": "00112233aabbccdd", "n": True, "size": 10},
])
def test_a_forged_manifest_is_a_cheap_miss(store: Any, manifest: dict[str, Any]) -> None:
    backend, put = store
    runs: list[int] = []

    @arrowstash.cache(backend=backend, l1=False)
    def f(x: int) -> int:
        runs.append(x)
        return x

    assert f(1) == 1
    key = f.cache_key(1)
    name = backend._name(key)
    put(name, MANIFEST + msgpack.packb(manifest))
    tracemalloc.start()
    started = time.perf_counter()
    try:
        assert f(1) == 1
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - started < 0.5
    assert peak < 4 << 20, f"a forged manifest made the reader allocate {peak} bytes"
    assert runs == [1, 1]  # a miss: recomputed
