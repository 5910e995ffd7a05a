"""Redis, standalone or Cluster, through redis-py.

An entry is one string value under ``arrowstash:<namespace>:<function>:{<digest>}``; the braces
are a Cluster hash tag, so an entry, its chunks and its lock always live in one slot. Entries
larger than ``chunk_bytes`` are written as chunks under a fresh version id, then a small manifest
replaces the value in one command: a reader sees the old entry or the new one, and a missing
chunk is a miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

from arrowstash.backends._breaker import Breaker
from arrowstash.backends._chunks import MANIFEST, chunk_names, join, pack_manifest, read_manifest
from arrowstash.backends._urls import Scrubber, redact, split_hosts
from arrowstash.backends.base import Capabilities, Held, Stored, atake_lock, take_lock
from arrowstash.entry.format import ALIGN, EntryWriter, Key, manifest_ends
from arrowstash.entry.listing import EntryInfo, describe, trailer_offset
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


class _Conn(NamedTuple):
    """A client and its registered scripts: sync (redis-py) or async (redis.asyncio)."""

    client: Any
    swap: Any
    release: Any


#: One round trip of an operation: called with a connection, it returns the reply, or on an
#: async connection an awaitable of it.
Step = Callable[[_Conn], Any]
T = TypeVar("T")
#: An operation written once for both clients: a generator of steps, each sent its reply.
Steps = Generator[Step, Any, T]


def _pipelined(client: Any, command: str, calls: list[tuple[Any, ...]],
               **options: Any) -> Any:
    """Queue ``command`` once per argument tuple on a pipeline and execute it (awaitable on an
    async client)."""
    pipe = client.pipeline(transaction=False)
    for args in calls:
        getattr(pipe, command)(*args, **options)
    return pipe.execute()


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

    Timeouts are short by default and a command is retried at most once, after a refused or
    dropped connection (never after a timeout): a slow or absent server must cost a call little.
    After ``breaker_failures`` consecutive failures the server is skipped for
    ``breaker_cooldown`` seconds, then probed again; a Cluster keeps one breaker per master, so
    a dead master costs only the keys it holds. The URL's password never appears in the
    backend's repr, stats or errors (see docs/network-security.md). ``encrypt=True`` makes
    every cached function using this backend encrypt its entries (docs/encryption.md).
    """

    capabilities = Capabilities(shared=True, remote=True, streams_writes=False, maps_reads=False,
                                lists_entries=True, native_ttl=True, async_io=True,
                                breaker=True)

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
        self._errors = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)
        self._timeouts = (socket_timeout, connect_timeout)
        self._from_url = isinstance(url_or_client, str)
        raw = url_or_client if isinstance(url_or_client, str) else repr(url_or_client)
        self._url = raw  # with its password: only ever handed to the client
        self.url = redact(raw)
        scrub = Scrubber(raw)
        self._client: Any = url_or_client
        if self._from_url:
            try:
                self._client = _connect(raw, socket_timeout, connect_timeout)
            except ValueError as exc:  # redis-py's URL parser may quote the URL
                raise ValueError(scrub(str(exc))) from None
        # rebuilt from these in another process (a Dask worker): see __reduce__
        self._made_with = {"prefix": prefix, "chunk_bytes": chunk_bytes,
                           "socket_timeout": socket_timeout, "connect_timeout": connect_timeout,
                           "breaker_failures": breaker_failures,
                           "breaker_cooldown": breaker_cooldown, "encrypt": encrypt}
        self.cluster = isinstance(self._client, redis.cluster.RedisCluster)
        self.prefix = _part(prefix)
        self.chunk_bytes = chunk_bytes
        self.encrypt = encrypt
        self.breaker = Breaker(breaker_failures, breaker_cooldown, scrub)
        self._conn = _Conn(self._client, self._client.register_script(_SWAP),
                           self._client.register_script(_RELEASE))
        # redis.asyncio clients belong to the event loop they first ran on: one per loop
        self._aconns: weakref.WeakKeyDictionary[Any, _Conn] = weakref.WeakKeyDictionary()
        self._opening: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its URL (password included, as in the URL it was given) and options, so
        that a cached function sent to another process (a Dask worker) connects there; a
        backend made from a client object cannot be rebuilt elsewhere."""
        if not self._from_url:
            raise TypeError("a RedisBackend made from a client object cannot be pickled: make "
                            "it from a URL to send it to other processes")
        return (_reopen, (self._url, self._made_with))

    def _call(self, what: str, key: Key | None = None) -> contextlib.AbstractContextManager[None]:
        """The boundary: every redis-py error becomes a BackendError, and feeds the breaker (of
        the master holding ``key``, on a Cluster)."""
        return self._breaker(key).guard(f"redis {what}", self._errors)

    def _breaker(self, key: Key | None) -> Breaker:
        if not self.cluster or key is None:
            return self.breaker
        try:
            client = self._client
            node = client.nodes_manager.get_node_from_slot(client.keyslot(self._name(key)))
        except self._errors:  # no slot map yet: the cluster-wide breaker decides
            return self.breaker
        return self.breaker.node(node.name)

    def _name(self, key: Key) -> str:
        return f"{self.prefix}:{_part(key.namespace)}:{_part(key.function)}:{{{key.hex}}}"

    def get(self, key: Key) -> Stored | None:
        return self._run("get", self._get_steps(key), key)

    async def aget(self, key: Key) -> Stored | None:
        """``get`` on redis.asyncio, for async functions (see :meth:`_aconn`)."""
        return await self._arun("get", self._get_steps(key), key)

    def _get_steps(self, key: Key) -> Steps[Stored | None]:
        name = self._name(key)
        value = yield lambda c: c.client.get(name)
        if value is None:
            return None
        manifest = read_manifest(value)
        if manifest is None:
            # an entry, or garbage that parsing will report as a corrupt entry
            return Stored(memoryview(value))
        names = self._chunk_names(key, manifest)
        parts = yield lambda c: c.client.mget(names)
        if any(part is None for part in parts):
            return None  # a chunk expired or was evicted: the entry is gone
        data = join(parts, manifest["size"])
        return Stored(memoryview(data)) if data is not None else None

    # -- running an operation on either client ------------------------------------------------

    def _run(self, what: str, steps: Steps[T], key: Key | None = None) -> T:
        with self._call(what, key):
            try:
                step = next(steps)
                while True:
                    step = steps.send(step(self._conn))
            except StopIteration as done:
                result: T = done.value
                return result

    async def _arun(self, what: str, steps: Steps[T], key: Key | None = None) -> T:
        conn = self._aconns.get(asyncio.get_running_loop()) or await self._aconn(what)
        if conn is None:  # no URL to open an async client with: the sync one, in a thread
            return await asyncio.to_thread(self._run, what, steps, key)
        with self._call(what, key):
            try:
                step = next(steps)
                while True:
                    step = steps.send(await step(conn))
            except StopIteration as done:
                result: T = done.value
                return result

    async def _aconn(self, what: str) -> _Conn | None:
        """This event loop's redis.asyncio client, made from the backend's URL and timeouts;
        None for a backend made from a client object (its async twin is unknown). A Cluster
        client learns the slot map before any task uses it: tasks racing its first commands
        could otherwise use connections its initialisation closes."""
        if not self._from_url:
            return None
        loop = asyncio.get_running_loop()
        with self._guard:
            opening = self._opening.get(loop)
            if opening is None:
                opening = self._opening[loop] = asyncio.Lock()
        async with opening:
            conn = self._aconns.get(loop)
            if conn is None:
                client = _connect(self._url, *self._timeouts, asynchronous=True)
                if self.cluster:
                    with self._call(what):
                        await client.initialize()
                conn = _Conn(client, client.register_script(_SWAP),
                             client.register_script(_RELEASE))
                self._aconns[loop] = conn
        return conn

    async def aclose(self) -> None:
        """Close this event loop's async client (``close`` closes the sync one)."""
        conn = self._aconns.pop(asyncio.get_running_loop(), None)
        if conn is not None:
            await conn.client.aclose()

    def _chunk_names(self, key: Key, manifest: dict[str, Any]) -> list[str]:
        return chunk_names(self._name(key), manifest)

    def set(self, entry: EntryWriter) -> int:
        data = memoryview(entry.to_bytes())
        px = _px(entry.expires)
        if px is None:
            return 0  # expired before it could be stored
        self._run("set", self._set_steps(entry.key, data, px), entry.key)
        return data.nbytes

    async def aset(self, entry: EntryWriter) -> int:
        """``set`` on redis.asyncio; a large entry is assembled in a worker thread."""
        if entry.in_memory and entry.planned_size() < _ASSEMBLE_ASIDE:
            data = memoryview(entry.to_bytes())
        else:
            data = memoryview(await asyncio.to_thread(entry.to_bytes))
        px = _px(entry.expires)
        if px is None:
            return 0
        await self._arun("set", self._set_steps(entry.key, data, px), entry.key)
        return data.nbytes

    def _set_steps(self, key: Key, data: memoryview, px: str) -> Steps[None]:
        name = self._name(key)
        if data.nbytes <= self.chunk_bytes:
            value = data.tobytes()
            old = yield lambda c: c.swap(keys=[name], args=[px, value, MANIFEST])
        else:
            manifest, chunks = self._chunks(key, data)
            options = {"px": int(px)} if px else {}
            yield lambda c: _pipelined(c.client, "set", chunks, **options)
            old = yield lambda c: c.swap(keys=[name], args=[px, manifest, MANIFEST])
        yield from self._drop_chunks(key, old)

    def _chunks(self, key: Key, data: memoryview) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The manifest of a chunked entry under a fresh version id, and its chunks."""
        version = secrets.token_hex(8)
        count = -(-data.nbytes // self.chunk_bytes)
        manifest = {"v": version, "n": count, "size": data.nbytes}
        chunks = [(name, data[i * self.chunk_bytes : (i + 1) * self.chunk_bytes].tobytes())
                  for i, name in enumerate(self._chunk_names(key, manifest))]
        manifest["head"], manifest["tail"] = manifest_ends(data)
        return pack_manifest(manifest), chunks

    def _drop_chunks(self, key: Key, old: bytes | None) -> Steps[None]:
        """Delete the chunks of a manifest that was just replaced or deleted."""
        manifest = read_manifest(old) if old else None
        if manifest is not None:
            names = self._chunk_names(key, manifest)
            yield lambda c: c.client.unlink(*names)  # one hash tag: one slot, one command

    def delete(self, key: Key) -> bool:
        return self._run("delete", self._delete_steps(key), key)

    def _delete_steps(self, key: Key) -> Steps[bool]:
        name = self._name(key)
        existed = yield lambda c: c.client.exists(name)
        old = yield lambda c: c.swap(keys=[name], args=["", "", MANIFEST])
        yield from self._drop_chunks(key, old)
        return bool(existed)

    def _unlink(self, client: Any, names: list[str]) -> Any:
        if not names:
            return []
        if self.cluster:  # keys of several slots: one command each, in one pipeline
            return _pipelined(client, "unlink", [(name,) for name in names])
        return client.unlink(*names)

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
                    self._unlink(self._client, batch)
                    batch = []
            self._unlink(self._client, batch)
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
                        tail = self._client.getrange(name, trailer_offset(head, size), -1)
                yield describe(head, tail, size, f"redis:{name}")
            except (BackendError, CorruptEntryError, KeyError, TypeError):
                continue

    def stats(self) -> dict[str, Any]:
        entries = list(self.entries())
        stats = {"backend": "redis", "url": self.url, "cluster": self.cluster,
                 "entries": len(entries), "bytes": sum(e.size for e in entries),
                 "breaker": self.breaker.state, "server": self._server_counters()}
        if self.cluster:
            stats["open_nodes"] = self.breaker.open_nodes()
        return stats

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
        name, token, ttl_ms = self._lock_name(key), secrets.token_hex(16), _lock_ms(timeout)
        held = take_lock(lambda: self._run("lock", self._take(name, token, ttl_ms), key),
                         timeout)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(BackendError):
                    self._run("unlock", self._give_back(name, token), key)

    @contextlib.asynccontextmanager
    async def alock(self, key: Key, timeout: float) -> AsyncIterator[Held]:
        """``lock`` on redis.asyncio: tasks wait for it without blocking the event loop."""
        name, token, ttl_ms = self._lock_name(key), secrets.token_hex(16), _lock_ms(timeout)

        async def attempt() -> bool:
            return await self._arun("lock", self._take(name, token, ttl_ms), key)

        held = await atake_lock(attempt, timeout)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(BackendError):
                    await self._arun("unlock", self._give_back(name, token), key)

    def _lock_name(self, key: Key) -> str:
        return self._name(key) + ":lock"

    @staticmethod
    def _take(name: str, token: str, ttl_ms: int) -> Steps[bool]:
        taken = yield lambda c: c.client.set(name, token, nx=True, px=ttl_ms)
        return bool(taken)

    @staticmethod
    def _give_back(name: str, token: str) -> Steps[None]:
        yield lambda c: c.release(keys=[name], args=[token])

    def close(self) -> None:
        self._client.close()


def _px(expires: float | None) -> str | None:
    """SET's PX argument for an absolute expiry: "" for none, None if already past."""
    if not expires:
        return ""
    px_ms = int((expires - time.time()) * 1000)
    return str(px_ms) if px_ms > 0 else None


