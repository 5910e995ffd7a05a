"""Memcached, one server or several (rendezvous hashing), through pymemcache.

Memcached cannot list or delete by prefix, so ``clear`` bumps a generation counter of the
namespace (or of one function) that is part of every key: the old entries become unreachable and
age out. Entries above the server's item size are chunked under a fresh version id behind a small
manifest, as on Redis.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import xxhash

from arrowstash.backends._breaker import Breaker
from arrowstash.backends._chunks import chunk_names, join, pack_manifest, read_manifest
from arrowstash.backends._urls import Scrubber, split_hosts
from arrowstash.backends.base import Capabilities, Held, Stored, take_lock
from arrowstash.entry.format import EntryWriter, Key
from arrowstash.entry.listing import EntryInfo
from arrowstash.errors import BackendError

_THIRTY_DAYS = 30 * 24 * 3600  # beyond this memcached reads an expiry as a Unix time


def _expire(expires: float | None) -> int:
    """Memcached's expiry for an absolute time: seconds from now up to 30 days, else the time."""
    if not expires:
        return 0
    seconds = expires - time.time()
    if seconds > _THIRTY_DAYS:
        return int(expires)
    return max(1, int(seconds + 0.999))


class MemcachedBackend:
    """``MemcachedBackend("memcached://h1:11211,h2:11211")`` or a list of ``(host, port)``.

    ``encrypt=True`` makes every cached function using this backend encrypt its entries
    (docs/encryption.md).
    """

    #: Memcached cannot enumerate keys: no listing, and clear() hides entries behind a new
    #: generation without counting them.
    capabilities = Capabilities(shared=True, remote=True, streams_writes=False, maps_reads=False,
                                lists_entries=False, native_ttl=True, breaker=True)

    def __init__(
        self,
        servers: str | list[tuple[str, int]] = "memcached://127.0.0.1:11211",
        *,
        prefix: str = "arrowstash",
        item_bytes: int = 1 << 20,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        breaker_failures: int = 5,
        breaker_cooldown: float = 5.0,
        encrypt: bool = False,
    ) -> None:
        scrub = Scrubber(servers if isinstance(servers, str) else "")
        if isinstance(servers, str):
            servers = _parse(servers)
            self.url = "memcached://" + ",".join(f"{h}:{p}" for h, p in servers)
        else:
            self.url = "memcached://" + ",".join(f"{h}:{p}" for h, p in servers)
        if not servers:
            raise ValueError("MemcachedBackend needs at least one server")
        try:
            from pymemcache.client.base import PooledClient
            from pymemcache.client.hash import HashClient
            from pymemcache.exceptions import MemcacheError
        except ImportError as exc:
            raise ImportError(
                "MemcachedBackend needs pymemcache: pip install 'arrowstash[memcached]'"
            ) from exc
        self._errors = (MemcacheError, OSError)
        options: dict[str, Any] = {"timeout": socket_timeout, "connect_timeout": connect_timeout}
        # Pooled: one connection per concurrent caller (the worker threads of async functions,
        # background refreshes); a plain client's socket would interleave their replies.
        if len(servers) == 1:
            self._client: Any = PooledClient(servers[0], **options)
        else:
            self._client = HashClient(servers, use_pooling=True, retry_attempts=0,
                                      ignore_exc=False, **options)
        self.prefix = prefix
        # Room for the key and the item header inside memcached's default 1 MiB slab.
        self.chunk_bytes = item_bytes - 1024
        self.encrypt = encrypt
        self.breaker = Breaker(breaker_failures, breaker_cooldown, scrub)

    def __repr__(self) -> str:
        return f"MemcachedBackend({self.url!r})"

    def _call(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The boundary: client errors become BackendErrors and feed the breaker."""
        return self.breaker.guard(f"memcached {what}", self._errors)

    # memcached keys: at most 250 bytes, no spaces or control characters: hash the names
    def _generation_keys(self, key: Key) -> list[str]:
        ns = xxhash.xxh3_64_hexdigest(key.namespace.encode())
        fn = xxhash.xxh3_64_hexdigest(f"{key.namespace}\0{key.function}".encode())
        return [f"{self.prefix}:g:{ns}", f"{self.prefix}:g:{ns}:{fn}"]

    def _name(self, key: Key) -> str:
        names = self._generation_keys(key)
        found = self._client.get_many(names)
        for missing in [n for n in names if n not in found]:
            # A generation starts at a random value: if the server holding it is lost, the
            # new one cannot bring back entries that a clear() had hidden.
            self._client.add(missing, str(secrets.randbits(48)).encode(), noreply=False)
            found[missing] = self._client.get(missing) or b"0"
        gens = [int(found[n]) for n in names]
        fn = xxhash.xxh3_64_hexdigest(f"{key.namespace}\0{key.function}".encode())
        return f"{self.prefix}:e:{gens[0]}:{gens[1]}:{fn}:{key.hex}"

    def get(self, key: Key) -> Stored | None:
        with self._call("get"):
            name = self._name(key)
            value = self._client.get(name)
            if value is None:
                return None
            manifest = read_manifest(value)
            if manifest is None:
                # an entry, or garbage that parsing will report as a corrupt entry
                return Stored(memoryview(value))
            names = chunk_names(name, manifest)
            found = self._client.get_many(names)
        if len(found) != len(names):
            return None  # a chunk was evicted: the entry is gone
        data = join([found[n] for n in names], manifest["size"])
        return Stored(memoryview(data)) if data is not None else None

    def set(self, entry: EntryWriter) -> int:
        key = entry.key
        data = memoryview(entry.to_bytes())
        expire = _expire(entry.expires)
        with self._call("set"):
            name = self._name(key)
            old = self._client.get(name)
            if data.nbytes <= self.chunk_bytes:
                self._client.set(name, data.tobytes(), expire=expire, noreply=False)
            else:
                manifest = {"v": secrets.token_hex(8), "n": -(-data.nbytes // self.chunk_bytes),
                            "size": data.nbytes}
                names = chunk_names(name, manifest)
                chunks = {
                    chunk: data[i * self.chunk_bytes : (i + 1) * self.chunk_bytes].tobytes()
                    for i, chunk in enumerate(names)
                }
                failed = self._client.set_many(chunks, expire=expire, noreply=False)
                if failed:
                    raise BackendError(f"memcached refused {len(failed)} chunks of {name}")
                self._client.set(name, pack_manifest(manifest), expire=expire, noreply=False)
            self._drop_chunks(name, old)
        return data.nbytes

    def _drop_chunks(self, name: str, old: bytes | None) -> None:
        """Delete the chunks of a manifest that was just replaced or deleted (a racing writer
        may delete the same ones: deleting is idempotent)."""
        manifest = read_manifest(old) if old else None
        if manifest is not None:
            self._client.delete_many(chunk_names(name, manifest), noreply=False)

    def delete(self, key: Key) -> bool:
        with self._call("delete"):
            name = self._name(key)
            old = self._client.get(name)
            existed = bool(self._client.delete(name, noreply=False))
            self._drop_chunks(name, old)
        return existed

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        """Make a namespace's (or a function's) entries unreachable; never ``flush_all``.

        Returns 0: memcached cannot tell how many entries that hid.
        """
        if namespace is None:
            raise ValueError("MemcachedBackend.clear needs a namespace (memcached cannot list "
                             "keys, and flushing the server would delete other users' data)")
        names = self._generation_keys(Key(namespace, function or "", b""))
        name = names[1] if function is not None else names[0]
        with self._call("clear"):
            if self._client.incr(name, 1, noreply=False) is None:
                self._client.add(name, b"1", noreply=False)
        return 0

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        """Memcached cannot list its keys: nothing to show."""
        return iter(())

    def stats(self) -> dict[str, Any]:
        return {"backend": "memcached", "url": self.url, "entries": 0, "bytes": 0,
                "breaker": self.breaker.state, "server": self._server_counters()}

    def _server_counters(self) -> dict[str, int]:
        """The servers' own counters (of every client, not only ours), summed."""
        clients = getattr(self._client, "clients", None)
        with self._call("stats"):
            nodes = [c.stats() for c in clients.values()] if clients else [self._client.stats()]
        fields = {"hits": b"get_hits", "misses": b"get_misses", "evicted": b"evictions",
                  "items": b"curr_items", "memory": b"bytes"}
        return {name: sum(int(node.get(field, node.get(field.decode(), 0))) for node in nodes)
                for name, field in fields.items()}

    @contextlib.contextmanager
    def lock(self, key: Key, timeout: float) -> Iterator[Held]:
        """An ``add``-based lock that expires if its owner dies."""
        with self._call("lock"):
            name = self._name(key) + ":lock"
        token = secrets.token_hex(16).encode()
        ttl = int(timeout + 0.999) + 1  # memcached counts whole seconds: a 1 s TTL can end at once

        def attempt() -> bool:
            with self._call("lock"):
                return bool(self._client.add(name, token, expire=ttl, noreply=False))

        held = take_lock(attempt, timeout)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(BackendError), self._call("unlock"):
                    # only the owner releases; memcached has no compare-and-delete, so a lock that
                    # expired and was taken by another caller in between could be dropped early
                    if self._client.get(name) == token:
                        self._client.delete(name, noreply=False)

    def close(self) -> None:
        self._client.close()


def _parse(url: str) -> list[tuple[str, int]]:
    hosts = split_hosts(url, "memcached", 11211)
    if hosts.username is not None or hosts.password is not None:
        raise ValueError("memcached:// URLs take no user or password (the memcached text "
                         "protocol has no authentication): remove them from the URL")
    return [(address.host, address.port) for address in hosts.addresses]
