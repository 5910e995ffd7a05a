"""Shared fixtures: real backends in a temporary folder, real Redis (standalone and Cluster) and
Memcached servers started for the session (see servers.py), and a process environment that never
points the default backend at the user's own cache."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from arrowstash import Backend, FileBackend, MemoryBackend
from servers import MemcachedServer, RedisClusterServers, RedisServer, require_module


@pytest.fixture(autouse=True)
def _isolated_environment(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backend=DEFAULT`` resolves to a throwaway folder, whatever the developer's shell has."""
    monkeypatch.delenv("ARROWSTASH_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def file_backend(cache_dir: Path) -> FileBackend:
    return FileBackend(cache_dir)


@pytest.fixture
def memory_backend() -> MemoryBackend:
    return MemoryBackend()


# -- servers ------------------------------------------------------------------------------------
# Session-wide servers belong to the test run alone. Tests still never flush them: every test
# gets backends under a prefix of its own (``unique_prefix``), so what one test stores is
# invisible to the others, and ``clear`` is tested against a server holding foreign keys.


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    require_module("redis", "redis")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    require_module("redis", "redis")
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def memcached_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MemcachedServer]]:
    require_module("pymemcache", "memcached")
    base = tmp_path_factory.mktemp("memcached")
    servers: list[MemcachedServer] = []
    try:
        for index in range(2):
            servers.append(MemcachedServer(base / str(index)).start())
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def memcached_server(memcached_servers: list[MemcachedServer]) -> MemcachedServer:
    return memcached_servers[0]


@pytest.fixture
def unique_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_backend(redis_server: RedisServer, unique_prefix: str) -> Iterator[Any]:
    from arrowstash.backends.redis import RedisBackend

    made = RedisBackend(redis_server.url, prefix=unique_prefix)
    yield made
    made.close()


@pytest.fixture
def redis_cluster_backend(redis_cluster: RedisClusterServers, unique_prefix: str) -> Iterator[Any]:
    from arrowstash.backends.redis import RedisBackend

    made = RedisBackend(redis_cluster.url, prefix=unique_prefix)
    yield made
    made.close()


@pytest.fixture
def memcached_backend(memcached_server: MemcachedServer, unique_prefix: str) -> Iterator[Any]:
    from arrowstash.backends.memcached import MemcachedBackend

    made = MemcachedBackend(memcached_server.url, prefix=unique_prefix)
    yield made
    made.close()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start dedicated Redis servers for one test (to kill, restart, or reach by socket)."""
    require_module("redis", "redis")
    started: list[RedisServer] = []

    def start(**options: Any) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(started)}", **options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def memcached_factory(tmp_path: Path) -> Iterator[Callable[[], MemcachedServer]]:
    """Start dedicated Memcached servers for one test."""
    require_module("pymemcache", "memcached")
    started: list[MemcachedServer] = []

    def start() -> MemcachedServer:
        server = MemcachedServer(tmp_path / f"memcached-{len(started)}", memory_mb=64)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


#: Backends every contract test runs against; server-bound ones carry their marker.
BACKENDS = [
    "file",
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis_cluster", marks=pytest.mark.redis),
    pytest.param("memcached", marks=pytest.mark.memcached),
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("object_memory", marks=pytest.mark.s3),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    made: Backend = request.getfixturevalue(f"{request.param}_backend")
    yield made
    if not _is_memcached(made):
        made.clear()
    # Memcached cannot clear all (it needs a namespace): its entries live under this test's
    # prefix, unreachable by any other test, and age out of the test-owned server.


def _is_memcached(made: Backend) -> bool:
    return not made.capabilities.lists_entries


# -- object stores --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    from servers import S3Server

    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_backend(s3_server: Any, unique_prefix: str) -> Any:
    from arrowstash.backends.object_store import ObjectStoreBackend

    return ObjectStoreBackend(s3_server.url(unique_prefix), **s3_server.credentials)


@pytest.fixture
def object_memory_backend(unique_prefix: str) -> Any:
    require_module("obstore", "s3")
    from arrowstash.backends.object_store import ObjectStoreBackend

    return ObjectStoreBackend(f"objstore+memory://{unique_prefix}")
