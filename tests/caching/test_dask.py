"""Cached functions as tasks of a real Dask cluster: a ``distributed.LocalCluster`` of two worker
processes (one thread each) sharing one object store (the moto server), one Redis server or one
folder.

For each key the body runs once across the cluster (the stampede lock is an object in the
store), every task gets an equal value, what the workers stored is a hit in the client, and a
worker killed in the middle of a task leaves no lock behind once its lease is over."""

from __future__ import annotations

import os
import pickle
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arrowstash import FileBackend, cache
from servers import require_module

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    require_module("distributed", "s3")
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=40)
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _counted(runs: Path, seconds: float) -> Callable[[int], np.ndarray]:
    """A slow body that appends a line to ``runs`` each time it really runs (in any process)."""

    def body(n: int) -> np.ndarray:
        with open(runs, "a") as log:
            log.write(f"{n} {os.getpid()}\n")
        time.sleep(seconds)
        return np.arange(n * 1000, dtype=np.int64)

    return body


def _runs(runs: Path) -> list[int]:
    return sorted(int(line.split()[0]) for line in runs.read_text().splitlines()) \
        if runs.exists() else []


def _check_cluster(client: Any, cached: Any, runs: Path) -> None:
    keys = [1, 2, 3] * 4  # twelve tasks, four per key, on two worker processes
    futures = client.map(cached, keys, pure=False)
    results = client.gather(futures)
    pids = {int(line.split()[1]) for line in runs.read_text().splitlines()}
    assert os.getpid() not in pids  # the bodies ran on the workers
    assert _runs(runs) == [1, 2, 3]  # once per key across the cluster
    for n, value in zip(keys, results, strict=True):
        np.testing.assert_array_equal(value, np.arange(n * 1000, dtype=np.int64))
    before = cached.cache_info()
    np.testing.assert_array_equal(cached(2), np.arange(2000, dtype=np.int64))
    assert cached.cache_info().hits == before.hits + 1  # stored by a worker, a hit here
    assert _runs(runs) == [1, 2, 3]


def test_object_store_shared_by_worker_processes(dask_client: Any, s3_backend: Any,
                                                 tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cached = cache(backend=s3_backend, lock_timeout=30)(_counted(runs, 0.5))
    started = time.monotonic()
    _check_cluster(dask_client, cached, runs)
    assert time.monotonic() - started < 60


def test_file_backend_on_a_shared_folder(dask_client: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cached = cache(backend=FileBackend(tmp_path / "cache"), lock_timeout=30)(
        _counted(runs, 0.5))
    _check_cluster(dask_client, cached, runs)


@pytest.mark.redis
def test_redis_shared_by_worker_processes(dask_client: Any, redis_backend: Any,
                                          tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cached = cache(backend=redis_backend, lock_timeout=30)(_counted(runs, 0.5))
    _check_cluster(dask_client, cached, runs)


@pytest.mark.redis
def test_a_redis_backend_pickles_as_its_url_and_options(redis_server: Any) -> None:
    import redis

    from arrowstash.backends.redis import RedisBackend

    backend = RedisBackend(redis_server.url, prefix="pickled", chunk_bytes=4096)
    twin = pickle.loads(pickle.dumps(backend))
    assert twin is not backend and twin.url == backend.url
    assert (twin.prefix, twin.chunk_bytes) == ("pickled", 4096)
    with pytest.raises(TypeError, match="made from a client object cannot be pickled"):
        pickle.dumps(RedisBackend(redis.Redis.from_url(redis_server.url)))


def test_a_cached_function_travels_with_its_backend_url(s3_backend: Any, tmp_path: Path) -> None:
    import cloudpickle

    cached = cache(backend=s3_backend)(_counted(tmp_path / "runs", 0.0))
    cached(4)
    data = cloudpickle.dumps(cached)
    assert b"test-secret-key" not in pickle.dumps(s3_backend.url)
    twin = pickle.loads(data)
    assert twin is not cached and twin._core.backend.url == s3_backend.url
    np.testing.assert_array_equal(twin(4), np.arange(4000, dtype=np.int64))
    assert twin.cache_info().hits == 1 and _runs(tmp_path / "runs") == [4]


@cache(backend=None)
def _module_level(n: int) -> int:
    return n + 1


def test_a_module_level_cached_function_pickles_by_name() -> None:
    assert pickle.loads(pickle.dumps(_module_level)) is _module_level


def test_a_worker_killed_mid_task_leaves_no_lock_past_its_lease(dask_client: Any,
                                                                 s3_backend: Any,
                                                                 tmp_path: Path) -> None:
    """The first run takes the lock object, then its worker process dies; Dask runs the task
    again on a live worker, which waits out the dead owner's lease, takes the lock over and
    releases it (a waiter that merely timed out would leave the dead owner's lock behind)."""
    import obstore

    runs = tmp_path / "runs"

    def dies_once(n: int) -> np.ndarray:
        first = not runs.exists()
        with open(runs, "a") as log:
            log.write(f"{n} {os.getpid()}\n")
        if first:
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)
        return np.arange(n)

    cached = cache(backend=s3_backend, lock_timeout=3)(dies_once)
    value = dask_client.submit(cached, 5, pure=False).result(timeout=120)
    np.testing.assert_array_equal(value, np.arange(5))
    pids = [line.split()[1] for line in runs.read_text().splitlines()]
    assert len(pids) == 2 and pids[0] != pids[1]
    objects = [meta["path"] for chunk in obstore.list(s3_backend._store) for meta in chunk]
    assert [path for path in objects if path.endswith(".lock")] == []
    assert [path for path in objects if path.endswith(".ast")] != []