def _lock_ms(timeout: float) -> int:
    return max(int(timeout * 1000), 1000)


#: Entries at least this large are assembled in a worker thread by ``aset``.
_ASSEMBLE_ASIDE = 1 << 20


def _connect(url: str, socket_timeout: float, connect_timeout: float,
             asynchronous: bool = False) -> Any:
    """A redis-py client for ``url``, or its redis.asyncio twin, retrying a command at most once
    and only after a connection error: redis-py's default retries (several, with backoff) would
    make every call on a dead server cost seconds."""
    redis = _redis()
    from redis.backoff import NoBackoff

    if asynchronous:
        import redis.asyncio
        import redis.asyncio.cluster
        from redis.asyncio.retry import Retry as AsyncRetry

        standalone, cluster = redis.asyncio.Redis, redis.asyncio.cluster
        retry: Any = AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    else:
        from redis.retry import Retry

        standalone, cluster = redis.Redis, redis.cluster
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout,
        "retry": retry,
    }
    scheme = urlsplit(url).scheme
    if scheme == "redis+cluster":
        hosts = split_hosts(url, scheme, 6379)
        nodes = [cluster.ClusterNode(host, port) for host, port in hosts.addresses]
        # The cluster client retries timeouts as well as refused connections (each costing a
        # whole timeout): no retry, a failure counts against that master's breaker instead.
        options["retry"] = type(retry)(NoBackoff(), 0)
        return cluster.RedisCluster(startup_nodes=nodes, username=hosts.username,
                                    password=hosts.password, **options)
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"not a Redis URL: {redact(url)!r}")
    return standalone.from_url(url, **options)


def _reopen(url: str, options: dict[str, Any]) -> RedisBackend:
    """The backend a pickle names, connected in this process."""
    return RedisBackend(url, **options)
