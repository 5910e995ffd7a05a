"""Serializers: strategies that turn values into entry sections and back (see docs/serializers.md).

``ArrowSerializer`` and ``AvroSerializer`` load on first use: pyarrow is slow to import.
"""

from __future__ import annotations

from typing import Any

from arrowstash.serializers.arrays import ArraySerializer
from arrowstash.serializers.base import Serializer
from arrowstash.serializers.pickle5 import BufferSerializer
from arrowstash.serializers.registry import AutoSerializer, resolve
from arrowstash.serializers.standard import StandardSerializer

__all__ = [
    "ArraySerializer",
    "ArrowSerializer",
    "AutoSerializer",
    "AvroSerializer",
    "BufferSerializer",
    "Serializer",
    "StandardSerializer",
    "resolve",
]


def __getattr__(name: str) -> Any:
    if name == "ArrowSerializer":
        from arrowstash.serializers.arrow import ArrowSerializer

        return ArrowSerializer
    if name == "AvroSerializer":
        from arrowstash.serializers.avro import AvroSerializer

        return AvroSerializer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
