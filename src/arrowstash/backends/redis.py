"""Redis, standalone or Cluster, through redis-py.

An entry is one string value under ``arrowstash:<namespace>:<function>:{<digest>}``; the braces
are a Cluster hash tag, so an entry, its chunks and its lock always live in one slot. Entries
larger than ``chunk_bytes`` are written as chunks under a fresh version id, then a small manifest
replaces the value in one command: a reader sees the old entry or the new one, and a missing
chunk is a miss.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from arrowstash.backends._breaker import Breaker
from arrowstash.backends._chunks import MANIFEST, chunk_names, join, pack_manifest, read_manifest
from arrowstash.backends.base import EntryInfo, Held, Stored, describe, take_lock
from arrowstash.entry import ALIGN, Encoded, Key, entry_bytes, read_header
from arrowstash.errors import BackendError, CorruptEntryError


def _redis() -> Any:
    """redis-py, imported when a backend is made (it is an extra)."""
    try:
        import redis
        import redis.cluster
    except ImportError as exc:
        raise ImportError("RedisBackend needs redis-py: pip install 'arrowstash[redis]'") from exc
    return redis

# Set a key and hand back the value it replaces if (and only if) that was a chunk manifest, so
# the old chunks can be deleted without ever transferring a large old value.
_SWAP = """
local old = redis.call('GET', KEYS[1])
if ARGV[2] == '' then redis.call('DEL', KEYS[1])
elseif ARGV[1] == '' then redis.call('SET', KEYS[1], ARGV[2])
else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1]) end
if old and string.sub(old, 1, 9) == ARGV[3] then return old end
return false
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


#: What ``arrowstash info`` shows of the server: our name -> the INFO field.
_SERVER_COUNTERS = {"hits": "keyspace_hits", "misses": "keyspace_misses",
                    "evicted": "evicted_keys", "expired": "expired_keys",
                    "memory": "used_memory"}


def _part(name: str) -> str:
    """A key component that cannot be confused with the separators or the hash tag."""
    return (name.replace("%", "%25").replace(":", "%3A").replace("{", "%7B")
            .replace("}", "%7D"))


def _glob(text: str) -> str:
    for special in "\\*?[]":
        text = text.replace(special, "\\" + special)
    return text


