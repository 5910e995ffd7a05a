"""The serializer protocol: a value becomes small metadata plus a list of sections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from arrowstash.entry import Encoded


@runtime_checkable
class Serializer(Protocol):
    """A strategy that turns values into sections and back.

    ``name`` is recorded in every entry, so an entry is always decoded by the serializer that
    wrote it. ``decode`` receives views into the stored buffer (possibly a memory map): it should
    keep them rather than copy when the value can share their memory.
    """

    @property
    def name(self) -> str: ...

    def encode(self, value: Any) -> Encoded: ...

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any: ...
