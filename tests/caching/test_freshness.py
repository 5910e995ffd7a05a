"""stale_ttl= and refresh_ahead=: stale hits answered at once and refreshed in the background,
once per key, on every backend, sync and async; failed refreshes keep the stale value."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arrowstash import Backend, FileBackend, cache
from arrowstash.entry.format import parse_entry

TTL = 0.5  # short (every test waits it out once or twice), yet longer than a loaded machine's
# pauses: a refreshed value must still be fresh when the test looks at it
WAIT = 10.0  # the most a background refresh may take on a loaded machine


def eventually(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "the background refresh never landed"
        time.sleep(0.01)


class Body:
    """A function body that counts its runs; runs after the first wait for ``gate``, so a
    caller that got an answer while one was running cannot have waited for it."""

    def __init__(self, fail: bool = False) -> None:
        self.runs = 0
        self.gate = threading.Event()
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, x: int) -> dict[str, int]:
        with self._lock:
            self.runs += 1
            run = self.runs
        if run > 1:
            assert self.gate.wait(WAIT)
            if self.fail:
                raise RuntimeError("the source is down")
        return {"x": x, "run": run}


@pytest.mark.parametrize("options", [{"stale_ttl": 1}, {"refresh_ahead": 0.5},
                                     {"stale_ttl": -1, "ttl": 1}, {"refresh_ahead": 1.0, "ttl": 1},
                                     {"refresh_ahead": True, "ttl": 1}])
def test_options_are_checked(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"stale_ttl|refresh_ahead"):
        cache(backend=None, **options)(lambda x: x)


def test_entry_lives_ttl_plus_stale_ttl(file_backend: FileBackend) -> None:
    @cache(backend=file_backend, ttl=100, stale_ttl=50)
    def f(x: int) -> int:
        return x

    f(1)
    header = parse_entry(Path(file_backend.path(f.cache_key(1))).read_bytes()).header
    assert header.expires - header.created == pytest.approx(150)


@pytest.mark.parametrize("l1", [True, False], ids=["l1", "no-l1"])
def test_stale_hit_returns_at_once_and_refreshes_once(backend: Backend, l1: bool) -> None:
    body = Body()
    f = cache(backend=backend, l1=l1, ttl=TTL, stale_ttl=60)(plain(body))
    assert f(1) == {"x": 1, "run": 1}
    time.sleep(TTL + 0.05)
    for _ in range(3):  # stale: served while the refresh waits at its gate; one refresh only
        assert f(1) == {"x": 1, "run": 1}
    eventually(lambda: body.runs == 2)
    body.gate.set()
    eventually(lambda: f(1) == {"x": 1, "run": 2})
    assert body.runs == 2
    info = f.cache_info()
    assert info.misses == 1 and info.errors == 0
    assert f._core.stats.refreshes == 1  # type: ignore[attr-defined]


def test_refreshes_are_exported_as_metrics(file_backend: FileBackend) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from arrowstash import metrics

    registry = prometheus_client.CollectorRegistry()
    metrics.enable(registry)
    try:
        body = Body(fail=True)
        body.gate.set()
        f = cache(backend=file_backend, ttl=TTL, stale_ttl=60, namespace="swr")(plain(body))
        f(1)
        time.sleep(TTL + 0.05)
        f(1)
        labels = {"namespace": "swr", "function": f._core.name,  # type: ignore[attr-defined]
                  "backend": "FileBackend"}
        eventually(lambda: registry.get_sample_value(
            "arrowstash_errors_total", {**labels, "kind": "refresh"}) == 1)
        assert registry.get_sample_value("arrowstash_refreshes_total", labels) == 0
        body.fail = False
        eventually(lambda: f(1)["run"] == 3)
        assert registry.get_sample_value("arrowstash_refreshes_total", labels) == 1
    finally:
        metrics.disable()


def test_l1_only_function_serves_stale_values_too() -> None:
    body = Body()
    f = cache(backend=None, ttl=TTL, stale_ttl=60)(plain(body))
    f(1)
    time.sleep(TTL + 0.05)
    assert f(1)["run"] == 1
    body.gate.set()
    eventually(lambda: f(1)["run"] == 2)


def test_the_fast_l1_index_is_left_empty() -> None:
    """Functions with stale_ttl never take the fast L1 path, so they must not fill its index."""
    body = Body()
    f = cache(backend=None, ttl=60, stale_ttl=60)(plain(body))
    assert f(1) == f(1)
    assert f._core.l1.fast == {}  # type: ignore[attr-defined]
    g = cache(backend=None, ttl=60)(plain(Body()))
    g(1)
    assert list(g._core.l1.fast) == [(1,)]  # type: ignore[attr-defined]


def test_past_the_stale_spell_a_call_computes(file_backend: FileBackend) -> None:
    body = Body()
    body.gate.set()
    f = cache(backend=file_backend, ttl=0.1, stale_ttl=0.2)(plain(body))
    f(1)
    time.sleep(0.35)
    assert f(1)["run"] == 2  # a plain miss: the caller waited for it
    assert f.cache_info().misses == 2


def test_refresh_ahead_refreshes_before_expiry(file_backend: FileBackend) -> None:
    body = Body()
    f = cache(backend=file_backend, ttl=50, refresh_ahead=0.01)(plain(body))  # due after 0.5 s
    f(1)
    assert f(1)["run"] == 1 and body.runs == 1  # not due yet
    time.sleep(0.55)
    assert f(1)["run"] == 1
    body.gate.set()
    eventually(lambda: f(1)["run"] == 2)
    header = parse_entry(Path(file_backend.path(f.cache_key(1))).read_bytes()).header
    assert header.expires - header.created == pytest.approx(50)  # no stale spell asked for


def test_failed_refresh_keeps_the_stale_value_and_is_logged(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    body = Body(fail=True)
    body.gate.set()
    f = cache(backend=file_backend, ttl=TTL, stale_ttl=60)(plain(body))
    f(1)
    time.sleep(TTL + 0.05)
    with caplog.at_level(logging.WARNING, logger="arrowstash.cache"):
        assert f(1)["run"] == 1  # no exception reaches the caller
        eventually(lambda: any(getattr(r, "event", "") == "refresh" for r in caplog.records))
        [record] = [r for r in caplog.records if getattr(r, "event", "") == "refresh"]
    assert f.cache_info().errors == 1  # counted before it is logged
    assert record.error == "RuntimeError" and "stale value stays" in record.getMessage()
    assert f._core.stats.error_kinds == {"refresh": 1}  # type: ignore[attr-defined]
    eventually(lambda: f._core.freshness._claimed == set())  # type: ignore[attr-defined]
    body.fail = False
    f(1)  # the next stale hit tries again
    eventually(lambda: f(1)["run"] == 3)


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=pytest.mark.redis)])
def test_one_refresh_across_caches_sharing_the_backend(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Two cached functions of one name over one backend stand for two processes: each has its
    own in-process claim, so only the backend's lock keeps their refreshes from doubling."""
    backend = request.getfixturevalue(f"{kind}_backend")
    body = Body()
    record = plain(body)
    ttl = 1.0  # the second refresh waits for the lock, then must find the entry still fresh
    shells = [cache(backend=backend, l1=False, ttl=ttl, stale_ttl=60)(record) for _ in range(2)]
    shells[0](1)
    time.sleep(ttl + 0.05)
    assert [f(1)["run"] for f in shells] == [1, 1]  # both stale hits, both start a refresh
    eventually(lambda: body.runs == 2)
    time.sleep(0.2)  # the second refresh is waiting for the lock
    body.gate.set()
    eventually(lambda: all(f(1)["run"] == 2 for f in shells))
    time.sleep(0.2)
    assert body.runs == 2  # the second refresh found the entry fresh
    assert sum(f._core.stats.refreshes for f in shells) == 1  # type: ignore[attr-defined]


