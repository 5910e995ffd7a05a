"""The entry format, owned here alone: building, parsing, describing, signing and encrypting the
bytes every backend stores (see docs/format.md)."""

from arrowstash.entry.format import Encoded, Key

__all__ = ["Encoded", "Key"]
