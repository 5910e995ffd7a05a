"""arrowstash: cache data-science values with as few copies as the hardware allows."""

from typing import Any

from arrowstash.backends import (
    Backend,
    FileBackend,
    MemcachedBackend,
    MemoryBackend,
    RedisBackend,
)
from arrowstash.decorator import DEFAULT, CachedFunction, CacheInfo, cache
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

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "ArrowSerializer":  # imported on first use: pyarrow is slow to import
        from arrowstash.serializers.arrow import ArrowSerializer

        return ArrowSerializer
    if name == "AvroSerializer":
        from arrowstash.serializers.avro import AvroSerializer

        return AvroSerializer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
    "RedisBackend",
    "SerializationError",
    "Serializer",
    "StandardSerializer",
    "cache",
]