def plain(body: Body) -> Callable[[int], dict[str, int]]:
    def record(x: int) -> dict[str, int]:
        return body(x)

    return record


class AsyncBody:
    def __init__(self) -> None:
        self.runs = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, x: int) -> dict[str, int]:
        self.runs += 1
        run = self.runs
        if run > 1:
            assert self.gate is not None
            await asyncio.wait_for(self.gate.wait(), WAIT)
        return {"x": x, "run": run}

    def fn(self) -> Callable[[int], Any]:
        async def record(x: int) -> dict[str, int]:
            return await self(x)

        return record


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=pytest.mark.redis)])
@pytest.mark.parametrize("l1", [True, False], ids=["l1", "no-l1"])
def test_async_stale_hit_refreshes_in_a_task(
    kind: str, l1: bool, request: pytest.FixtureRequest
) -> None:
    backend = request.getfixturevalue(f"{kind}_backend")
    body = AsyncBody()
    f = cache(backend=backend, l1=l1, ttl=TTL, stale_ttl=60)(body.fn())

    async def main() -> None:
        body.gate = asyncio.Event()
        assert (await f(1))["run"] == 1
        await asyncio.sleep(TTL + 0.05)
        results = await asyncio.gather(*(f(1) for _ in range(5)))
        assert [r["run"] for r in results] == [1] * 5  # answered while the refresh waits
        for _ in range(100):
            await asyncio.sleep(0.01)
            if body.runs == 2:
                break
        body.gate.set()
        for _ in range(int(WAIT * 100)):
            if (await f(1))["run"] == 2:
                break
            await asyncio.sleep(0.01)
        assert (await f(1))["run"] == 2

    asyncio.run(main())
    assert body.runs == 2
    assert f._core.stats.refreshes == 1  # type: ignore[attr-defined]


