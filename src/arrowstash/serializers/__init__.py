"""Serializers, chosen by name or by the value's type ("auto")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from arrowstash.entry import Encoded
from arrowstash.errors import SerializationError
from arrowstash.serializers.base import Serializer
from arrowstash.serializers.standard import StandardSerializer

__all__ = ["AutoSerializer", "Serializer", "StandardSerializer", "resolve"]

#: Serializers by the name recorded in entries.
REGISTRY: dict[str, Callable[[], Serializer]] = {"standard": StandardSerializer}

#: How "auto" chooses: the first rule whose test accepts the value names its serializer.
AUTO_RULES: list[tuple[Callable[[Any], bool], str]] = []
AUTO_FALLBACK = "standard"


class AutoSerializer:
    """Picks a serializer per value and records its choice in the entry."""

    name = "auto"

    def __init__(self) -> None:
        self._members: dict[str, Serializer] = {}

    def member(self, name: str) -> Serializer:
        serializer = self._members.get(name)
        if serializer is None:
            try:
                factory = REGISTRY[name]
            except KeyError:
                raise SerializationError(
                    f"entry written by serializer {name!r}, which this arrowstash does not have"
                ) from None
            serializer = self._members[name] = factory()
        return serializer

    def choose(self, value: Any) -> Serializer:
        for accepts, name in AUTO_RULES:
            if accepts(value):
                return self.member(name)
        return self.member(AUTO_FALLBACK)

    def encode(self, value: Any) -> Encoded:
        return self.choose(value).encode(value)

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
