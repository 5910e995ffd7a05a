"""Cache stores. Each takes and returns whole entries in the format of :mod:`arrowstash.entry`."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from arrowstash import config
from arrowstash.backends.base import Backend, EntryInfo, Stored
from arrowstash.backends.file import FileBackend
from arrowstash.backends.memcached import MemcachedBackend
from arrowstash.backends.memory import MemoryBackend
from arrowstash.backends.redis import RedisBackend

__all__ = ["Backend", "EntryInfo", "FileBackend", "MemcachedBackend", "MemoryBackend",
           "RedisBackend", "Stored", "default_backend", "from_url"]

#: URL schemes of the network backends.
_NETWORK: dict[str, Callable[..., Backend]] = {
    "redis": RedisBackend,
    "rediss": RedisBackend,
    "unix": RedisBackend,
    "redis+cluster": RedisBackend,
    "memcached": MemcachedBackend,
}


def from_url(url: str) -> Backend:
    """Build a backend from a URL: ``file:///path`` (or a bare path), ``memory://``,
    ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p,h:p``, ``memcached://h:p``.

    ``?encrypt=1`` on a file or network URL makes the backend encrypt every entry (as its
    ``encrypt=True``), so ``ARROWSTASH_URL`` alone can switch encryption on for a deployment."""
    url, encrypt = _pop_encrypt(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parts.path) if scheme else url
        if not path:
            raise ValueError(f"backend URL {url!r} names no folder (write file:///path/to/cache)")
        return FileBackend(path, encrypt=encrypt)
    if scheme == "memory":
        if encrypt:
            raise ValueError("memory:// keeps entries in this process, unencrypted: "
                             "?encrypt= applies to file and network backends only")
        return MemoryBackend()
    if scheme in _NETWORK:
        return _NETWORK[scheme](url, encrypt=encrypt)
    raise ValueError(
        f"backend URL {url!r}: unsupported scheme {scheme!r} (supported: file://, memory://, "
        f"{', '.join(s + '://' for s in _NETWORK)})"
    )


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _pop_encrypt(url: str) -> tuple[str, bool]:
    """The URL without its ``encrypt`` query parameter, and that parameter's value.

    A bare path is a path, whatever characters it holds, so only URLs with a scheme have options.
    """
    parts = urlsplit(url)
    if not parts.scheme or not parts.query:
        return url, False
    query = parse_qsl(parts.query, keep_blank_values=True)
    values = [value for name, value in query if name == "encrypt"]
    if not values:
        return url, False
    if len(values) > 1 or values[0].lower() not in _TRUE + _FALSE:
        raise ValueError(f"backend URL: encrypt={','.join(values)!r} is not one of "
                         f"{', '.join(_TRUE + _FALSE)}")
    rest = urlencode([(name, value) for name, value in query if name != "encrypt"])
    return urlunsplit(parts._replace(query=rest)), values[0].lower() in _TRUE


def default_backend() -> Backend:
    """``ARROWSTASH_URL`` if set, else a File backend in the user's cache folder."""
    url = config.default_url()
    return from_url(url) if url else FileBackend(config.default_cache_dir())
