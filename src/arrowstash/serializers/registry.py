"""Serializers by name, and "auto", which picks one by the value's type and records it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from arrowstash.entry.format import Encoded
from arrowstash.errors import SerializationError
from arrowstash.serializers.arrays import ArraySerializer, is_array_tree
from arrowstash.serializers.base import Serializer
from arrowstash.serializers.pickle5 import BufferSerializer
from arrowstash.serializers.standard import StandardSerializer


def _arrow() -> Serializer:
    from arrowstash.serializers.arrow import ArrowSerializer

    return ArrowSerializer()


def _avro() -> Serializer:
    from arrowstash.serializers.avro import AvroSerializer

    return AvroSerializer()


def _is_frame(value: Any) -> bool:
    cls = type(value)
    module = cls.__module__.partition(".")[0]
    if module == "pandas":
        return isinstance(value, sys.modules["pandas"].DataFrame)
    if module == "polars":
        return cls.__name__ in ("DataFrame", "LazyFrame")
    if module == "pyarrow":
        return cls.__name__ in ("Table", "RecordBatch")
    return hasattr(value, "__arrow_c_stream__")


#: Serializers by the name recorded in entries; factories, so pyarrow loads only when used.
REGISTRY: dict[str, Callable[[], Serializer]] = {
    "standard": StandardSerializer,
    "arrow": _arrow,
    "arrays": ArraySerializer,
    "buffers": BufferSerializer,
    "avro": _avro,  # never chosen by "auto": asked for by name or instance
}

#: How "auto" chooses: the first rule whose test accepts the value names its serializer; then
#: the standard serializer, and pickle ("buffers") for what it refuses.
AUTO_RULES: list[tuple[Callable[[Any], bool], str]] = [
    (_is_frame, "arrow"),
    (is_array_tree, "arrays"),
]
AUTO_FALLBACK = "standard"
AUTO_LAST_RESORT = "buffers"


class AutoSerializer:
    """Picks a serializer per value and records its choice in the entry."""

    name = "auto"
    executes_code = False  # its members declare their own; entries name the member
    mutable_results = False

    def __init__(self, remote: bool = True) -> None:
        self._members: dict[str, Serializer] = {}
        self._remote = remote

    def for_backend(self, remote: bool) -> AutoSerializer:
        return AutoSerializer(remote)

    def member(self, name: str) -> Serializer:
        serializer = self._members.get(name)
        if serializer is None:
            try:
                factory = REGISTRY[name]
            except KeyError:
                raise SerializationError(
                    f"entry written by serializer {name!r}, which this arrowstash does not have"
                ) from None
            serializer = self._members[name] = factory().for_backend(self._remote)
        return serializer

    def choose(self, value: Any) -> Serializer:
        for accepts, name in AUTO_RULES:
            if accepts(value):
                return self.member(name)
        return self.member(AUTO_FALLBACK)

    def encode(self, value: Any) -> Encoded:
        chosen = self.choose(value)
        try:
            return chosen.encode(value)
        except SerializationError:
            if chosen.name != AUTO_FALLBACK:
                raise
            return self.member(AUTO_LAST_RESORT).encode(value)

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        raise SerializationError("AutoSerializer decodes through the serializer an entry names")


def resolve(spec: str | Serializer) -> Serializer:
    """A serializer from a name ("auto", "standard", ...) or an instance."""
    if isinstance(spec, str):
        if spec == "auto":
            return AutoSerializer()
        if spec not in REGISTRY:
            raise ValueError(
                f"unknown serializer {spec!r}; choose one of {['auto', *sorted(REGISTRY)]}"
            )
        return REGISTRY[spec]()
    if not isinstance(spec, Serializer):
        raise TypeError(f"serializer must be a name or a Serializer, not {type(spec).__qualname__}")
    return spec
