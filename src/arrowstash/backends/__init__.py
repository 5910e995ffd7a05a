"""Cache stores. Each takes and returns whole entries in the format of :mod:`arrowstash.entry`."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from arrowstash import config
from arrowstash.backends.base import Backend, EntryInfo, Stored
from arrowstash.backends.file import FileBackend
from arrowstash.backends.memcached import MemcachedBackend
from arrowstash.backends.memory import MemoryBackend
from arrowstash.backends.redis import RedisBackend

__all__ = ["Backend", "EntryInfo", "FileBackend", "MemcachedBackend", "MemoryBackend",
           "RedisBackend", "Stored", "default_backend", "from_url"]

#: URL schemes of the network backends.
_NETWORK: dict[str, Callable[[str], Backend]] = {
    "redis": RedisBackend,
    "rediss": RedisBackend,
    "unix": RedisBackend,
    "redis+cluster": RedisBackend,
    "memcached": MemcachedBackend,
}


def from_url(url: str) -> Backend:
    """Build a backend from a URL: ``file:///path`` (or a bare path), ``memory://``,
    ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p,h:p``, ``memcached://h:p``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parts.path) if scheme else url
        if not path:
            raise ValueError(f"backend URL {url!r} names no folder (write file:///path/to/cache)")
        return FileBackend(path)
    if scheme == "memory":
        return MemoryBackend()
    if scheme in _NETWORK:
        return _NETWORK[scheme](url)
    raise ValueError(
        f"backend URL {url!r}: unsupported scheme {scheme!r} (supported: file://, memory://, "
        f"{', '.join(s + '://' for s in _NETWORK)})"
    )


def default_backend() -> Backend:
    """``ARROWSTASH_URL`` if set, else a File backend in the user's cache folder."""
    url = config.default_url()
    return from_url(url) if url else FileBackend(config.default_cache_dir())
