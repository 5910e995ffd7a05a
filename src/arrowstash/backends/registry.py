"""Backends from URLs: the scheme names the class, imported only when a URL uses it."""

from __future__ import annotations

import importlib
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from arrowstash import config
from arrowstash.backends.base import Backend

#: URL scheme -> (module, class, extra to install): imported when a URL first uses the scheme,
#: so that ``import arrowstash`` loads no client library.
SCHEMES: dict[str, tuple[str, str, str]] = {
    "redis": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "rediss": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "unix": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "redis+cluster": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "memcached": ("arrowstash.backends.memcached", "MemcachedBackend", "memcached"),
    "s3": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "gs": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "az": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "objstore+memory": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "objstore+file": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
}


def backend_class(scheme: str) -> type:
    """The class serving ``scheme`` (a key of SCHEMES), imported now."""
    module, name, _extra = SCHEMES[scheme]
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def from_url(url: str) -> Backend:
    """Build a backend from a URL: ``file:///path`` (or a bare path), ``memory://``,
    ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p,h:p``, ``memcached://h:p``,
    ``s3://``, ``gs://``, ``az://``, ``objstore+memory://``, ``objstore+file://``.

    ``?encrypt=1`` on a file or network URL makes the backend encrypt every entry (as its
    ``encrypt=True``), so ``ARROWSTASH_URL`` alone can switch encryption on for a deployment."""
    url, encrypt = _pop_encrypt(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parts.path) if scheme else url
        if not path:
            raise ValueError(f"backend URL {url!r} names no folder (write file:///path/to/cache)")
        from arrowstash.backends.file import FileBackend

        return FileBackend(path, encrypt=encrypt)
    if scheme == "memory":
        from arrowstash.backends.memory import MemoryBackend

        if encrypt:
            raise ValueError("memory:// keeps entries in this process, unencrypted: "
                             "?encrypt= applies to file and network backends only")
        return MemoryBackend()
    if scheme in SCHEMES:
        backend: Backend = backend_class(scheme)(url, encrypt=encrypt)
        return backend
    raise ValueError(
        f"backend URL {url!r}: unsupported scheme {scheme!r} (supported: file://, memory://, "
        f"{', '.join(s + '://' for s in SCHEMES)})"
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
    if url:
        return from_url(url)
    from arrowstash.backends.file import FileBackend

    return FileBackend(config.default_cache_dir())
