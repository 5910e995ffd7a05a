"""Cache stores. Each takes and returns whole entries in the format of :mod:`arrowstash.entry`."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from arrowstash import config
from arrowstash.backends.base import Backend, EntryInfo, Stored
from arrowstash.backends.file import FileBackend
from arrowstash.backends.memory import MemoryBackend

__all__ = ["Backend", "EntryInfo", "FileBackend", "MemoryBackend", "Stored", "from_url",
           "default_backend"]


def from_url(url: str) -> Backend:
    """Build a backend from a URL: ``file:///path``, a bare path, or ``memory://``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parts.path) if scheme else url
        if not path:
            raise ValueError(f"backend URL {url!r} names no folder (write file:///path/to/cache)")
        return FileBackend(path)
    if scheme == "memory":
        return MemoryBackend()
    raise ValueError(
        f"backend URL {url!r}: unsupported scheme {scheme!r} (supported: file://, memory://)"
    )


def default_backend() -> Backend:
    """``ARROWSTASH_URL`` if set, else a File backend in the user's cache folder."""
    url = config.default_url()
    return from_url(url) if url else FileBackend(config.default_cache_dir())