class RedisBackend:
    """``RedisBackend("redis://host:6379/0")``, ``"rediss://..."``, ``"unix:///path?db=0"``,
    ``"redis+cluster://h1:p1,h2:p2"``, or a ready ``redis.Redis``/``RedisCluster`` client.

    Timeouts are short by default: a slow or absent server must cost a call little. After
    ``breaker_failures`` consecutive failures the backend is skipped for ``breaker_cooldown``
    seconds, then probed again. ``encrypt=True`` makes every cached function using this backend
    encrypt its entries (docs/encryption.md).
    """

    shared = True
    #: Frames cross the network: compress them.
    arrow_compression: str | None = "zstd"

    def __init__(
        self,
        url_or_client: str | Any = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "arrowstash",
        chunk_bytes: int = 64 << 20,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        breaker_failures: int = 5,
        breaker_cooldown: float = 5.0,
        encrypt: bool = False,
    ) -> None:
        if chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be at least 1024, not {chunk_bytes!r}")
        redis = _redis()
        self._errors = (redis.RedisError, OSError)
        if isinstance(url_or_client, str):
            self.url = url_or_client
            self._client = _connect(url_or_client, socket_timeout, connect_timeout)
        else:
            self.url = repr(url_or_client)
            self._client = url_or_client
        self.cluster = isinstance(self._client, redis.cluster.RedisCluster)
        self.prefix = _part(prefix)
        self.chunk_bytes = chunk_bytes
        self.encrypt = encrypt
        self.breaker = Breaker(breaker_failures, breaker_cooldown)
        self._swap = self._client.register_script(_SWAP)
        self._release = self._client.register_script(_RELEASE)

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r})"

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        """The boundary: every redis-py error becomes a BackendError, and feeds the breaker."""
        self.breaker.before(f"redis {what}")
        try:
            yield
        except self._errors as exc:
            self.breaker.failure()
            raise BackendError(f"redis {what} failed: {exc}") from exc
        except BaseException:
            self.breaker.success()  # the server answered; what it said was wrong
            raise
        self.breaker.success()

    def _name(self, key: Key) -> str:
        return f"{self.prefix}:{_part(key.namespace)}:{_part(key.function)}:{{{key.hex}}}"

    def get(self, key: Key) -> Stored | None:
        with self._call("get"):
            value = self._client.get(self._name(key))
            if value is None:
                return None
            manifest = read_manifest(value)
            if manifest is None:
                # an entry, or garbage that parsing will report as a corrupt entry
                return Stored(memoryview(value))
            parts = self._client.mget(self._chunk_names(key, manifest))
        if any(part is None for part in parts):
            return None  # a chunk expired or was evicted: the entry is gone
        data = join(parts, manifest["size"])
        return Stored(memoryview(data)) if data is not None else None

    def _chunk_names(self, key: Key, manifest: dict[str, Any]) -> list[str]:
        return chunk_names(self._name(key), manifest)

    def set(self, key: Key, encoded: Encoded, *, created: float, expires: float | None) -> int:
        data = memoryview(entry_bytes(key, encoded, created=created, expires=expires))
        px = ""
        if expires:
            px_ms = int((expires - time.time()) * 1000)
            if px_ms <= 0:
                return 0  # expired before it could be stored
            px = str(px_ms)
        name = self._name(key)
        with self._call("set"):
            if data.nbytes <= self.chunk_bytes:
                old = self._swap(keys=[name], args=[px, data.tobytes(), MANIFEST])
            else:
                manifest = self._write_chunks(key, data, px)
                old = self._swap(keys=[name], args=[px, manifest, MANIFEST])
            self._drop_chunks(key, old)
        return data.nbytes

    def _write_chunks(self, key: Key, data: memoryview, px: str) -> bytes:
        version = secrets.token_hex(8)
        count = -(-data.nbytes // self.chunk_bytes)
        manifest = {"v": version, "n": count, "size": data.nbytes}
        pipe = self._client.pipeline(transaction=False)
        for i, name in enumerate(self._chunk_names(key, manifest)):
            chunk = data[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]
            pipe.set(name, chunk.tobytes(), px=int(px) if px else None)
        pipe.execute()
        header = read_header(data)
        manifest["head"] = data[:ALIGN].tobytes()
        manifest["tail"] = data[header.trailer_at :].tobytes()
        return pack_manifest(manifest)

    def _drop_chunks(self, key: Key, old: bytes | None) -> None:
        """Delete the chunks of a manifest that was just replaced or deleted."""
        manifest = read_manifest(old) if old else None
        if manifest is not None:
            self._unlink(self._chunk_names(key, manifest))

    def delete(self, key: Key) -> bool:
        name = self._name(key)
        with self._call("delete"):
            existed = bool(self._client.exists(name))
            old = self._swap(keys=[name], args=["", "", MANIFEST])
            self._drop_chunks(key, old)
        return existed

    def _unlink(self, names: list[str]) -> None:
        if not names:
            return
        if self.cluster:  # keys of several slots: one command each, in one pipeline
            pipe = self._client.pipeline()
            for name in names:
                pipe.unlink(name)
            pipe.execute()
        else:
            self._client.unlink(*names)

    def _pattern(self, namespace: str | None, function: str | None) -> str:
        if namespace is None:
            if function is not None:
                raise ValueError("clear(function=...) needs the namespace too")
            return f"{_glob(self.prefix)}:*"
        pattern = f"{_glob(self.prefix)}:{_glob(_part(namespace))}:"
        if function is not None:
            pattern += f"{_glob(_part(function))}:"
        return pattern + "*"

    def _keys(self, namespace: str | None, function: str | None = None) -> Iterator[str]:
        for name in self._client.scan_iter(match=self._pattern(namespace, function), count=1000):
            yield name.decode() if isinstance(name, bytes) else name

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        """SCAN and UNLINK our keys (never FLUSHDB): entries, chunks and locks."""
        removed = 0
        with self._call("clear"):
            batch: list[str] = []
            for name in self._keys(namespace, function):
                batch.append(name)
                removed += name.endswith("}")
                if len(batch) >= 500:
                    self._unlink(batch)
                    batch = []
            self._unlink(batch)
        return removed

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        with self._call("list"):
            names = [n for n in self._keys(namespace) if n.endswith("}")]
        for name in names:
            try:
                with self._call("read header"):
                    head = self._client.getrange(name, 0, ALIGN - 1)
                    if head.startswith(MANIFEST):
                        manifest = read_manifest(self._client.get(name) or b"")
                        if manifest is None:
                            continue
                        head, tail, size = manifest["head"], manifest["tail"], manifest["size"]
                    else:
                        size = self._client.strlen(name)
                        tail = self._client.getrange(name, read_header(head, size).trailer_at, -1)
                yield describe(head, tail, size, f"redis:{name}")
            except (BackendError, CorruptEntryError, KeyError, TypeError):
                continue

    def stats(self) -> dict[str, Any]:
        entries = list(self.entries())
        return {"backend": "redis", "url": self.url, "cluster": self.cluster,
                "entries": len(entries), "bytes": sum(e.size for e in entries),
                "breaker": self.breaker.state, "server": self._server_counters()}

    def _server_counters(self) -> dict[str, int]:
        """The server's own counters (of every client, not only ours), summed over nodes."""
        with self._call("info"):
            if self.cluster:  # one answer per primary
                nodes = list(self._client.info(target_nodes=self._client.PRIMARIES).values())
            else:
                nodes = [self._client.info()]
        return {name: sum(int(node.get(field, 0)) for node in nodes)
                for name, field in _SERVER_COUNTERS.items()}

    @contextlib.contextmanager
    def lock(self, key: Key, timeout: float) -> Iterator[Held]:
        """``SET lock token NX PX``: expires if its owner dies, released only by its owner."""
        name = self._name(key) + ":lock"
        token = secrets.token_hex(16)
        ttl_ms = max(int(timeout * 1000), 1000)

        def attempt() -> bool:
            with self._call("lock"):
                return bool(self._client.set(name, token, nx=True, px=ttl_ms))

        held = take_lock(attempt, timeout)
        if not held:
            yield held
            return
        try:
            yield held
        finally:
            with contextlib.suppress(BackendError), self._call("unlock"):
                self._release(keys=[name], args=[token])

    def close(self) -> None:
        self._client.close()


def _connect(url: str, socket_timeout: float, connect_timeout: float) -> Any:
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout,
    }
    redis = _redis()
    parts = urlsplit(url)
    if parts.scheme == "redis+cluster":
        nodes = []
        for address in parts.netloc.split(","):
            host, _, port = address.rpartition(":")
            nodes.append(redis.cluster.ClusterNode(host or "127.0.0.1", int(port or 6379)))
        return redis.cluster.RedisCluster(startup_nodes=nodes, **options)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"not a Redis URL: {url!r}")
    return redis.Redis.from_url(url, **options)
