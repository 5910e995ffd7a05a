"""arrowstash: cache data-science values with as few copies as the hardware allows."""

from arrowstash.backends import Backend, FileBackend, MemoryBackend
from arrowstash.decorator import DEFAULT, CachedFunction, CacheInfo, cache
from arrowstash.entry import Key
from arrowstash.errors import (
    ArrowstashError,
    AvroDecodeError,
    BackendError,
    CorruptEntryError,
    SerializationError,
)
from arrowstash.serializers import Serializer, StandardSerializer

__version__ = "0.1.0"

__all__ = [
    "DEFAULT",
    "ArrowstashError",
    "AvroDecodeError",
    "Backend",
    "BackendError",
    "CacheInfo",
    "CachedFunction",
    "CorruptEntryError",
    "FileBackend",
    "Key",
    "MemoryBackend",
    "SerializationError",
    "Serializer",
    "StandardSerializer",
    "cache",
]
