"""Network stress (issue 20, "the stress suite we keep"): real Redis, Redis Cluster and Memcached
servers killed (SIGKILL) and paused (SIGSTOP) while threads call cached functions, and a real
Redis whose entries are damaged and forged under the callers. Every call must return the right
value (from the store or recomputed): 0 wrong values, 0 exceptions to the caller, every call
within the documented timeouts (connect 0.5 s + command 1.0 s, plus slack).

Quick by default (a few seconds a scenario, what CI runs); ``ARROWSTASH_STRESS=full`` runs each
scenario for a minute. The module prints one table of what every scenario measured.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import redis

import arrowstash
from _stress_table import print_table
from arrowstash.backends.memcached import MemcachedBackend
from arrowstash.backends.redis import RedisBackend
from arrowstash.entry.format import Key, entry_bytes
from arrowstash.serializers.standard import StandardSerializer
from servers import MemcachedServer, RedisClusterServers, RedisServer, require_module

pytestmark = pytest.mark.slow

FULL = os.environ.get("ARROWSTASH_STRESS") == "full"
SECONDS = 60.0 if FULL else 4.0
THREADS = 3
KEYS = 40
CALL_BOUND = 1.5 + 0.5  # the documented timeouts, and slack for a shared 2-core machine
MANIFEST = b"\x89ASTCHUNK"
ROWS: list[dict[str, Any]] = []


@dataclass
class Tally:
    calls: int = 0
    wrong: list[Any] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def expected(x: int) -> Any:
    """The value of key ``x``: small dicts, and every fifth an array that is chunked on Redis."""
    if x % 5 == 0:
        return np.full(40_000 + x, float(x))
    return {"x": x, "square": x * x, "text": f"value {x}" * (x % 7)}


def same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and np.array_equal(got, want)
    return bool(got == want)


def hammer(fn: Callable[[int], Any], stop: threading.Event, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        x = rng.randrange(KEYS)
        started = time.monotonic()
        try:
            got = fn(x)
        except Exception as exc:  # counted: the test requires none
            with tally.lock:
                tally.escaped.append(repr(exc))
            continue
        took = time.monotonic() - started
        ok = same(got, expected(x))
        with tally.lock:
            tally.calls += 1
            tally.latencies.append(took)
            if not ok:
                tally.wrong.append((x, repr(got)[:80]))
        time.sleep(0.002)


def run(name: str, backend: Any, events: list[tuple[float, Callable[[], None]]],
        **options: Any) -> Tally:
    """Call a cached function from THREADS threads for SECONDS, running ``events`` (at their
    offsets, repeated over the run) meanwhile; record and check a row of the table."""

    @arrowstash.cache(backend=backend, l1=False, **options)
    def compute(x: int) -> Any:
        return expected(x)

    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=hammer, args=(compute, stop, tally, seed))
               for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    try:
        period = max(at for at, _ in events) + 0.5 if events else SECONDS
        while time.monotonic() - started < SECONDS:
            cycle = time.monotonic()
            for at, action in events:
                time.sleep(max(0.0, cycle + at - time.monotonic()))
                action()
            time.sleep(max(0.0, cycle + period - time.monotonic()))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    info = compute.cache_info()
    latencies = sorted(tally.latencies) or [0.0]
    ROWS.append({"scenario": name, "calls": tally.calls, "hits": info.hits,
                 "errors": info.errors, "wrong": len(tally.wrong),
                 "exceptions": len(tally.escaped),
                 "p99 ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
                 "slowest ms": 1000 * latencies[-1]})
    assert tally.wrong == [], tally.wrong[:5]
    assert tally.escaped == [], tally.escaped[:5]
    assert tally.calls > 50
    assert latencies[-1] < CALL_BOUND, latencies[-5:]
    return tally


@pytest.fixture(scope="module", autouse=True)
def table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_table(request, ["scenario", "calls", "hits", "errors", "wrong", "exceptions", "p99 ms",
               "slowest ms"], ROWS, digits=0)


def _outage(server: Any) -> list[tuple[float, Callable[[], None]]]:
    """Kill, and restart 0.8 s later; then pause for 1.5 s (past the command timeout)."""
    return [(0.3, server.kill), (1.1, server.restart), (1.9, server.pause),
            (3.4, server.resume)]


@pytest.mark.redis
def test_redis_killed_and_paused(tmp_path: Path) -> None:
    require_module("redis", "redis")
    server = RedisServer(tmp_path / "redis").start()
    try:
        backend = RedisBackend(server.url, chunk_bytes=64 << 10, breaker_cooldown=0.3)
        run("redis: killed, restarted, paused", backend, _outage(server))
        run("redis: killed, paused, secret", backend, _outage(server), secret=b"stress")
    finally:
        server.stop()


@pytest.mark.memcached
def test_memcached_killed_and_paused(tmp_path: Path) -> None:
    require_module("pymemcache", "memcached")
    server = MemcachedServer(tmp_path / "memcached", memory_mb=64).start()
    try:
        backend = MemcachedBackend(server.url, item_bytes=64 << 10, breaker_cooldown=0.3)
        run("memcached: killed, restarted, paused", backend, _outage(server))
    finally:
        server.stop()


@pytest.mark.redis
@pytest.mark.parametrize("how", ["kill", "pause"])
def test_a_cluster_master_lost(tmp_path: Path, how: str) -> None:
    require_module("redis", "redis")
    cluster = RedisClusterServers(tmp_path / "cluster").start()
    try:
        for node in cluster.nodes:
            node.cli("config", "set", "cluster-require-full-coverage", "no")
        backend = RedisBackend(cluster.url, chunk_bytes=64 << 10, breaker_cooldown=1.0)
        victim = cluster.nodes[1]
        lost = [False]

        def lose() -> None:  # once: a killed cluster master does not come back here
            if not lost[0]:
                lost[0] = True
                victim.kill() if how == "kill" else victim.pause()

        run(f"redis cluster: a master {'killed' if how == 'kill' else 'paused'}", backend,
            [(0.5, lose)])
    finally:
        cluster.stop()


def _damaged(raw: bytes, rng: random.Random, key: Any) -> bytes:
    """One damaged or forged version of the stored value ``raw`` of ``key``."""
    kind = rng.randrange(7)
    if kind == 0 and len(raw) > 80:  # a flipped bit
        at = rng.randrange(64, len(raw))
        return raw[:at] + bytes([raw[at] ^ (1 << rng.randrange(8))]) + raw[at + 1 :]
    if kind == 1 and raw:  # truncated
        return raw[: rng.randrange(len(raw))]
    if kind == 2:  # random bytes
        return os.urandom(rng.randrange(1, 4096))
    if kind == 3:  # a manifest declaring a huge entry
        return MANIFEST + msgpack.packb({"v": "00112233aabbccdd", "n": 10**9, "size": 1 << 60})
    if kind == 4:  # a well-formed entry of the wrong value (forged by a writer to the store)
        return bytes(entry_bytes(key, StandardSerializer().encode({"forged": True}),
                                 created=time.time(), expires=None))
    if kind == 5:  # a huge declared size in the header
        out = bytearray(raw[:64].ljust(64, b"\0"))
        struct.pack_into("<Q", out, 16, 1 << 62)
        return bytes(out)
    return b""


@pytest.mark.redis
def test_forged_and_damaged_entries_on_redis(tmp_path: Path) -> None:
    """A writer damages and forges entries under the callers (with a secret set, forged
    well-formed entries must not pass; without one, nothing may crash or hang)."""
    require_module("redis", "redis")
    server = RedisServer(tmp_path / "redis").start()
    client = redis.Redis.from_url(server.url)
    stop = threading.Event()
    try:
        backend = RedisBackend(server.url, prefix="stress")
        function = f"{run.__module__}.{run.__qualname__}.<locals>.compute"  # run()'s function
        rng = random.Random(7)
        planted = [0]

        def vandal() -> None:
            while not stop.is_set():
                names = [n for n in client.scan_iter("stress:*", count=1000)
                         if n.endswith(b"}")]
                for name in rng.sample(names, min(5, len(names))):
                    raw = client.get(name)
                    if raw is not None:
                        digest = name.decode().rsplit("{", 1)[1].rstrip("}")
                        key = Key("default", function, bytes.fromhex(digest))
                        client.set(name, _damaged(raw, rng, key))
                        planted[0] += 1
                time.sleep(0.01)

        thread = threading.Thread(target=vandal)
        thread.start()
        try:
            tally = run("redis: entries damaged and forged, secret", backend, [],
                        secret=b"stress")
        finally:
            stop.set()
            thread.join()
        assert planted[0] > 20 and tally.calls > planted[0]
        ROWS[-1]["scenario"] += f" ({planted[0]} planted)"
    finally:
        client.close()
        server.stop()
