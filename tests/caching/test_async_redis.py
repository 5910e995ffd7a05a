"""Async functions on Redis (standalone and Cluster) run on redis.asyncio: reads, writes and the
stampede lock are awaited on the event loop, not run with the sync client in worker threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import arrowstash
from arrowstash.backends._chunks import MANIFEST, read_manifest
from arrowstash.backends.redis import RedisBackend
from servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.redis


class RecordingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, recording what asyncio.to_thread hands it."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.ran: list[str] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        # to_thread submits functools.partial(contextvars.Context.run, func, ...)
        inner = fn.args[0] if hasattr(fn, "args") and fn.args else fn
        self.ran.append(getattr(inner, "__qualname__", repr(inner)))
        return super().submit(fn, *args, **kwargs)


def run(main: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``main()`` in a fresh event loop; what it returned and what went to threads."""
    executor = RecordingExecutor()

    async def wrapped() -> Any:
        asyncio.get_running_loop().set_default_executor(executor)
        return await main()

    try:
        return asyncio.run(wrapped()), executor.ran
    finally:
        executor.shutdown()


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "standalone":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    return cluster.url


@pytest.fixture
def backend(url: str, unique_prefix: str) -> Iterator[RedisBackend]:
    made = RedisBackend(url, prefix=unique_prefix, chunk_bytes=4096)
    yield made
    made.close()


def test_hits_and_misses_await_redis_asyncio(backend: RedisBackend) -> None:
    calls: list[int] = []

    @arrowstash.cache(backend=backend, l1=False)
    async def f(x: int) -> dict[str, Any]:
        calls.append(x)
        await asyncio.sleep(0)
        return {"x": x, "rows": list(range(x))}

    async def main() -> list[Any]:
        try:
            return [await f(3), await f(3), await f(4), await f(3)]
        finally:
            await backend.aclose()

    results, threaded = run(main)
    assert results == [{"x": 3, "rows": [0, 1, 2]}] * 2 + [{"x": 4, "rows": [0, 1, 2, 3]},
                                                           {"x": 3, "rows": [0, 1, 2]}]
    assert calls == [3, 4]
    info = f.cache_info()
    assert (info.hits, info.misses, info.errors) == (2, 2, 0)
    # Only encoding went to a worker thread: no backend read, write or lock did.
    assert threaded and set(threaded) == {"Core.prepare"}
    assert backend.get(f.cache_key(4)) is not None  # what the async client wrote, read back


def test_chunked_entries_round_trip_and_a_missing_chunk_is_a_miss(
        backend: RedisBackend) -> None:
    calls: list[int] = []

    @arrowstash.cache(backend=backend, l1=False)
    async def blob(n: int) -> bytes:
        calls.append(n)
        return bytes(range(256)) * n

    async def main() -> list[bytes]:
        try:
            first, second = await blob(100), await blob(100)
            name = backend._name(blob.cache_key(100))
            assert backend._client.get(name).startswith(MANIFEST)  # stored as chunks
            chunk = next(iter(backend._client.scan_iter(match=f"{name}:c:*")))
            backend._client.delete(chunk)
            third = await blob(100)  # a chunk is gone: recomputed, stored again
            left = list(backend._client.scan_iter(match=f"{name}:c:*"))
            manifest = read_manifest(backend._client.get(name))
            assert manifest is not None and len(left) == manifest["n"]  # old chunks dropped
            return [first, second, third, await blob(100)]
        finally:
            await backend.aclose()

    results, _threaded = run(main)
    assert results == [bytes(range(256)) * 100] * 4
    assert calls == [100, 100]
    assert blob.cache_info().errors == 0


def test_concurrent_tasks_and_event_loops_compute_once(backend: RedisBackend) -> None:
    """Tasks of one loop wait for each other in-process; two loops in two threads (as two
    processes would) meet at the Redis lock, taken and polled with redis.asyncio."""
    calls: list[int] = []

    @arrowstash.cache(backend=backend, l1=False, lock_timeout=10)
    async def slow(x: int) -> int:
        calls.append(x)
        await asyncio.sleep(0.3)
        return x * 2

    results: list[Any] = []
    threaded: list[str] = []

    def one_loop() -> None:
        async def main() -> list[int]:
            try:
                return list(await asyncio.gather(*(slow(21) for _ in range(5))))
            finally:
                await backend.aclose()

        got, ran = run(main)
        results.extend(got)
        threaded.extend(ran)

    threads = [threading.Thread(target=one_loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42] * 10
    assert calls == [21]
    assert "take_lock" not in " ".join(threaded) and "Core.locked" not in " ".join(threaded)


def test_a_dead_server_never_raises_and_caching_resumes(
        redis_factory: Callable[..., RedisServer], unique_prefix: str) -> None:
    server = redis_factory()
    backend = RedisBackend(server.url, prefix=unique_prefix, socket_timeout=0.3,
                           connect_timeout=0.3, breaker_failures=2, breaker_cooldown=0.2)
    calls: list[int] = []

    @arrowstash.cache(backend=backend, l1=False)
    async def f(x: int) -> int:
        calls.append(x)
        return x + 1

    async def phase(xs: list[int]) -> list[int]:
        try:
            return [await f(x) for x in xs]
        finally:
            await backend.aclose()

    assert run(lambda: phase([1, 1]))[0] == [2, 2]
    assert calls == [1]
    server.kill()
    assert run(lambda: phase([1, 2, 3, 1]))[0] == [2, 3, 4, 2]  # computed, never raised
    assert f.cache_info().errors > 0
    assert backend.breaker.state in ("open", "half-open")
    server.restart()
    time.sleep(0.3)  # past the breaker's cool-down: the next call probes the server
    calls.clear()
    assert run(lambda: phase([5, 5, 5]))[0] == [6, 6, 6]
    assert calls == [5]  # stored by the first call, hits after: caching resumed
    assert backend.breaker.state == "closed"
    backend.close()


def test_a_backend_made_from_a_client_object_runs_it_in_a_thread(
        redis_server: RedisServer, unique_prefix: str) -> None:
    import redis

    backend = RedisBackend(redis.Redis.from_url(redis_server.url), prefix=unique_prefix)

    @arrowstash.cache(backend=backend, l1=False)
    async def f(x: int) -> int:
        return -x

    async def main() -> list[int]:
        return [await f(7), await f(7)]

    results, threaded = run(main)
    assert results == [-7, -7] and f.cache_info().hits == 1
    assert "RedisBackend._run" in threaded  # no async twin known for a foreign client
    backend.close()
