"""The serializer protocol: a value becomes small metadata plus a list of sections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from arrowstash.entry.format import Encoded


@runtime_checkable
class Serializer(Protocol):
    """A strategy that turns values into sections and back.

    ``name`` is recorded in every entry, so an entry is always decoded by the serializer that
    wrote it. ``decode`` receives views into the stored buffer (possibly a memory map) and should
    keep them rather than copy when the value can share their memory. A writable buffer belongs
    to this one result (a private map or read-in copy): the value may view it and be written to;
    a read-only one may be shared, so a value that must be writable copies from it.
    """

    @property
    def name(self) -> str: ...

    #: Loading an entry runs code (unpickling): such entries are loaded only where the backend
    #: is trusted or the entry carries a valid tag.
    executes_code: bool
    #: Results view their sections and may be written to: each L1 hit needs private buffers.
    mutable_results: bool

    def for_backend(self, remote: bool) -> Serializer:
        """This serializer with its defaults chosen for a store that is ``remote`` (e.g.
        compression for bytes that cross a network); ``self`` when nothing depends on it."""

    def encode(self, value: Any) -> Encoded: ...

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any: ...
