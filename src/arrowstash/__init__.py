"""arrowstash: cache data-science values with as few copies as the hardware allows."""

from typing import TYPE_CHECKING, Any

from arrowstash.backends import Backend, FileBackend, MemoryBackend
from arrowstash.caching.decorator import DEFAULT, CachedFunction, CacheInfo, cache
from arrowstash.entry import Key
from arrowstash.errors import (
    ArrowstashError,
    AvroDecodeError,
    AvroEncodeError,
    AvroSchemaError,
    BackendError,
    CorruptEntryError,
    SerializationError,
)
from arrowstash.serializers import (
    ArraySerializer,
    BufferSerializer,
    Serializer,
    StandardSerializer,
)

if TYPE_CHECKING:
    from arrowstash.backends.memcached import MemcachedBackend
    from arrowstash.backends.object_store import ObjectStoreBackend
    from arrowstash.backends.redis import RedisBackend
    from arrowstash.serializers.arrow import ArrowSerializer
    from arrowstash.serializers.avro import AvroSerializer

__version__ = "0.1.0"

#: Names imported on first use: their modules load client libraries or pyarrow, which
#: ``import arrowstash`` should not pay for.
_LAZY = {
    "ArrowSerializer": "arrowstash.serializers.arrow",
    "AvroSerializer": "arrowstash.serializers.avro",
    "MemcachedBackend": "arrowstash.backends.memcached",
    "ObjectStoreBackend": "arrowstash.backends.object_store",
    "RedisBackend": "arrowstash.backends.redis",
}


#: Submodules reachable as attributes after a plain ``import arrowstash``, as the docs write
#: them (``arrowstash.metrics.enable()``), without loading them before they are used.
_SUBMODULES = frozenset({"metrics", "config"})


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT",
    "ArraySerializer",
    "ArrowSerializer",
    "ArrowstashError",
    "AvroDecodeError",
    "AvroEncodeError",
    "AvroSchemaError",
    "AvroSerializer",
    "Backend",
    "BackendError",
    "BufferSerializer",
    "CacheInfo",
    "CachedFunction",
    "CorruptEntryError",
    "FileBackend",
    "Key",
    "MemcachedBackend",
    "MemoryBackend",
    "ObjectStoreBackend",
    "RedisBackend",
    "SerializationError",
    "Serializer",
    "StandardSerializer",
    "cache",
]
