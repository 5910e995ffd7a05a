"""A dead (killed) or hung (SIGSTOP) master of a real 3-master Redis Cluster, mid-run, with two
threads calling: each call stays within the documented timeouts (connect 0.5 s + command 1.0 s),
that master's breaker opens after a few failures (its keys then miss at once) while the live
masters' keys keep hitting, and no call sees an exception or a wrong value."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import arrowstash
from arrowstash.backends.redis import RedisBackend
from servers import RedisClusterServers, require_module

pytestmark = pytest.mark.redis

#: connect 0.5 s + command 1.0 s, and scheduling slack on a shared machine
CALL_BOUND = 1.5 + 0.4
KEYS = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A cluster of our own (to kill a master of), serving the slots it still has."""
    require_module("redis", "redis")
    servers = RedisClusterServers(tmp_path).start()
    try:
        for node in servers.nodes:
            node.cli("config", "set", "cluster-require-full-coverage", "no")
        yield servers
    finally:
        servers.stop()


def run_through_outage(cluster: RedisClusterServers, how: str, prefix: str,
                       calls_per_thread: int = 300) -> dict[str, Any]:
    """Two threads call a cached function over KEYS keys; a master dies after 0.5 s. Returns
    latencies after the outage began, wrong values, exceptions and the backend."""
    backend = RedisBackend(cluster.url, prefix=prefix, breaker_cooldown=2.0)
    lock = threading.Lock()

    @arrowstash.cache(backend=backend, l1=False, lock=False)
    def square(x: int) -> int:
        return x * x

    for x in range(KEYS):
        square(x)
    victim = cluster.nodes[1]
    dead_node = victim.address
    outage = [float("inf")]
    after: list[tuple[float, int]] = []
    wrong: list[tuple[int, Any]] = []
    escaped: list[str] = []

    def worker(offset: int) -> None:
        for i in range(calls_per_thread):
            x = (7 * i + offset) % KEYS
            started = time.monotonic()
            try:
                value = square(x)
            except Exception as exc:  # reported by the test
                with lock:
                    escaped.append(repr(exc))
                continue
            took = time.monotonic() - started
            with lock:
                if value != x * x:
                    wrong.append((x, value))
                if started >= outage[0]:
                    after.append((took, x))
            time.sleep(0.004)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    outage[0] = time.monotonic()
    hits_before = square.cache_info().hits
    victim.kill() if how == "kill" else victim.pause()
    for thread in threads:
        thread.join()
    return {"after": after, "wrong": wrong, "escaped": escaped, "backend": backend,
            "dead": dead_node,
            "hits_after": square.cache_info().hits - hits_before, "info": square.cache_info()}


@pytest.mark.parametrize("how", ["kill", "pause"])
def test_a_dead_master_costs_once_then_fast_misses(cluster: RedisClusterServers, how: str,
                                                   unique_prefix: str) -> None:
    result = run_through_outage(cluster, how, unique_prefix)
    backend: RedisBackend = result["backend"]
    assert result["escaped"] == [] and result["wrong"] == []
    latencies = [took for took, _ in result["after"]]
    assert len(latencies) > 300
    assert max(latencies) < CALL_BOUND, max(latencies)
    slow = [took for took in latencies if took > 0.25]
    # a killed master refuses at once; a hung one costs a timeout per call until its breaker
    # opens (5 failures, one more racing from the other thread), then one probe per cool-down
    assert len(slow) <= 5 + 1 + 2, slow
    assert backend.breaker.open_nodes() == [result["dead"]]
    assert result["hits_after"] > 200  # the live masters' keys kept hitting
    assert result["info"].errors >= 5
