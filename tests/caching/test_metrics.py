"""Prometheus metrics: names and labels, counts against what the calls did, the metered stages
installed only while enabled, breaker state, and no key material in the exposition."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arrowstash import FileBackend, cache, metrics

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    made = CollectorRegistry()
    metrics.enable(made)
    yield made
    metrics.disable()


def _value(registry: CollectorRegistry, name: str, f: Any, **labels: str) -> float | None:
    core = f._core
    return registry.get_sample_value(name, {
        "namespace": core.namespace, "function": core.name,
        "backend": type(core.backend).__name__ if core.backend is not None else "none",
        **labels,
    })


def test_counts_of_a_file_backed_function(
    registry: CollectorRegistry, file_backend: FileBackend
) -> None:
    @cache(backend=file_backend, l1=False, namespace="prices")
    def f(x: int) -> dict[str, int]:
        return {"x": x}

    f(1)  # miss and store
    f(1)  # backend hit
    f(2)  # miss and store
    Path(file_backend.path(f.cache_key(2))).write_bytes(b"garbage" * 20)
    f(2)  # corrupt entry: a miss, stored again
    size = Path(file_backend.path(f.cache_key(1))).stat().st_size

    def value(name: str, **labels: str) -> float | None:
        return _value(registry, name, f, **labels)

    assert value("arrowstash_hits_total", layer="backend") == 1
    assert value("arrowstash_hits_total", layer="l1") == 0
    assert value("arrowstash_misses_total") == 3
    assert value("arrowstash_stores_total") == 3
    assert value("arrowstash_errors_total", kind="corrupt_entry") == 1
    assert value("arrowstash_read_bytes_total") == size
    assert value("arrowstash_written_bytes_total") == f.cache_info().bytes_stored
    assert value("arrowstash_miss_duration_seconds_count") == 3
    assert value("arrowstash_store_duration_seconds_count") == 3
    assert value("arrowstash_backend_hit_duration_seconds_count") == 1
    assert value("arrowstash_backend_hit_duration_seconds_bucket", le="+Inf") == 1
    assert value("arrowstash_hit_duration_seconds_count") == 1
    miss_sum = value("arrowstash_miss_duration_seconds_sum")
    assert miss_sum is not None and 0 < miss_sum < 10


def test_l1_hits_and_an_async_function(registry: CollectorRegistry) -> None:
    @cache(backend=None)
    def f(x: int) -> list[int]:
        return [x]

    @cache(backend=None)
    async def g(x: int) -> list[int]:
        return [x]

    for _ in range(5):
        f(1)

    async def calls() -> None:
        for _ in range(3):
            await g(1)

    asyncio.run(calls())
    assert _value(registry, "arrowstash_hits_total", f, layer="l1") == 4
    assert _value(registry, "arrowstash_hits_total", g, layer="l1") == 2
    assert _value(registry, "arrowstash_misses_total", g) == 1
    assert _value(registry, "arrowstash_hit_duration_seconds_count", f) == 4
    assert _value(registry, "arrowstash_l1_entries", f) == 1
    assert _value(registry, "arrowstash_stores_total", f) == 1
    assert _value(registry, "arrowstash_written_bytes_total", f) == 0  # L1 only


def test_meters_are_attached_only_while_enabled(file_backend: FileBackend) -> None:
    @cache(backend=file_backend)
    def f(x: int) -> int:
        return x

    core: Any = f._core  # type: ignore[attr-defined]
    assert core.observer is None
    made = CollectorRegistry()
    metrics.enable(made)
    try:
        assert metrics.enabled() and isinstance(core.observer, metrics.Meter)

        @cache(backend=None)
        def g(x: int) -> int:  # decorated while enabled: metered from the start
            return x

        g(1)
        assert _value(made, "arrowstash_miss_duration_seconds_count", g) == 1
    finally:
        metrics.disable()
    assert core.observer is None
    assert not metrics.enabled()
    assert b"arrowstash_" not in generate_latest(made)  # unregistered
    f(1)
    assert f.cache_info().misses == 1  # the counters work without an observer


def test_enable_again_moves_the_export(file_backend: FileBackend) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    metrics.enable(first)
    try:
        metrics.enable(second)
        assert b"arrowstash_hits_total" not in generate_latest(first)
        assert b"arrowstash_hits_total" in generate_latest(second)
    finally:
        metrics.disable()


def test_exposition_holds_no_key_or_argument(
    registry: CollectorRegistry, file_backend: FileBackend
) -> None:
    @cache(backend=file_backend)
    def f(card: str) -> str:
        return "VALUE-" + card

    card = "4111-1111-1111-1111"
    f(card)
    f(card)
    text = generate_latest(registry).decode()
    assert f._core.name in text  # type: ignore[attr-defined]
    for secret in (card, "VALUE-", f.cache_key(card).hex, f.cache_key(card).hex[:12]):
        assert secret not in text


@pytest.mark.redis
def test_redis_backend_counts_and_breaker(
    registry: CollectorRegistry, redis_backend: Any, redis_factory: Any
) -> None:
    @cache(backend=redis_backend, l1=False)
    def f(x: int) -> bytes:
        return b"y" * x

    f(1000)
    f(1000)
    assert _value(registry, "arrowstash_hits_total", f, layer="backend") == 1
    read = _value(registry, "arrowstash_read_bytes_total", f)
    assert read is not None and read == _value(registry, "arrowstash_written_bytes_total", f)
    assert read > 1000
    assert _value(registry, "arrowstash_breaker_state", f, state="closed") == 1

    from arrowstash import RedisBackend

    server = redis_factory()
    url = server.url
    server.stop()  # nobody listens there any more
    dead = RedisBackend(url, breaker_failures=2, breaker_cooldown=60, connect_timeout=0.05)

    @cache(backend=dead)
    def g(x: int) -> int:
        return x

    for i in range(4):
        assert g(i) == i
    assert _value(registry, "arrowstash_breaker_state", g, state="open") == 1
    assert _value(registry, "arrowstash_breaker_state", g, state="closed") == 0
    errors = _value(registry, "arrowstash_errors_total", g, kind="backend_read")
    assert errors is not None and errors >= 2
    dead.close()


@pytest.mark.redis
def test_async_function_on_redis_records_store_latency(
    registry: CollectorRegistry, redis_backend: Any
) -> None:
    """The async store awaits the backend's own async write: its latency is observed as the
    sync store's is (it went unrecorded when the metered store was a patched sync method)."""
    assert redis_backend.capabilities.async_io

    @cache(backend=redis_backend, l1=False)
    async def f(x: int) -> bytes:
        return b"z" * x

    async def calls() -> None:
        await f(10)
        await f(10)
        await f(20)

    asyncio.run(calls())
    assert _value(registry, "arrowstash_store_duration_seconds_count", f) == 2
    total = _value(registry, "arrowstash_store_duration_seconds_sum", f)
    assert total is not None and 0 < total < 10
    assert _value(registry, "arrowstash_miss_duration_seconds_count", f) == 2
    assert _value(registry, "arrowstash_backend_hit_duration_seconds_count", f) == 1


def test_missing_client_gives_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'arrowstash\[prometheus\]'"):
        metrics.enable()
    assert not metrics.enabled()