def test_backend_serves_concurrent_threads(backend: Backend) -> None:
    """Background refreshes and async functions' worker threads share one backend object."""
    from concurrent.futures import ThreadPoolExecutor

    @cache(backend=backend, l1=False)
    def f(x: int) -> bytes:
        return str(x).encode() * 50

    def hammer(start: int) -> list[bool]:
        return [f(x) == str(x).encode() * 50 for x in range(start, start + 40) for _ in (0, 1)]

    with ThreadPoolExecutor(8) as pool:
        results = [ok for batch in pool.map(hammer, range(0, 320, 40)) for ok in batch]
    assert all(results) and len(results) == 640
    assert f.cache_info().errors == 0


REFRESH_WORKER = '''
import os, sys, time
from pathlib import Path
from arrowstash import FileBackend, cache

folder, runs, start, mode = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]

@cache(backend=FileBackend(folder), ttl={ttl}, stale_ttl=60)
def rate(x):
    (runs / str(os.getpid())).touch()
    if sys.argv[4] == "refresh":  # not the global `mode`: its value is part of the key
        time.sleep(0.3)  # slow: the other process's refresh comes while this one runs
    return os.getpid()

if mode == "fill":
    rate(1)
    sys.exit(0)
while not start.exists():
    time.sleep(0.001)
first = rate(1)  # stale: answered at once
deadline = time.monotonic() + 30
while rate(1) == first and time.monotonic() < deadline:
    time.sleep(0.01)
print(first, rate(1))
'''


@pytest.mark.slow
def test_one_refresh_across_processes(tmp_path: Path) -> None:
    import subprocess
    import sys

    runs, start = tmp_path / "runs", tmp_path / "start"
    runs.mkdir()
    ttl = 2.0  # long enough that the entry a refresh stores is still fresh when the other
    # process gets the lock and looks, on a loaded machine
    script = REFRESH_WORKER.format(ttl=ttl)
    argv = [sys.executable, "-c", script, str(tmp_path / "cache"), str(runs), str(start)]
    subprocess.run([*argv, "fill"], check=True, timeout=60)
    filler = int(next(runs.iterdir()).name)
    time.sleep(ttl + 0.05)
    procs = [subprocess.Popen([*argv, "refresh"], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(0.5)  # both interpreters started and waiting on the start file
    start.touch()
    outputs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    refreshers = {int(name.name) for name in runs.iterdir()} - {filler}
    assert len(refreshers) == 1  # one refresh between the two processes
    [refresher] = refreshers
    assert [[int(v) for v in out] for out in outputs] == [[filler, refresher]] * 2
