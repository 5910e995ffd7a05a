"""Cache stores. Each takes and returns whole entries in the format of :mod:`arrowstash.entry`.

The network backends load on first use, with their client libraries (extras ``redis``,
``memcached`` and ``s3``).
"""

from __future__ import annotations

from typing import Any

from arrowstash.backends.base import Backend, Stored
from arrowstash.backends.file import FileBackend
from arrowstash.backends.memory import MemoryBackend
from arrowstash.backends.registry import default_backend, from_url
from arrowstash.entry.listing import EntryInfo

__all__ = ["Backend", "EntryInfo", "FileBackend", "MemcachedBackend", "MemoryBackend",
           "ObjectStoreBackend", "RedisBackend", "Stored", "default_backend", "from_url"]

_LAZY = {"RedisBackend": "redis", "MemcachedBackend": "memcached", "ObjectStoreBackend": "s3"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from arrowstash.backends.registry import backend_class

        return backend_class(_LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
